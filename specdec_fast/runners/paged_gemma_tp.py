"""TPPagedGemmaRunner: a Gemma 1, 2 or 3 model (sharded_model.TP_GEMMA_TYPES: Gemma 2B / 7B, CodeGemma,
Gemma 2 2B / 9B / 27B, Gemma 3 270M-27B: the text decoder of the 4B / 12B / 27B multimodal checkpoints)
sharded over the ranks of a process group (docs/architecture.md §10).

The layout is the Llama families' (runners/sharding.py): q / k / v and gate / up by this rank's heads
and columns, o and down row-parallel, the embedding and the tied LM head by vocabulary rows, every norm
whole. Gemma 2 normalises each branch's output before adding it (post_attention / post_feedforward
norms), so each branch's partials are summed first (the all-reduce), then normed, then added on every
rank; the embedding's sqrt(H) scales the summed lookup; the final logit soft-cap is elementwise, on
each rank's slice before the gather. Gemma 3's per-head q/k norms ([D]) are whole on every rank (a head
lies on one rank), its RoPE per layer type comes from ShardedCausalLM's rope_tables, its sliding layers'
windows from the text config. The math is PagedGemmaRunner's over this rank's shards; the agreement, the
vocabulary-parallel lookup and the gathered logits are TensorParallelRunner's.
"""
import torch

from .paged_gemma import ATTN_SOFTCAP_TYPES, PagedGemmaRunner
from .paged_llama import llama_config_reason
from .paged_llama_tp import TensorParallelRunner, shard_reason
from .sharded_model import TP_GEMMA_TYPES


def tp_gemma_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedGemmaRunner cannot run ``model`` (a ShardedCausalLM), or None when it can: shard_reason, then
    the Llama runner's config checks on each of its RoPE tables (Gemma 3's: one per layer type)."""
    reason = shard_reason(model, TP_GEMMA_TYPES)
    if reason is not None:
        return reason
    if getattr(model.config, "use_bidirectional_attention", False):
        return "use_bidirectional_attention (EmbeddingGemma) is not a causal decoder"
    for inv_freq, _, rope_type in model.rope_tables.values():
        reason = llama_config_reason(model.config, rope_type, max_tokens_per_row, backend,
                                     rotary_dims=2 * inv_freq.numel())
        if reason is not None:
            return reason
    return None


class _TPGemmaLayer:
    """One layer's shards (the attribute names of paged_gemma._GemmaLayer); o and down carry their bias on
    rank 0 only (none in Gemma's checkpoints)."""

    def __init__(self, shards: dict, prefix: str, config, first_rank: bool):
        from transformers.activations import ACT2FN

        def get(name):
            return shards.get(prefix + name)

        eps = config.rms_norm_eps
        self.q, self.k, self.v = ((get(f"self_attn.{p}_proj.weight"), get(f"self_attn.{p}_proj.bias")) for p in "qkv")
        self.o = (get("self_attn.o_proj.weight"), get("self_attn.o_proj.bias") if first_rank else None)
        q_norm, k_norm = get("self_attn.q_norm.weight"), get("self_attn.k_norm.weight")  # Gemma 3's, per head: whole
        self.q_norm, self.k_norm = (None, None) if q_norm is None else ((q_norm, eps), (k_norm, eps))
        self.input = (get("input_layernorm.weight"), eps)
        if get("pre_feedforward_layernorm.weight") is not None:  # Gemma 2: each branch's output normed (VaultGemma: not)
            self.post_attention, self.post_feedforward = (
                None if get(f"{name}.weight") is None else (get(f"{name}.weight"), eps)
                for name in ("post_attention_layernorm", "post_feedforward_layernorm"))
            self.pre_feedforward = (get("pre_feedforward_layernorm.weight"), eps)
        else:  # Gemma 1: post_attention_layernorm is the MLP's input norm
            self.post_attention = self.post_feedforward = None
            self.pre_feedforward = (get("post_attention_layernorm.weight"), eps)
        self.gate = (get("mlp.gate_proj.weight"), get("mlp.gate_proj.bias"))
        self.up = (get("mlp.up_proj.weight"), get("mlp.up_proj.bias"))
        self.down = (get("mlp.down_proj.weight"), get("mlp.down_proj.bias") if first_rank else None)
        # the activation each family's MLP reads: Gemma 2's / 3's hidden_activation, Gemma 1's hidden_act
        self.act = ACT2FN[config.hidden_act if config.model_type == "gemma" else config.hidden_activation]


class TPPagedGemmaRunner(TensorParallelRunner, PagedGemmaRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Gemma 1 / 2 / 3: PagedGemmaRunner's interface
    and sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_gemma_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards = model.config, model.shards
        self._bind_shard(model)
        self.layers = [_TPGemmaLayer(shards, f"model.layers.{i}.", config, self.first_rank)
                       for i in range(config.num_hidden_layers)]
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.scale = (getattr(config, "query_pre_attn_scalar", None) or self.head_dim) ** -0.5
        self.attn_softcap = config.attn_logit_softcapping if config.model_type in ATTN_SOFTCAP_TYPES else None
        # GemmaTextScaledWordEmbedding's buffer: sqrt(H) in float32 (cast to the embedding's dtype when applied)
        self.embed_scale = torch.tensor(config.hidden_size ** 0.5, dtype=torch.float32, device=self.device)
        self.rope_tables = {key: (inv_freq.to(device=self.device), scaling)
                            for key, (inv_freq, scaling, _) in model.rope_tables.items()}
        self.rope_keys = model.rope_keys

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        """The vocabulary-parallel lookup (summed over the ranks), times sqrt(H) as the single process does."""
        return TensorParallelRunner._embed(self, flat) * self.embed_scale.to(self.embed.dtype)
