"""PagedEagle3Runner: an EAGLE-3 head (heads/eagle3.py) run over its own PagedKVCache with the
project's append_kv / paged_attention kernels (the cache, packing, admission, commit and kernel
dispatch are PagedRunnerBase's).

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
import weakref

import torch
import torch.nn.functional as F

from ..kernels._backend import resolve_backend
from ._layer_math import fused_layer_math, gated_act, linear_params, norm_params, rms_norm, rope_cos_sin, rotate_qk
from ._linear import linear, linears
from .paged_base import PagedRunnerBase, _check_int, head_dim_reason


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


class PagedEagle3Runner(PagedRunnerBase):
    """Runner of an EAGLE-3 head: prefill_pairs / score_pairs / commit (runners/base.py's contract
    with pairs instead of tokens). embed: the token embedding [V, H] (the target's, unless the head
    has its own). num_draft_tokens: K (sizes the tentative entries: K + 1)."""

    unsupported_reason = staticmethod(eagle3_unsupported_reason)

    def __init__(self, head, embed: torch.Tensor, *, num_draft_tokens: int = 0, block_size: int = 16, backend=None):
        reason = eagle3_unsupported_reason(head, backend=backend)
        if reason is not None:
            raise ValueError(f"PagedEagle3Runner cannot run this head: {reason}")
        _check_int("num_draft_tokens", num_draft_tokens, 0)
        _check_int("block_size", block_size, 1)
        self._model_ref, self.config = weakref.ref(head), head.config
        self.max_new_tokens, self.max_tentative = None, num_draft_tokens + 1
        self.block_size, self.backend = block_size, backend
        weight = head.fc.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.kernels = resolve_backend(backend, self.device, "paged_attention")
        self.fuse_projections = False
        self._bind_head(head, embed)
        self.vocab_size = int(self.lm_head.shape[0])  # the draft vocabulary
        self.cache = None
        self.pooled = False

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

    # -- the runner interface, with pairs ----------------------------------------------------
    @torch.no_grad()
    def prefill_pairs(self, tokens: torch.Tensor, features: torch.Tensor, attention_mask: torch.Tensor | None, *,
                      budgets, num_draft_tokens: int | None = None) -> None:
        """Context entries tokens [B, P], target features [B, P, F] (left padding: the mask's
        real entries are each row's last ones; P may be 0) become each row's committed context;
        row b reserves budgets[b] entries (0: an unused row)."""
        num_valid = self._admit(tokens, attention_mask, budgets, None, num_draft_tokens)
        self._direct = None
        if tokens.shape[1]:
            self._pairs(tokens, features, num_valid, True)
        self._end_prefill()

    @torch.no_grad()
    def score_pairs(self, tokens: torch.Tensor, features: torch.Tensor, num_valid: torch.Tensor | None = None, *,
                    project: bool, tree=None, last_only: bool = False, rows: torch.Tensor | None = None):
        """tokens [B, N], features [B, N, F] (target features with project=True, the head's own g
        with project=False) appended as tentative entries (only the last num_valid[b] real) ->
        (logits [B, N, Vd], g [B, N, H]). tree: (mask, depths) as PagedRunnerBase.score.
        last_only: logits [B, 1, Vd] of the last entry only (the drafters' pending feed reads no
        other: the lm_head, the head's largest matrix, then runs on one row per row, not N);
        rows: int64 [R] entries -> logits [B, R, Vd] of those alone (a tree level's expanding
        nodes, as PagedRunnerBase.score(rows=)); g stays [B, N, H]."""
        self._tentative += tokens.shape[1]
        if self._tentative > self.max_tentative:
            raise RuntimeError(f"{self._tentative} tentative entries since the last commit exceed the reserved "
                               f"K + 1 = {self.max_tentative}")
        normed, g = self._pairs(tokens, features, num_valid, project, tree)
        if last_only:
            normed = normed[:, -1:]
        elif rows is not None:
            normed = normed.index_select(1, rows)
        return linear(normed, self.lm_head), g

    def prefill(self, *args, **kwargs):
        raise TypeError("an EAGLE-3 head is fed (token, hidden state) pairs: use prefill_pairs")

    def score(self, *args, **kwargs):
        raise TypeError("an EAGLE-3 head is fed (token, hidden state) pairs: use score_pairs")

    # -- the forward ------------------------------------------------------------------------
    def _pairs(self, tokens, features, num_valid, project: bool, tree=None):
        batch, n = tokens.shape
        flat, positions, cu, count, unpack = self._pack(tokens, num_valid, None if tree is None else tree[1])
        attn_lens = self.length + count
        feats = features.reshape(batch * n, features.shape[-1])
        if feats.dtype != self.dtype:
            feats = feats.to(self.dtype)
        if unpack is not None:  # the features follow the tokens' packing
            feats = torch.empty_like(feats).index_copy_(0, unpack, feats)
        self._tree_mask = None if tree is None else (tree[0].repeat(batch) if tree[0].dim() == 1 else tree[0].reshape(-1))
        try:
            normed, g = self._head_decode(flat, feats, positions, cu, attn_lens, n, project)
        finally:
            self._tree_mask = None
        self.length.copy_(attn_lens)
        if unpack is not None:
            normed, g = normed.index_select(0, unpack), g.index_select(0, unpack)
        return normed.view(batch, n, -1), g.view(batch, n, -1)

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
