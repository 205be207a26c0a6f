"""PagedMimoRunner: Xiaomi's MiMo-V2-Flash (model_type mimo_v2_flash: 309B total, 15B active) on the paged KV cache
(the machinery: runners/paged_base.py).

The math is transformers 5.24's MiMoV2FlashDecoderLayer (modeling_mimo_v2_flash.py), eval mode:
    h = input_layernorm(x)                     Llama's RMSNorm
    q, k = q_proj h, k_proj h                  heads of head_dim (192); the sliding layers have twice the KV heads
    v = v_proj h * attention_value_scale       heads of v_head_dim (128), scaled before the cache (0.707)
    RoPE on the first int(head_dim * partial_rotary_factor) dims of each head (64 of 192), a table a layer type
    o = attention(q, k, v)                     head_dim^-0.5; the sliding layers within their window (129) and
                                               with attention sinks (GPT-OSS's: a logit a head in the softmax)
    x = x + o_proj o;  x = x + mlp(post_attention_layernorm x)
    mlp: a SwiGLU MLP (mlp_layer_types "dense": the first layer), or DeepSeek-V3's MoE without shared experts
         (runners/_moe.py "sigmoid_groups": sigmoid scores of the float32 router, the top k by score + correction
         bias within the best groups, renormalised, times routed_scaling_factor)
    logits = lm_head(norm(x))
The value heads are narrower than the key heads, and the paged cache holds K and V planes of one width: each
value is stored zero-padded to head_dim, and the attention's output (whose padded columns are zero) sliced back to
v_head_dim. The V plane is then head_dim / v_head_dim (1.5x) its bytes: the KV pool 1.2x the unpadded one.
The checkpoint's MTP layers (model.mtp.*) are not loaded by transformers, nor read here. The attention and the
KV append run through the kernels; the rest as torch ops, the experts through kernels/moe where the backend fuses
them. Tensor parallelism: paged_mimo_tp.py. Not timed on a GPU.
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import linear_params, norm_params
from ._linear import linear
from ._moe import is_moe, moe_or_gated_mlp, layers_moe_reason
from ._rotary import device_rope_tables, rope_tables_reason, rotations
from .paged_base import PagedRunnerBase, decoder_reason
from .paged_olmo2 import llama_rms_norm

MIMO_TYPES = ("mimo_v2_flash",)


def _projections(layer) -> tuple:
    """A layer's projection modules (for plain_projections_reason): attention, and the dense MLP's (a MoE block's
    experts are 3-D tensors, its router checked by moe_reason)."""
    attn, mlp = layer.self_attn, layer.mlp
    dense = () if is_moe(mlp) else (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    return (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj) + dense


def mimo_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedMimoRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and kernel ``backend``,
    or None when it can."""
    reason = decoder_reason(model, MIMO_TYPES, "model.layers", "a MiMoV2FlashForCausalLM", _projections)
    if reason is not None:
        return reason
    config = model.config
    if config.v_head_dim > config.head_dim:
        return f"v_head_dim {config.v_head_dim} wider than head_dim {config.head_dim} (the values are padded to it)"
    return layers_moe_reason([layer.mlp for layer in model.model.layers], config) or rope_tables_reason(model, max_tokens_per_row, backend)


class _Layer:
    """One decoder layer's parameters (references to the model's tensors, not copies; the sinks a float32 copy of
    Hq values, as the Llama runner keeps GPT-OSS's)."""

    def __init__(self, layer, config, kernels: str):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.kv_heads = attn.k_proj.weight.shape[0] // attn.head_dim
        self.sinks = None if attn.sinks is None else attn.sinks.detach().float().contiguous()
        self.v_scale = attn.v_scale  # a Python float, as MiMoV2FlashAttention multiplies it
        self.input, self.post_attention = norm_params(layer.input_layernorm), norm_params(layer.post_attention_layernorm)
        self.moe, self.mlp, self.act = moe_or_gated_mlp(mlp, config, kernels)


class PagedMimoRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for a MiMoV2FlashForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's."""

    unsupported_reason = staticmethod(mimo_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer, config, self.kernels) for layer in inner.layers]
        self.final_norm = norm_params(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self._bind_heads(config)  # head_dim: the keys' (and the softmax scale's)
        self.v_head_dim = config.v_head_dim
        if any(layer.sinks is not None for layer in self.layers):  # the sliding layers'
            self.attn_sinks = tuple(layer.sinks for layer in self.layers)
        self.rope_tables, self.rope_keys = device_rope_tables(model, self.device)

    def kv_shape(self, i: int) -> tuple:
        """(KV heads, head dim) of layer i: the sliding layers' twice the full ones' KV heads; the values padded to
        head_dim."""
        return self.layers[i].kv_heads, self.head_dim

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, dim, value_dim = flat.shape[0], self.num_heads, self.head_dim, self.v_head_dim
        tables = rotations(self.rope_tables, positions, self.dtype)  # [T, R] cos / sin a layer type, the model dtype
        x = self._embed(flat)
        sum_ = self._sum_partials
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = llama_rms_norm(x, layer.input)
            q = linear(h, *layer.q).view(total, heads, dim)
            k = linear(h, *layer.k).view(total, layer.kv_heads, dim)
            v = linear(h, *layer.v).view(total, layer.kv_heads, value_dim) * layer.v_scale
            cos, sin = tables[self.rope_keys[i]]
            q, k = rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)
            o = self._attend(i, q, k, F.pad(v, (0, dim - value_dim)), attn_lens, cu, n, self.scale)
            x = x + sum_(linear(o[..., :value_dim].reshape(total, heads * value_dim), *layer.o))
            h = llama_rms_norm(x, layer.post_attention)
            if layer.moe is not None:
                x = x + sum_(layer.moe(h, self._prefilling))
            else:
                (gate, up, down), act = layer.mlp, layer.act
                x = x + sum_(linear(act(linear(h, *gate)) * linear(h, *up), *down))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = llama_rms_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out
