"""PagedGatedAttentionRunner: the mixture-of-experts decoders whose attention output passes a learned gate
before o_proj -- Arcee's AFMoE (model_type afmoe: Trinity Nano / Mini / Large) and poolside's Laguna (laguna:
Laguna XS.2) -- on the paged KV cache (the machinery: runners/paged_base.py).

The math is transformers 5.24's AfmoeDecoderLayer / LagunaDecoderLayer (modeling_afmoe.py, modeling_laguna.py),
eval mode:
    x = embed(ids)                AFMoE with mup_enabled: times sqrt(hidden_size)
    h = input_layernorm(x)
    q, k = q_norm(q_proj h), k_norm(k_proj h), per head;  v = v_proj h
    RoPE   AFMoE: its sliding layers only (its full layers are NoPE), one table; Laguna: every layer, a table a
           layer type (its full layers rotate the first dims of each head: partial_rotary_factor)
    o = attention(q, k, v)        [T, Hq * D], head_dim^-0.5, sliding layers within their window (the kernels)
    o = o * sigmoid(gate_proj h)  AFMoE: per element, in the model dtype
    o = o * softplus(g_proj h)    Laguna: in float32, then the model dtype; one gate a head (gating True or
                                  "per-head", broadcast over head_dim) or one an element ("per-element")
    AFMoE   x = x + post_attention_layernorm(o_proj o);  x = x + post_mlp_layernorm(mlp(pre_mlp_layernorm x))
    Laguna  x = x + o_proj o;                            x = x + mlp(post_attention_layernorm x)
    mlp     a SwiGLU MLP (AFMoE's first num_dense_layers, Laguna's mlp_layer_types "dense"), or the MoE block:
            sigmoid top-k routing with a correction bias and shared experts (runners/_moe.py, SIGMOID_TOPK_VARIANTS)
    logits = lm_head(norm(x))
AFMoE's RMSNorm multiplies its weight in float32 (OLMo's), Laguna's after the cast to the model dtype (Llama's).
Laguna's layers may differ in query heads (num_attention_heads_per_layer) over the same KV heads.

The attention and the KV append run through the kernels; the rest as torch ops (as the OLMo / Gemma runners),
the experts through kernels/moe where the backend fuses them. Tensor parallelism for AFMoE:
paged_gated_attention_tp.py. Not timed on a GPU.
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import linear_params, norm_params
from ._linear import linear
from ._moe import is_moe, moe_or_gated_mlp, layers_moe_reason
from ._rotary import device_rope_tables, rope_tables_reason, rotations
from .paged_base import PagedRunnerBase, decoder_reason
from .paged_olmo2 import llama_rms_norm, olmo_rms_norm

GATED_ATTENTION_TYPES = ("afmoe", "laguna")
LAGUNA_GATINGS = (True, "per-head", "per-element")  # LagunaConfig.gating's values


def _gate_module(attn):
    """The attention's gate projection: AFMoE's gate_proj, Laguna's g_proj."""
    return getattr(attn, "gate_proj", None) or getattr(attn, "g_proj", None)


def _projections(layer) -> tuple:
    """A layer's projection modules (for plain_projections_reason): attention, its gate, the dense MLP or the
    MoE block's shared experts (its routed experts are 3-D tensors, its router checked by moe_reason)."""
    attn, mlp = layer.self_attn, layer.mlp
    dense = mlp.shared_experts if is_moe(mlp) else mlp
    return (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, _gate_module(attn),
            dense.gate_proj, dense.up_proj, dense.down_proj)


def gated_attention_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedGatedAttentionRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    reason = decoder_reason(model, GATED_ATTENTION_TYPES, "model.layers", "an AfmoeForCausalLM or LagunaForCausalLM",
                            _projections)
    if reason is not None:
        return reason
    config = model.config
    if config.model_type == "laguna" and getattr(config, "gating", True) not in LAGUNA_GATINGS:
        return f"Laguna's gating {config.gating!r} is not one of {LAGUNA_GATINGS}"
    return layers_moe_reason([layer.mlp for layer in model.model.layers], config) or rope_tables_reason(model, max_tokens_per_row, backend)


class _Layer:
    """One decoder layer's parameters (references to the model's tensors, not copies)."""

    def __init__(self, layer, config, kernels: str):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.gate = _gate_module(attn).weight
        self.heads = attn.q_proj.weight.shape[0] // attn.head_dim  # Laguna: this layer's query heads
        self.q_norm, self.k_norm = norm_params(attn.q_norm), norm_params(attn.k_norm)
        self.input = norm_params(layer.input_layernorm)
        if config.model_type == "afmoe":  # four norms: each branch's output normed, the MLP's input its own
            self.rope = config.layer_types[attn.layer_idx] == "sliding_attention"  # AfmoeAttention.is_local_attention
            self.post_attention = norm_params(layer.post_attention_layernorm)
            self.pre_mlp, self.post_mlp = norm_params(layer.pre_mlp_layernorm), norm_params(layer.post_mlp_layernorm)
        else:  # Laguna: Llama's two (post_attention_layernorm is the MLP's input norm)
            self.rope, self.post_attention, self.post_mlp = True, None, None
            self.pre_mlp = norm_params(layer.post_attention_layernorm)
        self.moe, self.mlp, self.act = moe_or_gated_mlp(mlp, config, kernels)


class PagedGatedAttentionRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for an AfmoeForCausalLM or LagunaForCausalLM instance (weights shared); the
    arguments are PagedRunnerBase's."""

    unsupported_reason = staticmethod(gated_attention_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.afmoe = config.model_type == "afmoe"
        self.embed = inner.embed_tokens.weight
        # AfmoeModel: hidden_states * hidden_size**0.5 (a Python float) where mup_enabled
        self.embed_scale = config.hidden_size**0.5 if self.afmoe and config.mup_enabled else None
        self.layers = [_Layer(layer, config, self.kernels) for layer in inner.layers]
        self.final_norm = norm_params(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self._bind_heads(config)
        # Laguna: one gate a head (True / "per-head") or one an element ("per-element")
        self.gate_per_head = not self.afmoe and config.gating in (True, "per-head")
        self.rope_tables, self.rope_keys = device_rope_tables(model, self.device)

    def _norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        """The family's RMSNorm: AFMoE's (the weight multiplied in float32), Laguna's (Llama's)."""
        return olmo_rms_norm(x, norm) if self.afmoe else llama_rms_norm(x, norm)

    def _gated(self, o: torch.Tensor, h: torch.Tensor, layer) -> torch.Tensor:
        """The attention output o [T, Hq, D] through the layer's gate of h [T, H] -> [T, Hq * D]."""
        total = o.shape[0]
        logits = F.linear(h, layer.gate)
        if self.afmoe:  # AfmoeAttention: output * sigmoid(gate_states), per element in the model dtype
            return o.reshape(total, -1) * torch.sigmoid(logits)
        gate = F.softplus(logits.float()).to(o.dtype)  # LagunaAttention
        if self.gate_per_head:
            return (o * gate.unsqueeze(-1)).reshape(total, -1)
        return o.reshape(total, -1) * gate

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, kv_heads, dim = flat.shape[0], self.num_kv_heads, self.head_dim
        tables = rotations(self.rope_tables, positions, self.dtype)  # [T, R] cos / sin a RoPE table, in the model dtype
        x = self._embed(flat)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.input)
            q = self._norm(linear(h, *layer.q).view(total, layer.heads, dim), layer.q_norm)
            k = self._norm(linear(h, *layer.k).view(total, kv_heads, dim), layer.k_norm)
            v = linear(h, *layer.v).view(total, kv_heads, dim)
            if layer.rope:
                cos, sin = tables[self.rope_keys[i]]
                q, k = rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)
            o = self._attend(i, q, k, v, attn_lens, cu, n, self.scale)
            out = self._sum_partials(linear(self._gated(o, h, layer), *layer.o))
            x = x + (out if layer.post_attention is None else self._norm(out, layer.post_attention))
            h = self._norm(x, layer.pre_mlp)
            if layer.moe is not None:
                out = layer.moe(h, self._prefilling)
            else:
                (gate, up, down), act = layer.mlp, layer.act
                out = linear(act(linear(h, *gate)) * linear(h, *up), *down)
            out = self._sum_partials(out)
            x = x + (out if layer.post_mlp is None else self._norm(out, layer.post_mlp))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = self._norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out
