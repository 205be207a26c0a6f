"""PagedDFlashRunner: a DFlash block drafter (heads/dflash.py) over its own PagedKVCache.

The cache holds, per layer, the CONTEXT only: K/V of the projected target hidden states
(k_norm(k_proj(ctx)), v_proj(ctx), RoPE at the position) at every accepted position, extended
only by accepted positions (prefill_context, then each draft call's pending entries: the
target's hidden states of the positions accepted since). A draft call then runs the block
(the last token, then mask tokens; block_size of them) through every layer: its K/V are written
after the context as tentative entries, its queries attend with the block mask (kernels/
attention causal=False: the whole context plus every block token, both ways; a causal layer,
heads/dflash.layer_causality, the earlier block tokens only; a sliding layer its window, passed to
the kernels where a row can reach it), and the block's entries are dropped at once (the committed length never covers them: the next call overwrites
them, no copy). One forward per iteration, whatever K.

Per layer of a draft call: the pending context entries' k/v (<= K+1 rows per row) appended,
then the block's q/k/v (block_size rows per row), one paged attention over [context ; block].
Math per backend as PagedLlamaRunner's CPU path (C++ fused RMSNorm / RoPE / SwiGLU in float32
on CPU, torch elsewhere); the attention through the base's direct C++ / Triton dispatch.

Reservation: each row's budget is the engine's (prompt + max_new_tokens + K + 1) plus block_size
(extra_row_tokens: the block sits after the context).
"""

import torch

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import fused_layer_math, gated_act, linear_params, norm_params, rms_norm, rope_cos_sin, rotate_qk
from ._linear import linear, linears
from .paged_base import PagedRunnerBase, head_dim_reason


def dflash_unsupported_reason(head, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    if getattr(head, "kind", None) != "dflash":
        return f"{type(head).__name__} is not a DFlash drafter"
    for causal, window in zip(head.layer_causal, head.layer_windows):
        if not causal and window is not None and window < head.block_size:
            return (f"a non-causal sliding layer's window ({window}) is below the block ({head.block_size}): the "
                    "kernels' block mask shows a query every block token after it")
    return head_dim_reason(head.config.head_dim, backend)


class _BlockLayer:
    """One DFlash layer's tensors (references to the module's parameters)."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.ln_in, self.ln_post = norm_params(layer.input_layernorm), norm_params(layer.post_attention_layernorm)
        self.qkv = linear_params(attn.q_proj, attn.k_proj, attn.v_proj)
        self.q, self.kv = self.qkv[0], self.qkv[1:]
        self.o, self.down = linear_params(attn.o_proj, mlp.down_proj)
        self.q_norm, self.k_norm = norm_params(attn.q_norm), norm_params(attn.k_norm)
        self.gate_up = linear_params(mlp.gate_proj, mlp.up_proj)


class PagedDFlashRunner(PagedRunnerBase):
    """Runner of a DFlash drafter: prefill_context / draft (module docstring). embed [V, H] and
    lm_head [V, H]: the target's. num_draft_tokens: K (<= block_size - 1)."""

    ring_windows = False  # its block sits past the context in the same cache, both ways: every block kept

    unsupported_reason = staticmethod(dflash_unsupported_reason)

    def __init__(self, head, embed: torch.Tensor, lm_head: torch.Tensor, *, num_draft_tokens: int = 1,
                 block_size: int = 16, backend=None):
        reason = dflash_unsupported_reason(head, backend=backend)
        if reason is not None:
            raise ValueError(f"PagedDFlashRunner cannot run this drafter: {reason}")
        self._init_head(head, head.fc.weight, num_draft_tokens=num_draft_tokens, block_size=block_size, backend=backend,
                        min_draft_tokens=1)
        self.block = head.block_size  # the draft block (the cache's pages are block_size)
        self.mask_token_id = head.mask_token_id
        # per layer: causal inside the block, and the sliding window (the base's _allocate keeps it
        # where a row can reach it)
        self.layer_causal, self.layer_windows = head.layer_causal, head.layer_windows
        self.output_multiplier, self.final_logit_softcapping = head.output_multiplier, head.final_logit_softcapping
        self.extra_row_tokens = self.block
        self.max_tentative = num_draft_tokens + 1 + self.block  # the pending entries, then the block
        self.fuse_projections = False
        hidden = head.config.hidden_size
        for name, tensor in (("embedding", embed), ("lm_head", lm_head)):
            if tensor.shape[1] != hidden:
                raise ValueError(f"the drafter's hidden size is {hidden} but the target's {name} is {tensor.shape[1]} wide")
        self.embed, self.lm_head = embed, lm_head
        (self.fc,) = linear_params(head.fc)
        self.hidden_norm = (head.hidden_norm.weight, head.hidden_norm.variance_epsilon)
        self.final_norm = (head.norm.weight, head.norm.variance_epsilon)
        self.layers = [_BlockLayer(layer) for layer in head.layers]
        config = head.config
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, \
            config.head_dim
        self.scale = self.head_dim ** -0.5
        self.inv_freq = head.rotary.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(head.rotary.attention_scaling)
        self.feature_width = head.fc.weight.shape[1]
        self.vocab_size = int(lm_head.shape[0])
        self._block_cu = {}

    def prefill(self, *args, **kwargs):
        raise TypeError("a DFlash drafter is fed the target's hidden states: use prefill_context / draft")

    def score(self, *args, **kwargs):
        raise TypeError("a DFlash drafter is fed the target's hidden states: use prefill_context / draft")

    @torch.no_grad()
    def prefill_context(self, features: torch.Tensor, attention_mask: torch.Tensor | None, *, budgets,
                        num_draft_tokens: int) -> None:
        """The prompt's target hidden states features [B, P, W] (left padding) become each row's
        committed context; row b reserves budgets[b] + block_size entries (0: an unused row)."""
        budgets = [b + self.block if b else 0 for b in budgets]
        num_valid = self._admit(features[..., 0], attention_mask, budgets, None, num_draft_tokens + self.block)
        self._direct = None
        if features.shape[1]:
            self.length.add_(self._append_context(features, num_valid))
        self._end_prefill()

    @torch.no_grad()
    def draft(self, features: torch.Tensor, num_pending: torch.Tensor | None, block: torch.Tensor,
              block_valid: torch.Tensor | None) -> torch.Tensor:
        """Pending context entries features [B, P, W] (only the last num_pending[b] real) are
        committed; the block tokens [B, block_size] (block_valid: block_size or 0 per row; None:
        every row) run through the layers -> norm(h) [B, block_size, H]. The block leaves no entry."""
        count = self._append_context(features, num_pending)
        self.length.add_(count)  # the block starts after the context
        batch, n = block.shape
        flat, positions, cu, block_count, unpack = self._pack(block, block_valid)
        attn_lens = self.length + block_count
        h = self._block_forward(flat, positions, cu, attn_lens, n)
        self.length.sub_(count)
        self.commit(count)  # the context entries are final; the block's are dropped (beyond the committed length)
        if unpack is not None:
            h = h.index_select(0, unpack)
        return h.view(batch, n, -1)

    # -- the forward ------------------------------------------------------------------------
    def _append_context(self, features: torch.Tensor, num_valid) -> torch.Tensor:
        """K/V of context entries [B, P, W] (last num_valid real) written at self.length, every
        layer; returns the real count per row [B] int32 (self.length unchanged)."""
        batch, p = features.shape[:2]
        dummy = torch.zeros(batch, p, dtype=torch.long, device=self.device) if p else None
        if p == 0:
            return torch.zeros(batch, dtype=torch.int32, device=self.device)
        _, positions, cu, count, unpack = self._pack(dummy, num_valid)
        feats = features.reshape(batch * p, features.shape[-1])
        if feats.dtype != self.dtype:
            feats = feats.to(self.dtype)
        if unpack is not None:
            feats = torch.empty_like(feats).index_copy_(0, unpack, feats)
        total = feats.shape[0]
        fused = fused_layer_math(self.dtype, self.device.type)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype, fused)
        ctx = rms_norm(linear(feats, *self.fc), *self.hidden_norm, fused)
        for i, layer in enumerate(self.layers):
            k, v = linears(ctx, layer.kv)
            k = rms_norm(k.view(total, self.num_kv_heads, self.head_dim), *layer.k_norm, fused)
            k = rotate_half_apply(k, cos, sin)
            self._append(i, k, v.view(total, self.num_kv_heads, self.head_dim), cu)
        return count.to(torch.int32) if isinstance(count, torch.Tensor) else \
            torch.full((batch,), count, dtype=torch.int32, device=self.device)

    def _block_forward(self, flat, positions, cu, attn_lens, n: int) -> torch.Tensor:
        total = flat.shape[0]
        fused = fused_layer_math(self.dtype, self.device.type)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype, fused)
        h = self._embed(flat)
        for i, layer in enumerate(self.layers):
            x, mixing = self._mix_in(i, 0, rms_norm(h, *layer.ln_in, fused), n)
            q, k, v = linears(x, layer.qkv)
            q = rms_norm(q.view(total, self.num_heads, self.head_dim), *layer.q_norm, fused)
            k = rms_norm(k.view(total, self.num_kv_heads, self.head_dim), *layer.k_norm, fused)
            q, k = rotate_qk(q, k, cos, sin, fused)
            self._append(i, k, v.view(total, self.num_kv_heads, self.head_dim), cu)
            o = self._attention(i, q, attn_lens, cu, n, self.scale, causal=self.layer_causal[i])
            h = self._out(i, 0, o.reshape(total, -1), layer.o, h, mixing, n)
            x, mixing = self._mix_in(i, 1, rms_norm(h, *layer.ln_post, fused), n)
            gate, up = linears(x, layer.gate_up)
            h = self._out(i, 1, gated_act(gate, up, None, True, fused), layer.down, h, mixing, n)
        return rms_norm(h, *self.final_norm, fused)

    # Hooks of the variants (runners/paged_dflash2.py: DFlash2's in-block convolution and embedding
    # scale); here DFlash's math. Block tokens are packed whole blocks of n (rows fed nothing too).

    def _mix_in(self, i: int, sublayer: int, x: torch.Tensor, n: int):
        """Layer i's sublayer (0 attention, 1 MLP) input -> (what it reads, what _out needs)."""
        return x, None

    def _out(self, i: int, sublayer: int, x: torch.Tensor, weight_bias, h: torch.Tensor, mixing, n: int) -> torch.Tensor:
        """h + the sublayer's output projection of x."""
        return linear(x, *weight_bias, h)

