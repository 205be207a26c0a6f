"""TPPagedMiniMaxRunner: MiniMax-Text-01 / MiniMax-M1 (sharded_model.TP_MINIMAX_TYPES) sharded over the ranks of a
process group (docs/architecture.md §10).

The layout (runners/sharding.py): a lightning layer by heads -- this rank's heads' [q | k | v] rows of qkv_proj, their
rows of output_gate and weights of the output norm, their columns of out_proj -- so each rank runs the linear
attention of its own heads and keeps their states and snapshots; the output norm's mean square is taken over every
rank's heads (one all-reduce of [T, 1] sums: TensorParallelRunner._projection_norm); the slopes are the heads' own
(lightning.slope_rates, as transformers computes them, cast through the model dtype as its buffer is). The attention
layers as the Llama layout's (q / k / v by heads, o_proj's columns), every expert by its width with the router whole
(runners/sharding_moe.py), the embedding and the LM head by vocabulary rows. Each branch's partials are summed by
one all-reduce before its residual factor. The math is PagedMiniMaxRunner's over this rank's shards.
"""
import torch

from ._moe import MoE
from .lightning import NORM_EPS, Lightning, slope_rates
from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .paged_minimax import LAYER_KINDS, PagedMiniMaxRunner
from .paged_recurrent import layer_kinds_reason
from .sharded_model import TP_MINIMAX_TYPES
from .sharding_moe import layer_moe


def tp_minimax_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedMiniMaxRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    config = getattr(model, "config", None)
    if getattr(config, "sliding_window", None) is not None:
        return f"sliding_window {config.sliding_window} on the attention layers (this runner's are full)"
    return layer_kinds_reason(config, LAYER_KINDS) or unbiased_shard_reason(model, TP_MINIMAX_TYPES, "MiniMax", backend)


class _TPLayer:
    """One layer's shards (the attribute names of paged_minimax._Layer's)."""

    def __init__(self, shards: dict, index: int, config, plan, first_rank: bool, kernels: str, dtype):
        from transformers.activations import ACT2FN

        prefix = f"model.layers.{index}."

        def get(name):
            return shards.get(prefix + name)

        self.kind = config.layer_types[index]
        eps = config.rms_norm_eps
        if self.kind == "linear_attention":
            heads = plan.local_heads
            slope = slope_rates(config.num_attention_heads, index, config.num_hidden_layers)
            slope = slope[plan.rank * heads:(plan.rank + 1) * heads].to(dtype).float()  # the buffer's cast
            slope = slope.to(get("self_attn.qkv_proj.weight").device)  # beside the weights (a CUDA rank's, not the CPU)
            self.mixer = Lightning(*((get(f"self_attn.{p}.weight"), None) for p in ("qkv_proj", "output_gate",
                                                                                      "out_proj")),
                                   (get("self_attn.norm.weight"), NORM_EPS), ACT2FN[config.hidden_act], heads,
                                   plan.head_dim, slope)
            self.attn_alpha, self.attn_beta = config.linear_attn_alpha_factor, config.linear_attn_beta_factor
        else:
            self.q, self.k, self.v, self.o = ((get(f"self_attn.{p}_proj.weight"), None) for p in "qkvo")
            self.attn_alpha, self.attn_beta = config.full_attn_alpha_factor, config.full_attn_beta_factor
        self.attn_alpha, self.attn_beta = float(self.attn_alpha), float(self.attn_beta)
        self.mlp_alpha, self.mlp_beta = float(config.mlp_alpha_factor), float(config.mlp_beta_factor)
        self.input_norm, self.post_norm = (get("input_layernorm.weight"), eps), (get("post_attention_layernorm.weight"),
                                                                                 eps)
        self.moe: MoE = layer_moe(shards, prefix, first_rank, config, kernels)


class TPPagedMiniMaxRunner(TensorParallelRunner, PagedMiniMaxRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of MiniMax: PagedMiniMaxRunner's interface and sizes;
    logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_minimax_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        dtype = shards["model.norm.weight"].dtype
        self.layers = [_TPLayer(shards, i, config, plan, self.first_rank, self.kernels, dtype)
                       for i in range(config.num_hidden_layers)]
        self._index_layers()
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.inv_freq = model.inv_freq.to(device=self.device)
        self.rope_scaling = model.rope_scaling

    def _lightning_norm(self, o: torch.Tensor, norm: tuple) -> torch.Tensor:
        """The output norm over every rank's heads: this rank's o [T, Hl D] and weights, the mean square of all."""
        return self._projection_norm(o, *norm)
