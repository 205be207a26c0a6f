"""TPPagedGemma4Runner: Gemma 4's text decoder (sharded_model.TP_GEMMA4_TYPES; the multimodal checkpoints as their
text decoder) sharded over the ranks of a process group (docs/architecture.md §10).

The Llama families' layout (runners/sharding.py), each layer by its own widths (sharding.layer_dims_of: the full
layers' heads global_head_dim wide, num_global_key_value_heads of them, a KV-sharing layer's double-wide MLP): q
and k / v by this rank's heads (a KV head on as many ranks as share it), o_proj's and down's columns, gate / up's
rows; every norm whole (the q / k norms weigh one head). Each branch's partials are summed before its norm (the
all-reduce, `_sum_partials`), as Gemma 2 / 3's. The per-layer inputs (E2B / E4B: their embedding, projection and each
layer's gate / projection) are whole on every rank: the residual stream they read is. A KV-sharing layer reads this
rank's heads of its writer's cache. The embedding and the tied LM head by vocabulary rows. The math is
PagedGemma4Runner's over this rank's shards; the agreement, the vocabulary-parallel lookup and the gathered logits
are TensorParallelRunner's. Not sharded: the MoE block (refused by name).
"""
import torch

from ._rotary import static_rope_reason
from .paged_base import head_dim_reason
from .paged_gemma4 import PagedGemma4Runner, bidirectional_reason
from .paged_llama_tp import TensorParallelRunner, shard_reason
from .sharded_model import TP_GEMMA4_TYPES


def tp_gemma4_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedGemma4Runner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    reason = shard_reason(model, TP_GEMMA4_TYPES)
    if reason is not None:
        return reason
    config = model.config
    reason = bidirectional_reason(config)
    if reason is not None:
        return reason
    if getattr(config, "enable_moe_block", False):
        return "Gemma 4's MoE block under tensor parallelism (its experts are not split yet: one process runs it)"
    for _, _, rope_type in model.rope_tables.values():
        reason = static_rope_reason(rope_type)
        if reason is not None:
            return reason
    for head_dim, _, _ in model.plan.layer_dims:
        reason = head_dim_reason(head_dim, backend)
        if reason is not None:
            return reason
    return None


class _TPLayer:
    """One layer's shards (the attribute names of paged_gemma4._Layer)."""

    def __init__(self, shards: dict, index: int, config, plan):
        from transformers.activations import ACT2FN

        prefix = f"model.layers.{index}."

        def get(name):
            return shards.get(prefix + name)

        eps = config.rms_norm_eps
        self.kind, self.shared = config.layer_types[index], config.kv_sharing_modes[index] == "reuse"
        self.head_dim, kv_heads, _ = plan.layer_dims[index]
        self.q, self.o = (get("self_attn.q_proj.weight"), None), (get("self_attn.o_proj.weight"), None)
        self.q_norm = (get("self_attn.q_norm.weight"), eps)
        if not self.shared:
            self.k = (get("self_attn.k_proj.weight"), None)
            v = get("self_attn.v_proj.weight")
            self.v = None if v is None else (v, None)  # None: the value is the key (attention_k_eq_v)
            self.k_norm, self.v_norm = (get("self_attn.k_norm.weight"), eps), (None, eps)
            self.kv_heads = self.k[0].shape[0] // self.head_dim  # this rank's
        self.input, self.post_attention = (get("input_layernorm.weight"), eps), (get("post_attention_layernorm.weight"), eps)
        self.pre_feedforward = (get("pre_feedforward_layernorm.weight"), eps)
        self.post_feedforward = (get("post_feedforward_layernorm.weight"), eps)
        self.gate, self.up, self.down = ((get(f"mlp.{p}_proj.weight"), None) for p in ("gate", "up", "down"))
        self.act = ACT2FN[config.hidden_activation]
        self.moe = None
        self.ple = None
        if getattr(config, "hidden_size_per_layer_input", 0):
            self.ple = ((get("per_layer_input_gate.weight"), None), (get("per_layer_projection.weight"), None),
                        (get("post_per_layer_input_norm.weight"), eps), self.act)
        self.scalar = get("layer_scalar")


class TPPagedGemma4Runner(TensorParallelRunner, PagedGemma4Runner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Gemma 4: PagedGemma4Runner's interface and sizes;
    logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_gemma4_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        self.config = config
        self.layers = [_TPLayer(shards, i, config, plan) for i in range(config.num_hidden_layers)]
        self._bind_kv_layers(config)
        self.num_heads = plan.local_heads
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        # Gemma4TextScaledWordEmbedding's buffer: sqrt(H) in float32 (cast to the embedding's dtype when applied)
        self.embed_scale = torch.tensor(config.hidden_size ** 0.5, dtype=torch.float32, device=self.device)
        self.ple = None
        width = getattr(config, "hidden_size_per_layer_input", 0)  # (the unified decoder has no per-layer inputs)
        if width:
            self.ple = dict(embed=shards["model.embed_tokens_per_layer.weight"],
                            embed_scale=torch.tensor(width ** 0.5, dtype=torch.float32, device=self.device),
                            projection=(shards["model.per_layer_model_projection.weight"], None),
                            projection_scale=config.hidden_size ** -0.5,
                            norm=(shards["model.per_layer_projection_norm.weight"], config.rms_norm_eps),
                            input_scale=2.0 ** -0.5, width=width)
        self.rope_tables = {key: (inv_freq.to(device=self.device), scaling)
                            for key, (inv_freq, scaling, _) in model.rope_tables.items()}
        self.rope_keys = model.rope_keys

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        """The vocabulary-parallel lookup (summed over the ranks), times sqrt(H) as the single process does."""
        return TensorParallelRunner._embed(self, flat) * self.embed_scale.to(self.embed.dtype)
