"""TPPagedGatedAttentionRunner: an AFMoE (Arcee Trinity) or Laguna model (sharded_model.TP_GATED_TYPES) sharded
over the ranks of a process group (docs/architecture.md §10).

The layout is the Llama families' (runners/sharding.py): q / k / v and gate / up by this rank's heads and columns,
o and down row-parallel, the embedding and the LM head by vocabulary rows. The attention's output gate is split by
the query heads (AFMoE's gate_proj and Laguna's per-element g_proj a row per query channel, as q; Laguna's per-head
g_proj a row per head), so each rank gates its own heads' output; the per-head q/k norms ([D]) are whole on every
rank. Laguna's layers are split by their own query heads (sharding.layer_heads_of), over the same KV heads. The MoE
blocks split every expert and the shared experts by their width, the router and its correction bias whole
(runners/sharding_moe.py, which renames AFMoE's router.gate and expert_bias as the MoE reads them). AFMoE norms each
branch's output before adding it, so each branch's partials are summed first (the all-reduce), then normed, then
added on every rank; mup's sqrt(H) scales the summed lookup. The math is PagedGatedAttentionRunner's over this
rank's shards.
"""
from .paged_gated_attention import LAGUNA_GATINGS, PagedGatedAttentionRunner
from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .sharded_model import TP_GATED_TYPES
from .sharding_moe import layer_mlp


def tp_gated_attention_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedGatedAttentionRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    config = model.config
    if getattr(config, "model_type", None) == "laguna" and getattr(config, "gating", True) not in LAGUNA_GATINGS:
        return f"Laguna's gating {config.gating!r} is not one of {LAGUNA_GATINGS}"
    return unbiased_shard_reason(model, TP_GATED_TYPES, config.model_type, backend)


class _TPLayer:
    """One layer's shards (the attribute names of paged_gated_attention._Layer): its query heads this rank's (from
    q's rows; Laguna's differ by layer)."""

    def __init__(self, shards: dict, prefix: str, config, index: int, first_rank: bool, kernels: str, head_dim: int):
        def get(name):
            return shards.get(prefix + name)

        eps = config.rms_norm_eps
        self.q, self.k, self.v, self.o = ((get(f"self_attn.{p}_proj.weight"), None) for p in "qkvo")
        self.heads = self.q[0].shape[0] // head_dim
        self.q_norm, self.k_norm = (get("self_attn.q_norm.weight"), eps), (get("self_attn.k_norm.weight"), eps)
        self.input = (get("input_layernorm.weight"), eps)
        if config.model_type == "afmoe":
            self.gate = get("self_attn.gate_proj.weight")
            self.rope = config.layer_types[index] == "sliding_attention"  # AFMoE's full layers: NoPE
            self.post_attention = (get("post_attention_layernorm.weight"), eps)
            self.pre_mlp, self.post_mlp = (get("pre_mlp_layernorm.weight"), eps), (get("post_mlp_layernorm.weight"), eps)
        else:  # Laguna: Llama's two norms, every layer rotated
            self.gate, self.rope, self.post_attention, self.post_mlp = get("self_attn.g_proj.weight"), True, None, None
            self.pre_mlp = (get("post_attention_layernorm.weight"), eps)
        self.moe, self.mlp, self.act = layer_mlp(shards, prefix, first_rank, config, kernels)


class TPPagedGatedAttentionRunner(TensorParallelRunner, PagedGatedAttentionRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of AFMoE or Laguna: PagedGatedAttentionRunner's
    interface and sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_gated_attention_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards = model.config, model.shards
        self._bind_shard(model)
        self.afmoe = config.model_type == "afmoe"
        self.gate_per_head = not self.afmoe and config.gating in (True, "per-head")
        self.embed_scale = config.hidden_size**0.5 if self.afmoe and config.mup_enabled else None
        self.layers = [_TPLayer(shards, f"model.layers.{i}.", config, i, self.first_rank, self.kernels, self.head_dim)
                       for i in range(config.num_hidden_layers)]
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.rope_tables = {key: (inv_freq.to(device=self.device), scaling)
                            for key, (inv_freq, scaling, _) in model.rope_tables.items()}
        self.rope_keys = model.rope_keys
