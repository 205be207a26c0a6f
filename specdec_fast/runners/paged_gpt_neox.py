"""PagedGPTNeoXRunner: a GPT-NeoX decoder (model_type gpt_neox: Pythia, GPT-NeoX-20B, RedPajama-INCITE,
Dolly v2, ...) run layer by layer over a PagedKVCache with the project's append_kv /
paged_attention kernels (the machinery is shared: runners/paged_base.py). Pythia's suite (70M to
12B on one tokenizer) is speculative decoding's classic test bed.

Weights are the model's own parameters (no copy): gpt_neox.embed_in, per layer input_layernorm,
attention.query_key_value / attention.dense (+ biases), post_attention_layernorm,
mlp.dense_h_to_4h / mlp.dense_4h_to_h, then final_layer_norm and lm_head. The math is
transformers 5.24's GPTNeoXLayer (modeling_gpt_neox.py), eval mode (its dropouts off):
    q, k, v = query_key_value(input_layernorm(x)) viewed [T, H, 3 D]: each head's q | k | v
    RoPE on the first rotary_ndims of each head (partial_rotary_factor, Pythia's 0.25), the
    rest passed through; tables in the model dtype; scale head_size^-0.5
    parallel residual (use_parallel_residual, Pythia's):  x = (mlp(post_attention_layernorm(x)) + attn) + x
    else:  x = x + attn;  x = mlp(post_attention_layernorm(x)) + x
    mlp = dense_4h_to_h(act(dense_h_to_4h(.)));  out = final_layer_norm(x)
One path on every backend, as the GPT-2 runner: the attention and KV append through the
kernels, the rest torch ops. Static RoPE types only; no tensor-parallel runner.
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import layer_norm_params, linear_params, rope_cos_sin
from ._linear import linear
from .paged_base import PagedRunnerBase, decoder_reason
from .paged_llama import llama_config_reason


def _projections(layer) -> tuple:
    return layer.attention.query_key_value, layer.attention.dense, layer.mlp.dense_h_to_4h, layer.mlp.dense_4h_to_h


def gpt_neox_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedGPTNeoXRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    reason = decoder_reason(model, ("gpt_neox",), "gpt_neox.layers", "a GPTNeoXForCausalLM", _projections)
    if reason is not None:
        return reason
    config, rotary = model.config, getattr(model.gpt_neox, "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        return "the model has no rotary_emb with inv_freq"
    # the partial rotation is this runner's own (rotary_dims not checked against the head)
    return llama_config_reason(config, getattr(rotary, "rope_type", None), max_tokens_per_row, backend)


class _NeoXLayer:
    """One GPTNeoXLayer's parameters (references to the model's tensors, not copies)."""

    def __init__(self, layer):
        attn, mlp = layer.attention, layer.mlp
        self.ln_in = layer_norm_params(layer.input_layernorm)
        self.ln_post = layer_norm_params(layer.post_attention_layernorm)
        self.qkv, self.dense, self.up, self.down = linear_params(attn.query_key_value, attn.dense, mlp.dense_h_to_4h,
                                                                 mlp.dense_4h_to_h)
        self.act = mlp.act
        self.parallel = bool(layer.use_parallel_residual)


class PagedGPTNeoXRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for a GPTNeoXForCausalLM instance (weights shared); the
    arguments are PagedRunnerBase's."""

    unsupported_reason = staticmethod(gpt_neox_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.gpt_neox
        self.embed = inner.embed_in.weight
        self.layers = [_NeoXLayer(layer) for layer in inner.layers]
        self.final_norm = layer_norm_params(inner.final_layer_norm)
        self.lm_head = model.get_output_embeddings().weight
        self.hidden = config.hidden_size
        self.num_heads = self.num_kv_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim**-0.5  # GPTNeoXAttention's scaling
        self.inv_freq = inner.rotary_emb.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(inner.rotary_emb.attention_scaling)
        self.rotary_dims = 2 * self.inv_freq.numel()  # the first rotary_dims of each head rotate

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, H, D] (a strided view) -> the first rotary_dims of each head rotated, the rest as they are."""
        if self.rotary_dims == self.head_dim:
            return rotate_half_apply(x, cos, sin)
        return torch.cat((rotate_half_apply(x[..., :self.rotary_dims], cos, sin), x[..., self.rotary_dims:]), dim=-1)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, dim, width = flat.shape[0], self.num_heads, self.head_dim, (self.hidden,)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype)  # [T, rotary_dims]
        x = F.embedding(flat.clamp(min=0), self.embed)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            qkv = linear(F.layer_norm(x, width, *layer.ln_in), *layer.qkv).view(total, heads, 3 * dim)
            q, k = self._rotate(qkv[..., :dim], cos, sin), self._rotate(qkv[..., dim:2 * dim], cos, sin)
            o = self._attend(i, q, k, qkv[..., 2 * dim:], attn_lens, cu, n, self.scale)
            attn = linear(o.reshape(total, heads * dim), *layer.dense)
            if layer.parallel:  # transformers' order of the two adds
                x = linear(layer.act(linear(F.layer_norm(x, width, *layer.ln_post), *layer.up)), *layer.down) + attn + x
            else:
                x = attn + x
                x = linear(layer.act(linear(F.layer_norm(x, width, *layer.ln_post), *layer.up)), *layer.down) + x
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = F.layer_norm(x, width, *self.final_norm)
        self._keep(len(self.layers), out)
        return out
