"""TPPagedOlmo2Runner: an OLMo 2, OLMo 3, EXAONE 4.0 or FlexOlmo model (sharded_model.TP_OLMO_TYPES) sharded over the
ranks of a process group (docs/architecture.md §10).

The layout is the Llama families' (runners/sharding.py): q / k / v and gate / up by this rank's heads and
columns, o and down row-parallel, the embedding and the LM head by vocabulary rows. OLMo's q_norm / k_norm
weigh the whole projection: their weights split as the q / k rows and their mean square taken over every
rank's slice (one all-reduce of [T, 1] float32 sums per norm), then olmo_rms_norm's op order (the weight
multiplied in float32 before the cast). Each branch's output is normed before it is added, so its partials
are summed first (the all-reduce), then normed, then added on every rank. OLMo 3's RoPE per layer type
comes from ShardedCausalLM.rope_tables. EXAONE 4's q/k norms weigh each head ([D]): whole on every rank, per
head, no collective. FlexOlmo's experts are each split by their width, the router whole on every rank
(runners/sharding_moe.py). The math is PagedOlmo2Runner's over this rank's shards.
"""
import torch

from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .paged_llama import rotates
from .paged_olmo2 import LLAMA_PIECES, PagedOlmo2Runner
from .sharded_model import TP_OLMO_TYPES
from .sharding_moe import layer_mlp


def tp_olmo2_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedOlmo2Runner cannot run ``model`` (a ShardedCausalLM), or None when it can (OLMo's layers have no
    projection biases: the runner reads none)."""
    return unbiased_shard_reason(model, TP_OLMO_TYPES, "OLMo", backend)


class _TPOlmo2Layer:
    """One layer's shards (the attribute names of paged_olmo2._Olmo2Layer): q_norm / k_norm this rank's slice of
    the whole-projection weights (EXAONE 4's per-head ones: whole)."""

    def __init__(self, shards: dict, prefix: str, config, index: int, first_rank: bool, kernels: str):
        def get(name):
            return shards.get(prefix + name)

        eps = config.rms_norm_eps
        self.q, self.k, self.v, self.o = ((get(f"self_attn.{p}_proj.weight"), None) for p in "qkvo")
        self.q_norm, self.k_norm = (get("self_attn.q_norm.weight"), eps), (get("self_attn.k_norm.weight"), eps)
        self.post_attention = (get("post_attention_layernorm.weight"), eps)
        self.post_feedforward = (get("post_feedforward_layernorm.weight"), eps)
        # FlexOlmo's experts (each split by its width, the router whole), or the dense MLP's columns / rows
        self.moe, mlp, self.act = layer_mlp(shards, prefix, first_rank, config, kernels)
        self.gate, self.up, self.down = mlp or (None, None, None)
        self.rope = rotates(config, index)  # EXAONE 4's full layers: NoPE


class TPPagedOlmo2Runner(TensorParallelRunner, PagedOlmo2Runner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of OLMo 2 / 3: PagedOlmo2Runner's interface and
    sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_olmo2_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards = model.config, model.shards
        self._bind_shard(model)
        self.llama_pieces = config.model_type in LLAMA_PIECES  # EXAONE 4's per-head q/k norms: whole on every rank
        self.layers = [_TPOlmo2Layer(shards, f"model.layers.{i}.", config, i, self.first_rank, self.kernels)
                       for i in range(config.num_hidden_layers)]
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.rope_tables = {key: (inv_freq.to(device=self.device), scaling)
                            for key, (inv_freq, scaling, _) in model.rope_tables.items()}
        self.rope_keys = model.rope_keys

    def _qk_norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        """olmo_rms_norm over the whole projection of which x [T, w] is this rank's slice (weight: its slice):
        the mean square over every rank's slice, one all-reduce of [T, 1] float32 sums."""
        weight, eps = norm
        x32 = x.float()
        total = self.tp.all_reduce_(x32.pow(2).sum(-1, keepdim=True))
        return (weight * (x32 * torch.rsqrt(total / (self.plan.world * x.shape[-1]) + eps))).to(x.dtype)
