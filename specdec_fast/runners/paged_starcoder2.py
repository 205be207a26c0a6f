"""PagedStarcoder2Runner: a StarCoder2 decoder (model_type starcoder2) run layer by layer over a
PagedKVCache with the project's append_kv / paged_attention kernels (the machinery is shared:
runners/paged_base.py).

Weights are the model's own parameters (no copy): embed_tokens, per layer input_layernorm,
self_attn.{q,k,v,o}_proj (+ biases: use_bias), post_attention_layernorm, mlp.c_fc / mlp.c_proj,
then model.norm and lm_head. The math is transformers 5.24's Starcoder2DecoderLayer
(modeling_starcoder2.py), eval mode (its dropouts off):
    h = input_layernorm(x)                        LayerNorm with bias (not an RMSNorm)
    q, k = RoPE(q_proj(h), k_proj(h)), v = v_proj(h); x = x + o_proj(attention(q, k, v))
    x = x + c_proj(act(c_fc(post_attention_layernorm(x))))   a plain (ungated) MLP
    out = norm(x)
with Mistral's attention (its scale head_dim^-0.5, RoPE tables in the model dtype) and its
sliding window, which the kernels apply (runners/sliding_window.py: every layer). One path on
every backend, as the GPT-2 runner: the attention and KV append through the kernels, the rest
torch ops. Tensor parallelism: paged_starcoder2_tp.py (the two hooks below: the embedding and the
sum of a row-parallel product's partials).

The same pre-LayerNorm layer serves two more families (2026-12-01; not under TP):
    nemotron   Nemotron-4 / Minitron: LayerNorm1P (F.layer_norm with weight + 1, in the weight's dtype), an
               ungated MLP down(act(up h)) (relu^2), biases where the config sets them, a partial RoPE
    stablelm   StableLM 2 / StableCode: a gated SwiGLU MLP, optional per-head q / k LayerNorms (qk_layernorm:
               one weight [D] a head, no bias, before RoPE), optional parallel residual (use_parallel_residual:
               x + attn(ln(x)) + mlp(ln(x)), no post-attention norm), a partial RoPE (25% by default)
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import layer_norm_params, linear_params, rope_cos_sin
from ._linear import linear
from ._rotary import rope_tables_reason
from .paged_base import PagedRunnerBase, decoder_reason


STARCODER2_TYPES = ("starcoder2", "nemotron", "stablelm")


def _mlp(mlp) -> tuple:
    """(gate or None, in, out) modules of a layer's MLP and its activation module."""
    if hasattr(mlp, "c_fc"):
        return (None, mlp.c_fc, mlp.c_proj), mlp.act
    return (getattr(mlp, "gate_proj", None), mlp.up_proj, mlp.down_proj), mlp.act_fn


def _projections(layer) -> tuple:
    attn = layer.self_attn
    return (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj) + tuple(m for m in _mlp(layer.mlp)[0] if m is not None)


def starcoder2_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedStarcoder2Runner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    return (decoder_reason(model, STARCODER2_TYPES, "model.layers", "a Starcoder2ForCausalLM", _projections)
            or rope_tables_reason(model, max_tokens_per_row, backend))


def _layer_norm(module) -> tuple:
    """(weight, bias, eps) for F.layer_norm: an nn.LayerNorm's, or Nemotron's LayerNorm1P's with its weight + 1 (made
    once, in the weight's dtype, as its forward makes it at every call)."""
    weight, bias, eps = layer_norm_params(module)
    if type(module).__name__ == "NemotronLayerNorm1P":
        weight = (weight + 1.0).detach()
    return weight, bias, eps


def _head_norms(module):
    """StableLM's per-head LayerNorms (qk_layernorm: an nn.LayerNorm of one head's D dims each, no bias) -> (their
    weights stacked [H, D], eps), or None."""
    if module is None:
        return None
    return torch.stack([norm.weight.detach() for norm in module.norms]), module.norms[0].eps


def head_layer_norm(x: torch.Tensor, norms) -> torch.Tensor:
    """x [T, H, D] through one LayerNorm a head (norms: ([H, D] weights, eps)), as F.layer_norm computes each (float32
    inside, the weight applied there, one rounding to x's dtype)."""
    weight, eps = norms
    return (F.layer_norm(x.float(), x.shape[-1:], None, None, eps) * weight.float()).to(x.dtype)


class _Starcoder2Layer:
    """One decoder layer's parameters (references to the model's tensors, not copies; Nemotron's norm weights + 1
    and StableLM's stacked head norms are small copies). ln_post None: StableLM's parallel residual; gate None: an
    ungated MLP; q_norm / k_norm None: no per-head norms."""

    def __init__(self, layer):
        attn = layer.self_attn
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.ln_in = _layer_norm(layer.input_layernorm)
        post = getattr(layer, "post_attention_layernorm", None)
        self.ln_post = None if post is None else _layer_norm(post)
        (gate, fc, proj), self.act = _mlp(layer.mlp)
        self.gate = None if gate is None else linear_params(gate)[0]
        self.fc, self.proj = linear_params(fc, proj)
        self.q_norm = _head_norms(getattr(attn, "q_layernorm", None))
        self.k_norm = _head_norms(getattr(attn, "k_layernorm", None))


class PagedStarcoder2Runner(PagedRunnerBase):
    """Runner (see runners/base.py) for a Starcoder2ForCausalLM (NemotronForCausalLM, StableLmForCausalLM) instance
    (weights shared); the arguments are PagedRunnerBase's."""

    unsupported_reason = staticmethod(starcoder2_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_Starcoder2Layer(layer) for layer in inner.layers]
        self.final_norm = _layer_norm(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self.hidden = config.hidden_size
        self._bind_heads(config)
        self.inv_freq = inner.rotary_emb.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(inner.rotary_emb.attention_scaling)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        width = (self.hidden,)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype)  # [T, D], once per call
        x = self._embed(flat)
        sum_ = self._sum_partials
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = F.layer_norm(x, width, *layer.ln_in)
            q, k = linear(h, *layer.q).view(total, heads, dim), linear(h, *layer.k).view(total, kv_heads, dim)
            if layer.q_norm is not None:  # StableLM's per-head LayerNorms, before RoPE
                q, k = head_layer_norm(q, layer.q_norm), head_layer_norm(k, layer.k_norm)
            q, k = rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)
            v = linear(h, *layer.v).view(total, kv_heads, dim)
            o = self._attend(i, q, k, v, attn_lens, cu, n, self.scale)
            attended = x + sum_(linear(o.reshape(total, heads * dim), *layer.o))
            # the MLP reads the same norm's output (StableLM's parallel residual) or the post-attention norm's
            x = attended + sum_(self._mlp(layer, h if layer.ln_post is None else F.layer_norm(attended, width,
                                                                                              *layer.ln_post)))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = F.layer_norm(x, width, *self.final_norm)
        self._keep(len(self.layers), out)
        return out

    def _mlp(self, layer, h: torch.Tensor) -> torch.Tensor:
        """The layer's MLP of h [T, H]: plain or ungated proj(act(fc h)), or gated proj(act(gate h) * fc h)."""
        inner = linear(h, *layer.fc)
        inner = layer.act(inner) if layer.gate is None else layer.act(linear(h, *layer.gate)) * inner
        return linear(inner, *layer.proj)
