"""PagedEagle3Runner: an EAGLE-3 head (heads/eagle3.py) run over its own PagedKVCache with the
project's append_kv / paged_attention kernels (the cache, packing, admission, commit and kernel
dispatch are PagedRunnerBase's; the pairs interface, prefill_pairs / score_pairs, PairedRunner's:
runners/paired.py).

A head's call feeds PAIRS: tokens [B, N] and features [B, N, F] (entry t = the token at t + 1
and, for context entries, the target's hidden states at t (F = 3 H_t, projected by fc) or, for
draft steps, the head's own previous output g (F = H, project=False)). It returns the
draft-vocabulary logits [B, N, Vd] and g [B, N, H] (the pre-norm output the next draft step
feeds back). One layer; the math is the module's (heads/eagle3.py) on the paged kernels:
embedding -> input_layernorm, fc -> hidden_norm, cat -> q/k/v (2H wide) -> RoPE -> attention
-> o_proj + residual -> post_attention_layernorm -> SwiGLU -> + residual = g -> norm -> lm_head.
Per backend as PagedLlamaRunner's CPU path (C++ fused RMSNorm / RoPE / SwiGLU in float32 on CPU,
torch elsewhere); attention through the base's direct C++ / Triton dispatch.
"""

import torch
import torch.nn.functional as F

from ._layer_math import fused_layer_math, gated_act, linear_params, norm_params, rms_norm, rope_cos_sin, rotate_qk
from ._linear import linear, linears
from .paged_base import PagedRunnerBase, head_dim_reason
from .paired import PairedRunner


def eagle3_unsupported_reason(head, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedEagle3Runner cannot run ``head`` with kernel ``backend``, or None."""
    if getattr(head, "kind", None) != "eagle3":
        return f"{type(head).__name__} is not an EAGLE-3 head"
    return head_dim_reason(head.config.head_dim, backend)


class _HeadLayer:
    """The midlayer's tensors (references to the module's parameters)."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.ln_in, self.ln_hidden, self.ln_post = (norm_params(n) for n in (
            layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm))
        self.qkv = linear_params(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o, self.down = linear_params(attn.o_proj, mlp.down_proj)
        self.gate_up = linear_params(mlp.gate_proj, mlp.up_proj)


class PagedEagle3Runner(PairedRunner, PagedRunnerBase):
    """Runner of an EAGLE-3 head: prefill_pairs / score_pairs / commit (runners/base.py's contract
    with pairs instead of tokens). embed: the token embedding [V, H] (the target's, unless the head
    has its own). num_draft_tokens: K (sizes the tentative entries: K + 1)."""

    unsupported_reason = staticmethod(eagle3_unsupported_reason)

    def __init__(self, head, embed: torch.Tensor, *, num_draft_tokens: int = 0, block_size: int = 16, backend=None):
        reason = eagle3_unsupported_reason(head, backend=backend)
        if reason is not None:
            raise ValueError(f"PagedEagle3Runner cannot run this head: {reason}")
        self._init_head(head, head.fc.weight, num_draft_tokens=num_draft_tokens, block_size=block_size, backend=backend)
        self.fuse_projections = False
        self._bind_head(head, embed)
        self.vocab_size = int(self.lm_head.shape[0])  # the draft vocabulary

    def _bind_head(self, head, embed) -> None:
        config = head.config
        own = head.embed_tokens
        self.embed = own.weight if own is not None else embed
        if self.embed.shape[1] != config.hidden_size:
            raise ValueError(f"the head's hidden size is {config.hidden_size} but the embedding it reads is "
                             f"{self.embed.shape[1]} wide (a head for another target?)")
        if self.embed.device != self.device:
            raise ValueError(f"the head is on {self.device} but the embedding is on {self.embed.device}")
        (self.fc,) = linear_params(head.fc)
        self.layer = _HeadLayer(head.midlayer)
        self.layers = [self.layer]  # the KV cache's layer count
        self.final_norm = (head.norm.weight, head.norm.variance_epsilon)
        self.lm_head = head.lm_head.weight
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim ** -0.5
        self.inv_freq = head.rotary.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(head.rotary.attention_scaling)
        self.norm_before_residual = head.norm_before_residual
        self.feature_width = head.fc.weight.shape[1]  # 3 H_t

    def _head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """norm(g) [..., H] -> draft-vocabulary logits [..., Vd]."""
        return linear(normed, self.lm_head)

    def _head_decode(self, flat, feats, positions, cu, attn_lens, n: int, project: bool):
        """Packed entries -> (norm(g) [T, H], g [T, H])."""
        total, layer = flat.shape[0], self.layer
        fused = fused_layer_math(self.dtype, self.device.type)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype, fused)
        feature = linear(feats, *self.fc) if project else feats
        normed_feature = rms_norm(feature, *layer.ln_hidden, fused)
        residual = normed_feature if self.norm_before_residual else feature
        e = rms_norm(F.embedding(flat.clamp(min=0), self.embed), *layer.ln_in, fused)
        q, k, v = linears(torch.cat([e, normed_feature], -1), layer.qkv)
        q = q.view(total, self.num_heads, self.head_dim)
        k, v = k.view(total, self.num_kv_heads, self.head_dim), v.view(total, self.num_kv_heads, self.head_dim)
        q, k = rotate_qk(q, k, cos, sin, fused)
        o = self._attend(0, q, k, v, attn_lens, cu, n, self.scale)
        x = linear(o.reshape(total, -1), *layer.o, residual)
        gate, up = linears(rms_norm(x, *layer.ln_post, fused), layer.gate_up)
        g = linear(gated_act(gate, up, None, True, fused), *layer.down, x)
        return rms_norm(g, *self.final_norm, fused), g
