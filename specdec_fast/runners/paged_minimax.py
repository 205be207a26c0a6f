"""PagedMiniMaxRunner: MiniMax-Text-01 and MiniMax-M1 (model_type minimax, 456B-A46B) -- lightning attention layers
(linear attention with a per-head decay) with a softmax attention layer every few, experts in every layer -- on the
paged KV cache, with speculative decoding's rollback of the linear layers' states (runners/paged_recurrent.py).

The math is transformers 5.24's MiniMaxDecoderLayer (modeling_minimax.py), eval mode; every RMSNorm Llama's:
    h = input_layernorm x
    a = lightning(h)  ("linear_attention": runners/lightning.py)  or  attention(h)  ("full_attention": GQA, RoPE)
    x = alpha_attn h + beta_attn a          (the residual is the NORMED input; alpha / beta the config's factors
                                             of each layer kind: MiniMax-Text-01's DeepNorm alpha (2 L)^0.5)
    h = post_attention_layernorm x
    x = alpha_mlp h + beta_mlp moe(h)       (Mixtral's experts: softmax over the router's logits in float32, the top
                                             k renormalised; runners/_moe.py)
    logits = lm_head(norm x)
A sliding window on the attention layers (config.sliding_window) is refused (the checkpoints set none), as are token
trees (each node would need its own linear state). Tensor parallelism: runners/paged_minimax_tp.py. Not timed on a
GPU.
"""
import torch

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import linear_params, norm_params, rope_cos_sin
from ._linear import linear
from ._moe import MoE, layers_moe_reason
from ._rotary import static_rope_reason
from .lightning import Lightning, lightning_forward
from .paged_base import decoder_reason, head_dim_reason
from .paged_olmo2 import llama_rms_norm
from .paged_recurrent import PagedRecurrentRunner, layer_kinds_reason

MINIMAX_TYPES = ("minimax",)
LAYER_KINDS = ("full_attention", "linear_attention")


def _projections(layer) -> tuple:
    """A layer's projection modules (for plain_projections_reason; the experts are 3-D tensors, the router checked by
    moe_reason)."""
    attn = layer.self_attn
    if hasattr(attn, "qkv_proj"):
        return attn.qkv_proj, attn.output_gate, attn.out_proj
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj


def minimax_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedMiniMaxRunner cannot run ``model`` (a MiniMaxForCausalLM), or None when it can."""
    config = getattr(model, "config", None)
    reason = layer_kinds_reason(config, LAYER_KINDS) or decoder_reason(
        model, MINIMAX_TYPES, "model.layers", "a MiniMaxForCausalLM", _projections)
    if reason is not None:
        return reason
    if getattr(config, "sliding_window", None) is not None:
        return f"sliding_window {config.sliding_window} on the attention layers (this runner's are full)"
    reason = layers_moe_reason([layer.mlp for layer in model.model.layers], config)
    if reason is not None:
        return reason
    rotary = model.model.rotary_emb
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if rotary.inv_freq.numel() * 2 != head_dim:
        return f"a RoPE over {rotary.inv_freq.numel() * 2} of the head's {head_dim} dims (this runner rotates whole heads)"
    return static_rope_reason(getattr(rotary, "rope_type", None)) or head_dim_reason(head_dim, backend)


class _Layer:
    """One layer's kind, its mixer's tensors (references), norms, residual factors and experts."""

    def __init__(self, layer, config, kernels: str):
        self.kind = config.layer_types[layer.layer_idx]
        attn = layer.self_attn
        if self.kind == "linear_attention":
            self.mixer = Lightning.of(attn)
        else:
            self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.input_norm, self.post_norm = norm_params(layer.input_layernorm), norm_params(layer.post_attention_layernorm)
        self.attn_alpha, self.attn_beta = float(layer.attn_alpha_factor), float(layer.attn_beta_factor)
        self.mlp_alpha, self.mlp_beta = float(layer.mlp_alpha_factor), float(layer.mlp_beta_factor)
        self.moe = MoE(layer.mlp, config, kernels)


class PagedMiniMaxRunner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for a MiniMaxForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. Token trees: each node from its parent's states."""

    unsupported_reason = staticmethod(minimax_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer, config, self.kernels) for layer in inner.layers]
        self._index_layers()
        self.final_norm = norm_params(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self._bind_heads(config)
        self.inv_freq = inner.rotary_emb.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(inner.rotary_emb.attention_scaling)

    def _lightning_norm(self, o: torch.Tensor, norm: tuple) -> torch.Tensor:
        """A lightning layer's output norm over its H D outputs o [T, H D] (the tensor-parallel runner's over every
        rank's heads)."""
        return llama_rms_norm(o, norm)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype)  # [T, D], once per call
        rows = self._row_layout(cu, total, n)
        x = self._embed(flat)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = llama_rms_norm(x, layer.input_norm)
            if layer.kind == "full_attention":
                q = linear(h, *layer.q).view(total, heads, dim)
                k = linear(h, *layer.k).view(total, kv_heads, dim)
                v = linear(h, *layer.v).view(total, kv_heads, dim)
                q, k = rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)
                o = self._attend(self._attention_index[i], q, k, v, attn_lens, cu, n, self.scale)
                a = linear(o.reshape(total, -1), *layer.o)
            else:
                a = lightning_forward(layer.mixer, self.states[self._recurrent_index[i]], h, rows, self._prefilling,
                                      self._lightning_norm)
            x = h * layer.attn_alpha + self._sum_partials(a) * layer.attn_beta
            h = llama_rms_norm(x, layer.post_norm)
            x = h * layer.mlp_alpha + self._sum_partials(layer.moe(h, self._prefilling)) * layer.mlp_beta
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = llama_rms_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out
