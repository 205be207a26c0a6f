"""TPPagedGraniteHybridRunner: Granite 4.0's hybrids (granitemoehybrid with Mamba2 layers or experts: Granite 4.0-H
Micro / Tiny / Small) and Bamba (sharded_model.TP_GRANITE_HYBRID_TYPES) sharded over the ranks of a process group
(docs/architecture.md §10).

The layout (runners/sharding.py): the Mamba2 layers by heads (runners/mamba2_tp.py: each rank its heads' states and
windows, B / C of its groups or of the one group it shares, whose gated norm sums over those ranks); the attention
layers by heads as the Llama layout's (RoPE where the config asks); Granite's shared MLP (its fused input_linear read as
Phi-3's gate_up_proj: this rank's rows of gate and of up) and Bamba's MLP by their width; Granite's experts by their
width with the router whole (runners/sharding_moe.py; the published block_sparse_moe names read as Granite 3 MoE's),
their partial summed with the dense MLP's; the embedding and the LM head by vocabulary rows. Each branch's partials are
summed by one all-reduce before Granite's residual multiplier. The math is PagedGraniteHybridRunner's over this rank's
shards.
"""
from .mamba2_tp import tp_mamba2
from .paged_granite_hybrid import LAYER_KINDS, PagedGraniteHybridRunner
from .paged_llama_tp import TensorParallelRunner, _split_fused, unbiased_shard_reason
from .paged_recurrent import layer_kinds_reason
from .sharded_model import TP_GRANITE_HYBRID_TYPES
from .sharding_moe import layer_moe


def tp_granite_hybrid_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedGraniteHybridRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    config = getattr(model, "config", None)
    reason = layer_kinds_reason(config, LAYER_KINDS) or unbiased_shard_reason(
        model, TP_GRANITE_HYBRID_TYPES, "Granite 4.0-H / Bamba", backend)
    if reason is not None:
        return reason
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r}: the Mamba2 convolution here takes silu"
    return None


class _TPLayer:
    """One layer's shards (the attribute names of paged_granite_hybrid._Layer's)."""

    def __init__(self, shards: dict, index: int, config, tp, plan, first_rank: bool, kernels: str):
        from transformers.activations import ACT2FN

        prefix = f"model.layers.{index}."

        def get(name):
            return shards.get(prefix + name)

        self.kind = config.layer_types[index]
        eps = config.rms_norm_eps
        post = get("post_attention_layernorm.weight")  # Granite's; Bamba's pre_ff_layernorm
        self.ln_in, self.ln_post = (get("input_layernorm.weight"), eps), (
            post if post is not None else get("pre_ff_layernorm.weight"), eps)
        if self.kind == "linear_attention":
            self.mixer = tp_mamba2(get, config, tp, plan, eps)
        else:
            self.q, self.k, self.v, self.o = ((get(f"self_attn.{p}_proj.weight"), None) for p in "qkvo")
        _split_fused(shards, prefix, plan.local_heads * plan.head_dim)  # Granite's input_linear: [gate | up] rows
        self.gate, self.up, self.down = ((get(f"mlp.{p}_proj.weight"), None) for p in ("gate", "up", "down"))
        self.act = ACT2FN[config.hidden_act]
        # the experts (Granite 4.0-H Tiny / Small) by their width, the router whole; the dense MLP above beside them
        self.moe = layer_moe(shards, prefix, first_rank, config, kernels)


class TPPagedGraniteHybridRunner(TensorParallelRunner, PagedGraniteHybridRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Granite 4.0-H (no experts) or Bamba:
    PagedGraniteHybridRunner's interface and sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_granite_hybrid_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        self.layers = [_TPLayer(shards, i, config, self.tp, plan, self.first_rank, self.kernels)
                       for i in range(config.num_hidden_layers)]
        self._index_layers()
        final = shards.get("model.norm.weight")  # Granite's; Bamba's final_layernorm
        self.final_norm = (final if final is not None else shards["model.final_layernorm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.scale = float(getattr(config, "attention_multiplier", self.scale))  # Bamba: head_dim^-0.5
        self.embedding_multiplier = getattr(config, "embedding_multiplier", 1.0)
        self.residual_multiplier = getattr(config, "residual_multiplier", 1.0)
        self.logits_scaling = getattr(config, "logits_scaling", 1.0)
        rotates = config.model_type == "bamba" or getattr(config, "position_embedding_type", None) == "rope"
        self.rope = (model.inv_freq, model.rope_scaling) if rotates else None
