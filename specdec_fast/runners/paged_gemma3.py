"""PagedGemma3Runner: Gemma 3's text decoder (model_type gemma3_text: Gemma3ForCausalLM, the 270M and
1B checkpoints) run layer by layer over a PagedKVCache with the project's append_kv /
paged_attention kernels (the machinery is shared: runners/paged_base.py).

Weights are the model's own parameters (no copy): embed_tokens, per layer input_layernorm,
self_attn.{q,k,v,o}_proj, self_attn.q_norm / k_norm, post_attention_layernorm,
pre_feedforward_layernorm, post_feedforward_layernorm, mlp.{gate,up,down}_proj, then model.norm
and lm_head (tied). The math is transformers 5.24's Gemma3DecoderLayer (modeling_gemma3.py),
eval mode:
    x = embed(ids) * sqrt(H)                      the scale rounded to the model dtype first
    h = input_layernorm(x); q, k, v = projections of h
    q, k = q_norm(q), k_norm(k) per head; RoPE with the layer type's table (cos / sin in the
    model dtype): sliding_attention layers a local base, full_attention ones the global (and
    its scaling)
    x = x + post_attention_layernorm(o_proj(attention(q, k, v)))   scale query_pre_attn_scalar^-0.5
    x = x + post_feedforward_layernorm(down(act(gate(h2)) * up(h2))), h2 = pre_feedforward_layernorm(x)
    logits = lm_head(norm(x)), soft-capped by final_logit_softcapping when it is set
and Gemma's RMSNorm is x_normed * (1 + weight) in float32, then the dtype (gemma_rms_norm).
Sliding layers slide only past their window (512 tokens for the 270M / 1B): rows that reach it run
on the hf runner (runners/sliding_window.py: the one rule). Refused: attention logit
soft-capping (Gemma 2's: the kernels do not cap scores) and bidirectional attention
(EmbeddingGemma). One path on every backend, as the OLMo and GPT-2 runners: the attention and KV
append through the kernels, the rest torch ops. No tensor-parallel runner.
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._linear import linear
from ._rotary import device_rope_tables, rope_tables_reason, rotations
from .paged_base import PagedRunnerBase, decoder_reason
from .paged_llama import projection_modules


def gemma_rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Gemma3RMSNorm over the last dim of x: x_normed * (1 + weight) in float32, then x's dtype.
    norm: (weight, eps)."""
    weight, eps = norm
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype)


def _norm_of(module):
    return module.weight, module.eps


def gemma3_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedGemma3Runner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    reason = decoder_reason(model, ("gemma3_text",), "model.layers", "a Gemma3ForCausalLM", projection_modules)
    if reason is not None:
        return reason
    if getattr(model.config, "attn_logit_softcapping", None) is not None:
        return "attn_logit_softcapping is set (the paged kernels do not cap attention scores)"
    if getattr(model.config, "use_bidirectional_attention", False):
        return "use_bidirectional_attention (EmbeddingGemma) is not a causal decoder"
    return rope_tables_reason(model, max_tokens_per_row, backend)


class _Gemma3Layer:
    """One Gemma3DecoderLayer's parameters (references to the model's tensors, not copies)."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = ((m.weight, m.bias) for m in (attn.q_proj, attn.k_proj, attn.v_proj,
                                                                       attn.o_proj))
        self.q_norm, self.k_norm = _norm_of(attn.q_norm), _norm_of(attn.k_norm)
        self.input, self.post_attention = _norm_of(layer.input_layernorm), _norm_of(layer.post_attention_layernorm)
        self.pre_feedforward = _norm_of(layer.pre_feedforward_layernorm)
        self.post_feedforward = _norm_of(layer.post_feedforward_layernorm)
        self.gate, self.up, self.down = ((m.weight, m.bias) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        self.act = mlp.act_fn


class PagedGemma3Runner(PagedRunnerBase):
    """Runner (see runners/base.py) for a Gemma3ForCausalLM instance (weights shared); the
    arguments are PagedRunnerBase's."""

    unsupported_reason = staticmethod(gemma3_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.embed_scale = inner.embed_tokens.embed_scale  # a 0-d float32 buffer: sqrt(H)
        self.layers = [_Gemma3Layer(layer) for layer in inner.layers]
        self.final_norm = _norm_of(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self.softcap = config.final_logit_softcapping
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.query_pre_attn_scalar**-0.5  # Gemma3Attention's scaling
        self.rope_tables, self.rope_keys = device_rope_tables(model, self.device)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        # [T, D] cos / sin of each layer type's RoPE in the model dtype, once per call
        tables = rotations(self.rope_tables, positions, self.dtype)
        x = F.embedding(flat.clamp(min=0), self.embed) * self.embed_scale.to(self.embed.dtype)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            cos, sin = tables[self.rope_keys[i]]
            h = gemma_rms_norm(x, layer.input)
            q = gemma_rms_norm(linear(h, *layer.q).view(total, heads, dim), layer.q_norm)
            k = gemma_rms_norm(linear(h, *layer.k).view(total, kv_heads, dim), layer.k_norm)
            v = linear(h, *layer.v).view(total, kv_heads, dim)
            q, k = rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)
            o = self._attend(i, q, k, v, attn_lens, cu, n, self.scale)
            x = x + gemma_rms_norm(linear(o.reshape(total, heads * dim), *layer.o), layer.post_attention)
            h = gemma_rms_norm(x, layer.pre_feedforward)
            act = layer.act(linear(h, *layer.gate)) * linear(h, *layer.up)
            x = x + gemma_rms_norm(linear(act, *layer.down), layer.post_feedforward)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = gemma_rms_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The lm_head product, soft-capped as Gemma3ForCausalLM does when final_logit_softcapping is set."""
        logits = super()._logits(hidden)
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap
