"""PagedOlmoRunner: OLMo 1 (model_type olmo: allenai/OLMo-1B-hf, OLMo-7B-hf, OLMo-1.7-7B-hf) run layer by layer over
a PagedKVCache with the project's append_kv / paged_attention kernels (the machinery: runners/paged_base.py).

Weights are the model's own parameters (no copy): embed_tokens, per layer self_attn.{q,k,v,o}_proj (+ biases:
attention_bias), mlp.{gate,up,down}_proj, then lm_head. The math is transformers 5.24's OlmoDecoderLayer
(modeling_olmo.py), eval mode:
    h = ln(x)                   OlmoLayerNorm: F.layer_norm in float32 with no weight or bias, eps 1e-5, then x's dtype
    q, k, v = projections of h, each clamped to [-clip_qkv, clip_qkv] where the config sets it
    q, k = RoPE(q, k)           float32 tables, the rotation in float32, cast back (OLMo 2's: paged_olmo2.py)
    x = x + o_proj(attention(q, k, v));  x = x + down(silu(gate(ln(x))) * up(ln(x)))
    logits = lm_head(ln(x))
One path on every backend, as the OLMo 2 runner: the attention and KV append through the kernels, the rest torch
ops. No tensor-parallel runner (the 1B / 7B checkpoints fit one device): refused by name.
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import linear_params
from ._linear import linear
from ._rotary import device_rope_tables, rope_tables_reason, rotations
from .paged_base import PagedRunnerBase, decoder_reason
from .paged_llama import projection_modules

OLMO1_TYPES = ("olmo",)
OLMO_NORM_EPS = 1e-5  # OlmoLayerNorm's, fixed (the config's has no field for it)


def olmo_layer_norm(x: torch.Tensor) -> torch.Tensor:
    """OlmoLayerNorm over the last dim of x: mean-centred and scaled in float32, no weight or bias, then x's dtype."""
    return F.layer_norm(x.float(), x.shape[-1:], None, None, OLMO_NORM_EPS).to(x.dtype)


def olmo_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedOlmoRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and kernel ``backend``,
    or None when it can."""
    return (decoder_reason(model, OLMO1_TYPES, "model.layers", "an OlmoForCausalLM", projection_modules)
            or rope_tables_reason(model, max_tokens_per_row, backend))


class _OlmoLayer:
    """One OlmoDecoderLayer's parameters (references to the model's tensors, not copies)."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.gate, self.up, self.down = linear_params(mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        self.act = mlp.act_fn


class PagedOlmoRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for an OlmoForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's."""

    unsupported_reason = staticmethod(olmo_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_OlmoLayer(layer) for layer in inner.layers]
        self.lm_head = model.get_output_embeddings().weight
        self.clip = config.clip_qkv  # None: no clamp
        self._bind_heads(config)
        self.rope_tables, self.rope_keys = device_rope_tables(model, self.device)

    def _qkv(self, layer, h: torch.Tensor) -> tuple:
        """q, k, v [T, heads, D] of h [T, H]: the projections, clamped to clip_qkv where it is set."""
        total, dim = h.shape[0], self.head_dim
        q, k, v = linear(h, *layer.q), linear(h, *layer.k), linear(h, *layer.v)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        return q.view(total, -1, dim), k.view(total, -1, dim), v.view(total, -1, dim)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total = flat.shape[0]
        tables = rotations(self.rope_tables, positions, torch.float32)  # [T, D] cos / sin, once per call
        x = self._embed(flat)
        sum_ = self._sum_partials
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            cos, sin = tables[self.rope_keys[i]]
            q, k, v = self._qkv(layer, olmo_layer_norm(x))
            q, k = rotate_half_apply(q, cos, sin).to(q.dtype), rotate_half_apply(k, cos, sin).to(k.dtype)
            o = self._attend(i, q, k, v, attn_lens, cu, n, self.scale)
            x = x + sum_(linear(o.reshape(total, -1), *layer.o))
            h = olmo_layer_norm(x)
            x = x + sum_(linear(layer.act(linear(h, *layer.gate)) * linear(h, *layer.up), *layer.down))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = olmo_layer_norm(x)
        self._keep(len(self.layers), out)
        return out
