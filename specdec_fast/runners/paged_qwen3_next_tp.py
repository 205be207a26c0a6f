"""TPPagedQwen3NextRunner: Qwen3-Next and Qwen3.5's text decoders (sharded_model.TP_HYBRID_TYPES) sharded
over the ranks of a process group (docs/architecture.md §10).

The layout (runners/sharding.py): a gated attention layer by heads (each head's [q | gate] rows of q_proj,
k / v by KV heads, o_proj's columns); a Gated DeltaNet layer by heads too -- this rank's key heads of
[q | k | v] (projection rows and convolution channels), its value heads of v / z / b / a, A_log and
dt_bias, out_proj's columns -- so each rank runs the delta rule of its own heads and keeps their
recurrent states and snapshots (nothing of it crosses ranks); the MLP's columns or every expert's
width (runners/sharding_moe.py, the router and the shared expert's gate whole); the embedding and the
LM head by vocabulary rows. Per layer two all-reduces of T x H values (the mixer's partial, the MLP's);
the residual stream, replicated, is added after each. The math is PagedQwen3NextRunner's over this
rank's heads; the agreement, the vocabulary-parallel embedding and the gathered logits are
TensorParallelRunner's.
"""
from ._rotary import static_rope_reason
from .paged_base import head_dim_reason
from .paged_llama_tp import TensorParallelRunner, shard_reason
from .paged_qwen3_next import LAYER_KINDS, PagedQwen3NextRunner, _Attention, _DeltaNet
from .paged_recurrent import layer_kinds_reason
from .sharded_model import TP_HYBRID_TYPES
from .sharding_moe import layer_mlp


def tp_qwen3_next_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedQwen3NextRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    reason = shard_reason(model, TP_HYBRID_TYPES)
    if reason is not None:
        return reason
    config = model.config
    return layer_kinds_reason(config, LAYER_KINDS) or static_rope_reason(model.rope_type) or head_dim_reason(config.head_dim, backend)


class _TPLayer:
    """One layer's shards (the attribute names of paged_qwen3_next._Layer); o_proj / out_proj / down carry
    no bias in these models."""

    def __init__(self, shards: dict, prefix: str, kind: str, config, plan, first_rank: bool, kernels: str):
        def get(name):
            return shards.get(prefix + name)

        def pair(name):
            return get(name + ".weight"), get(name + ".bias")

        eps = config.rms_norm_eps
        self.kind = kind
        self.ln_in, self.ln_post = (get("input_layernorm.weight"), eps), (get("post_attention_layernorm.weight"), eps)
        if kind == "linear_attention":
            nk, nv, dk, dv = plan.delta
            grouped = get("linear_attn.in_proj_qkvz.weight") is not None
            names = ("in_proj_qkvz", "in_proj_ba") if grouped else ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
            projections = tuple(pair("linear_attn." + name) for name in names)
            self.mixer = _DeltaNet(projections, grouped, get("linear_attn.conv1d.weight")[:, 0],
                                   get("linear_attn.conv1d.bias"), get("linear_attn.A_log"), get("linear_attn.dt_bias"),
                                   (get("linear_attn.norm.weight"), eps), pair("linear_attn.out_proj"),
                                   nk // plan.world, nv // plan.world, dk, dv)
        else:
            self.mixer = _Attention(*(pair(f"self_attn.{p}_proj") for p in "qkvo"),
                                    (get("self_attn.q_norm.weight"), eps), (get("self_attn.k_norm.weight"), eps))
        self.moe, mlp, self.act = layer_mlp(shards, prefix, first_rank, config, kernels)
        self.gate, self.up, self.down = mlp or (None, None, None)


class TPPagedQwen3NextRunner(TensorParallelRunner, PagedQwen3NextRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Qwen3-Next / Qwen3.5: PagedQwen3NextRunner's
    interface and sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_qwen3_next_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        self.layers = [_TPLayer(shards, f"model.layers.{i}.", kind, config, plan, self.first_rank, self.kernels)
                       for i, kind in enumerate(config.layer_types[:config.num_hidden_layers])]
        self._index_layers()
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.inv_freq = model.inv_freq.to(device=self.device)
        self.rope_scaling = model.rope_scaling
