"""TPPagedOlmoHybridRunner: OLMo Hybrid (sharded_model.TP_OLMO_HYBRID_TYPES) sharded over the ranks of a process
group (docs/architecture.md §10).

The layout (runners/sharding.py): a Gated DeltaNet layer by heads, as Qwen3.5's -- this rank's key heads of q / k
(their projections' rows and convolution channels), its value heads of v / g / b / a, A_log and dt_bias, o_proj's
columns -- so each rank runs the delta rule of its own heads and keeps their recurrent states and snapshots; an
attention layer as OLMo 3's (q / k / v by heads, their whole-projection norms split as their rows with the mean
square taken over every rank's slice, o_proj's columns); the MLPs' columns; the embedding and the LM head by
vocabulary rows. Every branch's partials are summed by one all-reduce before its norm (the attention layer's
post-norms) or its add. The math is PagedOlmoHybridRunner's over this rank's heads; the agreement, the
vocabulary-parallel embedding and the gathered logits are TensorParallelRunner's.
"""
from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .paged_olmo2_tp import TPPagedOlmo2Runner, _TPOlmo2Layer
from .paged_olmo_hybrid import PagedOlmoHybridRunner
from .paged_qwen3_next import LAYER_KINDS, _DeltaNet
from .paged_recurrent import layer_kinds_reason
from .sharded_model import TP_OLMO_HYBRID_TYPES


def tp_olmo_hybrid_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedOlmoHybridRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    return (layer_kinds_reason(model.config, LAYER_KINDS)
            or unbiased_shard_reason(model, TP_OLMO_HYBRID_TYPES, "OLMo Hybrid", backend))


class _TPDeltaNetLayer:
    """A Gated DeltaNet layer's shards (the attribute names of paged_olmo_hybrid._Layer's)."""

    def __init__(self, shards: dict, prefix: str, config, plan):
        from transformers.activations import ACT2FN

        def get(name):
            return shards.get(prefix + name)

        eps = config.rms_norm_eps
        self.kind = "linear_attention"
        nk, nv, dk, dv = plan.delta
        projections = tuple((get(f"linear_attn.{p}_proj.weight"), None) for p in ("q", "k", "v", "g", "b", "a"))
        self.mixer = _DeltaNet(projections, False, get("linear_attn.conv1d.weight")[:, 0],
                               get("linear_attn.conv1d.bias"), get("linear_attn.A_log"), get("linear_attn.dt_bias"),
                               (get("linear_attn.o_norm.weight"), 1e-5), (get("linear_attn.o_proj.weight"), None),
                               nk // plan.world, nv // plan.world, dk, dv,
                               beta_scale=2.0 if config.linear_allow_neg_eigval else 1.0)
        self.ln_in, self.ln_post = (get("input_layernorm.weight"), eps), (get("post_attention_layernorm.weight"), eps)
        self.gate, self.up, self.down = ((get(f"mlp.{p}_proj.weight"), None) for p in ("gate", "up", "down"))
        self.act = ACT2FN[config.hidden_act]


def _tp_layer(shards: dict, index: int, kind: str, config, plan, first_rank: bool, kernels: str):
    """Layer ``index``'s shards: a Gated DeltaNet layer's (_TPDeltaNetLayer), or an attention layer's as OLMo 3's
    (paged_olmo2_tp._TPOlmo2Layer: the same tensors and post-branch norms), its kind set."""
    prefix = f"model.layers.{index}."
    if kind == "linear_attention":
        return _TPDeltaNetLayer(shards, prefix, config, plan)
    layer = _TPOlmo2Layer(shards, prefix, config, index, first_rank, kernels)
    layer.kind = kind
    return layer


class TPPagedOlmoHybridRunner(TensorParallelRunner, PagedOlmoHybridRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of OLMo Hybrid: PagedOlmoHybridRunner's interface and
    sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_olmo_hybrid_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        self.layers = [_tp_layer(shards, i, kind, config, plan, self.first_rank, self.kernels)
                       for i, kind in enumerate(config.layer_types[:config.num_hidden_layers])]
        self._index_layers()
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.inv_freq = None if model.inv_freq is None else model.inv_freq.to(device=self.device)  # None: NoPE
        self.rope_scaling = model.rope_scaling

    # OLMo's whole-projection q / k norm over this rank's slice: the mean square over every rank's (one all-reduce)
    _qk_norm = TPPagedOlmo2Runner._qk_norm
