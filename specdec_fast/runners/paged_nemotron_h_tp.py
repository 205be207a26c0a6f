"""TPPagedNemotronHRunner: Nemotron-H (sharded_model.TP_NEMOTRON_H_TYPES: Nemotron-H 8B / 47B / 56B, Nemotron Nano 9B /
12B v2, Nemotron 3 Nano 30B-A3B) sharded over the ranks of a process group (docs/architecture.md §10).

The layout (runners/sharding.py): a Mamba2 layer by heads -- this rank's heads' rows of in_proj's z, x and dt, the
B and C rows of its groups (G / N groups of its own, or, with fewer groups than ranks, the one group its heads belong
to, read by the N / G ranks that share it), the convolution's [x | B | C] rows likewise, dt_bias / A_log / D and the
gated norm's weights by heads, out_proj's columns -- so each rank scans its own heads and keeps their states and
windows (runners/mamba2_tp.py, with the gated norm over a shared group's channels). Attention (no positions) as the Llama
layout's, the relu² MLPs' up rows and down columns; Nemotron 3's MoE blocks with every ungated expert and the shared
MLP split by their width, the router and the latent projections whole (runners/sharding_moe.py); the embedding and the
LM head by vocabulary rows. Each block's partials are summed by one all-reduce. The math is PagedNemotronHRunner's over
this rank's shards.
"""
from .mamba2_tp import tp_mamba2
from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .paged_nemotron_h import BLOCK_KINDS, PagedNemotronHRunner
from .paged_recurrent import layer_kinds_reason
from .sharded_model import TP_NEMOTRON_H_TYPES
from .sharding_moe import layer_moe


def tp_nemotron_h_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedNemotronHRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    config = getattr(model, "config", None)
    reason = layer_kinds_reason(config, BLOCK_KINDS, "layers_block_type") or unbiased_shard_reason(
        model, TP_NEMOTRON_H_TYPES, "Nemotron-H", backend)
    if reason is not None:
        return reason
    if getattr(config, "mamba_hidden_act", "silu") != "silu":
        return f"a Mamba2 convolution with activation {config.mamba_hidden_act!r}"
    if getattr(config, "sliding_window", None):
        return f"sliding_window {config.sliding_window}: Nemotron-H's attention layers here are full"
    return None


class _TPBlock:
    """One block's shards (the attribute names of paged_nemotron_h._Block's)."""

    def __init__(self, shards: dict, index: int, config, tp, plan, first_rank: bool, kernels: str):
        from transformers.activations import ACT2FN

        prefix = f"model.layers.{index}."

        def get(name):
            return shards.get(prefix + name)

        self.kind = config.layers_block_type[index]
        self.norm = (get("input_layernorm.weight"), config.layer_norm_epsilon)
        if self.kind == "linear_attention":
            self.mixer = tp_mamba2(get, config, tp, plan, config.layer_norm_epsilon)
        elif self.kind == "full_attention":
            self.q, self.k, self.v, self.o = ((get(f"self_attn.{p}_proj.weight"), None) for p in "qkvo")
        elif self.kind == "moe":  # every expert and the shared MLP by their width, the router and latents whole
            self.moe = layer_moe(shards, prefix, first_rank, config, kernels)
        else:
            self.up, self.down = (get("mlp.up_proj.weight"), None), (get("mlp.down_proj.weight"), None)
            self.act = ACT2FN[config.mlp_hidden_act]


class TPPagedNemotronHRunner(TensorParallelRunner, PagedNemotronHRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Nemotron-H: PagedNemotronHRunner's interface and
    sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_nemotron_h_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        self.layers = [_TPBlock(shards, i, config, self.tp, plan, self.first_rank, self.kernels)
                       for i in range(config.num_hidden_layers)]
        self._index_layers()
        self.final_norm = (shards["model.norm.weight"], config.layer_norm_epsilon)
        self.lm_head = shards["lm_head.weight"]
