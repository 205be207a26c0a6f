"""PagedMtpRunner: a target's MTP layer (heads/mtp.py) run over its own PagedKVCache.

The MTP block is a decoder layer of the target's family, so this is the Llama runner
(runners/paged_llama.py: its layer math on every backend -- torch, C++, the Triton layer path --
GLM-4.5's partial RoPE, q/k/v biases and MoE included) over one layer, with two changes: the
layer's input is eh_proj(cat(enorm(embed(token)), hnorm(feature))) instead of the embedding
(_embed), and its final norm is the MTP layer's post_norm. It is fed (token, feature) pairs
(PairedRunner: runners/paired.py); its logits are the target's lm_head over post_norm's output,
which is also what a draft step feeds back (heads/mtp.py).
"""
import types
import weakref

import torch
import torch.nn.functional as F

from ..kernels._backend import resolve_backend
from ._layer_math import fused_layer_math, linear_params, norm_params, rms_norm
from ._linear import linear
from .paged_base import _check_int, head_dim_reason
from .paged_llama import PagedLlamaRunner
from .paired import PairedRunner


def mtp_unsupported_reason(head, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedMtpRunner cannot run ``head`` with kernel ``backend``, or None."""
    if getattr(head, "kind", None) != "mtp":
        return f"{type(head).__name__} is not an MTP head"
    config = head.config
    return head_dim_reason(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
                           backend)


class PagedMtpRunner(PairedRunner, PagedLlamaRunner):
    """Runner of a target's MTP layer: prefill_pairs / score_pairs / commit. embed [V, H] and
    lm_head [V, H]: the target's. num_draft_tokens: K (sizes the tentative entries: K + 1)."""

    unsupported_reason = staticmethod(mtp_unsupported_reason)
    position_offset = 1  # entry t (the token at t + 1) at position t + 1, as transformers' MtpModel

    def __init__(self, head, embed: torch.Tensor, lm_head: torch.Tensor, *, num_draft_tokens: int = 0,
                 block_size: int = 16, backend=None):
        reason = mtp_unsupported_reason(head, backend=backend)
        if reason is not None:
            raise ValueError(f"PagedMtpRunner cannot run this head: {reason}")
        _check_int("num_draft_tokens", num_draft_tokens, 0)
        _check_int("block_size", block_size, 1)
        layer = head.layer
        if embed.shape[1] != head.feature_width or lm_head.shape[1] != head.feature_width:
            raise ValueError(f"the MTP layer is {head.feature_width} wide but the target's embedding / lm_head are "
                             f"{embed.shape[1]} / {lm_head.shape[1]} (an MTP layer of another model?)")
        self._model_ref, self.config = weakref.ref(head), head.config
        self.max_new_tokens, self.max_tentative = None, num_draft_tokens + 1
        self.block_size, self.backend = block_size, backend
        weight = layer.eh_proj.weight
        self.device, self.dtype = weight.device, weight.dtype
        if embed.device != self.device:
            raise ValueError(f"the MTP layer is on {self.device} but the target's embedding is on {embed.device}")
        self.kernels = resolve_backend(backend, self.device, "paged_attention")
        self.fuse_projections = self.kernels == "triton"
        # The Llama runner's _bind reads a model; the MTP layer presented as one (its block the one
        # layer, post_norm the final norm, the target's embedding / LM head / rotary module).
        model = types.SimpleNamespace(
            config=head.config, get_output_embeddings=lambda: types.SimpleNamespace(weight=lm_head),
            model=types.SimpleNamespace(embed_tokens=types.SimpleNamespace(weight=embed), layers=[layer.mtp_block],
                                        norm=layer.post_norm, rotary_emb=head.rotary))
        self._bind(model)
        self.enorm, self.hnorm = norm_params(layer.enorm), norm_params(layer.hnorm)
        (self.eh_proj,) = linear_params(layer.eh_proj)
        self.hidden_first = head.hidden_first
        self.feature_width = head.feature_width
        self.vocab_size = int(self.lm_head.shape[0])
        self.cache = None
        self.pooled = False
        self._features = None

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        """ids [T] (-1 pads) with the forward's features [T, H] -> the MTP block's input [T, H]."""
        fused = fused_layer_math(self.dtype, self.device.type)
        e = rms_norm(F.embedding(flat.clamp(min=0), self.embed), *self.enorm, fused)
        h = rms_norm(self._features, *self.hnorm, fused)
        return linear(torch.cat([h, e] if self.hidden_first else [e, h], -1), *self.eh_proj)

    def _head_decode(self, flat, feats, positions, cu, attn_lens, n: int, project: bool):
        """Packed entries -> (post_norm output [T, H], the same: what a draft step feeds back).
        project: ignored (target features and the layer's own outputs take the same path)."""
        self._features = feats
        try:
            out = self._decode(flat, positions, cu, attn_lens, n)
        finally:
            self._features = None
        return out, out

    def _head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self._logits(normed)
