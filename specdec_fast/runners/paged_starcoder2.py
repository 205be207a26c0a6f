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
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import layer_norm_params, linear_params, rope_cos_sin
from ._linear import linear
from ._rotary import rope_tables_reason
from .paged_base import PagedRunnerBase, decoder_reason


def _projections(layer) -> tuple:
    attn = layer.self_attn
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, layer.mlp.c_fc, layer.mlp.c_proj


def starcoder2_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedStarcoder2Runner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    return (decoder_reason(model, ("starcoder2",), "model.layers", "a Starcoder2ForCausalLM", _projections)
            or rope_tables_reason(model, max_tokens_per_row, backend))


class _Starcoder2Layer:
    """One Starcoder2DecoderLayer's parameters (references to the model's tensors, not copies)."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.ln_in = layer_norm_params(layer.input_layernorm)
        self.ln_post = layer_norm_params(layer.post_attention_layernorm)
        self.fc, self.proj = linear_params(mlp.c_fc, mlp.c_proj)
        self.act = mlp.act


class PagedStarcoder2Runner(PagedRunnerBase):
    """Runner (see runners/base.py) for a Starcoder2ForCausalLM instance (weights shared); the
    arguments are PagedRunnerBase's."""

    unsupported_reason = staticmethod(starcoder2_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_Starcoder2Layer(layer) for layer in inner.layers]
        self.final_norm = layer_norm_params(inner.norm)
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
            q = rotate_half_apply(linear(h, *layer.q).view(total, heads, dim), cos, sin)
            k = rotate_half_apply(linear(h, *layer.k).view(total, kv_heads, dim), cos, sin)
            v = linear(h, *layer.v).view(total, kv_heads, dim)
            o = self._attend(i, q, k, v, attn_lens, cu, n, self.scale)
            x = x + sum_(linear(o.reshape(total, heads * dim), *layer.o))
            x = x + sum_(linear(layer.act(linear(F.layer_norm(x, width, *layer.ln_post), *layer.fc)), *layer.proj))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = F.layer_norm(x, width, *self.final_norm)
        self._keep(len(self.layers), out)
        return out
