"""PagedOlmoHybridRunner: AllenAI's OLMo Hybrid (model_type olmo_hybrid: Olmo-Hybrid-7B) -- Gated DeltaNet layers
(linear attention with a recurrent state) with an OLMo 3 attention layer every few -- on the paged KV cache, with
speculative decoding's rollback of the recurrent states (runners/paged_recurrent.py).

The math is transformers 5.24's OlmoHybridLinearAttentionDecoderLayer / OlmoHybridAttentionDecoderLayer
(modeling_olmo_hybrid.py), eval mode; every RMSNorm OLMo's (the weight multiplied in float32):
    linear_attention   x = x + delta_net(input_layernorm x);  x = x + mlp(post_attention_layernorm x)
        delta_net: Qwen3.5's Gated DeltaNet (runners/paged_qwen3_next.py: its convolution, delta rule, prefill
        chunks, score-call block and snapshots) with q / k / v projected apart, its gate from g_proj, beta =
        2 sigmoid(b) where linear_allow_neg_eigval, o_norm (RMSNormGated) and o_proj
    full_attention     OLMo 3's layer: q / k normed over the whole projection, RoPE where the config has a
        rope_theta (float32 tables, as OLMo's), no input norm, each branch's output normed before its add:
        x = x + post_attention_layernorm(o_proj attention(...));  x = x + post_feedforward_layernorm(mlp x)
    logits = lm_head(norm(x))
Token trees: each node from its parent's states (runners/paged_recurrent.py). Tensor parallelism: paged_olmo_hybrid_tp.py. Not
timed on a GPU.
"""
import torch

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import linear_params, norm_params, rope_cos_sin
from ._linear import linear
from ._rotary import static_rope_reason
from .paged_base import decoder_reason, head_dim_reason
from .paged_olmo2 import olmo_rms_norm
from .paged_qwen3_next import LAYER_KINDS, PagedQwen3NextRunner, _DeltaNet
from .paged_recurrent import layer_kinds_reason

OLMO_HYBRID_TYPES = ("olmo_hybrid",)


def _projections(layer) -> tuple:
    """A layer's projection modules (for plain_projections_reason)."""
    mlp = (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
    if hasattr(layer, "linear_attn"):
        m = layer.linear_attn
        return (m.q_proj, m.k_proj, m.v_proj, m.g_proj, m.b_proj, m.a_proj, m.o_proj) + mlp
    attn = layer.self_attn
    return (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj) + mlp


def olmo_hybrid_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedOlmoHybridRunner cannot run ``model``, or None when it can."""
    config = getattr(model, "config", None)
    reason = layer_kinds_reason(config, LAYER_KINDS) or decoder_reason(model, OLMO_HYBRID_TYPES, "model.layers",
                                                                       "an OlmoHybridForCausalLM", _projections)
    if reason is not None:
        return reason
    for i, layer in enumerate(model.model.layers):
        if hasattr(layer, "linear_attn") and layer.linear_attn.activation != "silu":
            return f"layer {i}: a Gated DeltaNet convolution with activation {layer.linear_attn.activation!r}"
    rotary = model.model.rotary_emb
    reason = None if rotary is None else static_rope_reason(getattr(rotary, "rope_type", None))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return reason or head_dim_reason(head_dim, backend)


def _delta_net(mixer) -> _DeltaNet:
    """OLMo Hybrid's Gated DeltaNet as the Qwen3-Next runner's (its tensors, references): projections q, k, v, g
    (the gated norm's gate), b, a apart; no convolution bias; beta doubled where allow_neg_eigval."""
    projections = linear_params(mixer.q_proj, mixer.k_proj, mixer.v_proj, mixer.g_proj, mixer.b_proj, mixer.a_proj)
    (out,) = linear_params(mixer.o_proj)
    return _DeltaNet(projections, False, mixer.conv1d.weight[:, 0], mixer.conv1d.bias, mixer.A_log, mixer.dt_bias,
                     norm_params(mixer.o_norm), out, mixer.num_k_heads, mixer.num_v_heads, mixer.head_k_dim,
                     mixer.head_v_dim, beta_scale=2.0 if mixer.allow_neg_eigval else 1.0)


class _Layer:
    """One layer's kind and tensors (references): a Gated DeltaNet layer's mixer and two pre-norms, or an attention
    layer's projections, whole-projection q / k norms and two post-branch norms; the SwiGLU MLP."""

    def __init__(self, layer, kind: str):
        self.kind = kind
        if kind == "linear_attention":
            self.mixer = _delta_net(layer.linear_attn)
            self.ln_in, self.ln_post = norm_params(layer.input_layernorm), norm_params(layer.post_attention_layernorm)
        else:
            attn = layer.self_attn
            self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
            self.q_norm, self.k_norm = norm_params(attn.q_norm), norm_params(attn.k_norm)
            self.post_attention = norm_params(layer.post_attention_layernorm)
            self.post_feedforward = norm_params(layer.post_feedforward_layernorm)
        mlp = layer.mlp
        (self.gate, self.up, self.down), self.act = linear_params(mlp.gate_proj, mlp.up_proj, mlp.down_proj), mlp.act_fn


class PagedOlmoHybridRunner(PagedQwen3NextRunner):
    """Runner (see runners/base.py) for an OlmoHybridForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. Token trees: each node from its parent's states."""

    unsupported_reason = staticmethod(olmo_hybrid_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer, kind) for layer, kind in zip(inner.layers, config.layer_types)]
        self._index_layers()
        self.final_norm = norm_params(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self._bind_heads(config)
        rotary = inner.rotary_emb  # None: every attention layer NoPE (a config without rope_theta)
        self.inv_freq = None if rotary is None else rotary.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = None if rotary is None else float(rotary.attention_scaling)

    def _mlp(self, layer, h: torch.Tensor) -> torch.Tensor:
        """The SwiGLU MLP of h [T, H] -> [T, H] (every rank's partial summed under tensor parallelism)."""
        return self._sum_partials(linear(layer.act(linear(h, *layer.gate)) * linear(h, *layer.up), *layer.down))

    def _qk_norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        """The q / k norm over the whole projection (olmo_rms_norm; under tensor parallelism its mean square over
        every rank's slice: paged_olmo_hybrid_tp.py)."""
        return olmo_rms_norm(x, norm)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        rope = None if self.inv_freq is None else rope_cos_sin(positions, self.inv_freq, self.rope_scaling, torch.float32)
        rows = self._row_layout(cu, total, n)
        x = self._embed(flat)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            if layer.kind == "linear_attention":
                x = x + self._sum_partials(self._delta_net(layer.mixer, self.states[self._recurrent_index[i]],
                                                           olmo_rms_norm(x, layer.ln_in), rows))
                x = x + self._mlp(layer, olmo_rms_norm(x, layer.ln_post))
            else:
                q = self._qk_norm(linear(x, *layer.q), layer.q_norm).view(total, heads, dim)
                k = self._qk_norm(linear(x, *layer.k), layer.k_norm).view(total, kv_heads, dim)
                v = linear(x, *layer.v).view(total, kv_heads, dim)
                if rope is not None:  # float32 tables: rotated in float32, then the model dtype (OLMo's)
                    q, k = rotate_half_apply(q, *rope).to(q.dtype), rotate_half_apply(k, *rope).to(k.dtype)
                o = self._attend(self._attention_index[i], q, k, v, attn_lens, cu, n, self.scale)
                x = x + olmo_rms_norm(self._sum_partials(linear(o.reshape(total, -1), *layer.o)), layer.post_attention)
                x = x + olmo_rms_norm(self._mlp(layer, x), layer.post_feedforward)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = olmo_rms_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out
