"""HFRunner: any transformers causal LM through its own forward and DynamicCache.

Layout: one cache length L shared by the batch. Slot j of row b holds a real token or a hole;
``slot_valid`` [B, L] (device bool) says which. Rejected drafts and in-call padding become
holes, masked out through the attention mask; every real token gets an explicit position_id
(its row's true position), so the result equals decoding that row alone for any model that
honours attention_mask and position_ids (checked for Llama, Qwen2 and GPT-2 in
transformers 5.x: masks are built from the 2-D mask and cache slot order, RoPE / learned
positions from position_ids).

Growth: each score call appends N slots per row whether or not they are kept, so L grows by
K+1 (target) per iteration while a row gains only accepted+1 tokens. ``compact`` (called by
the engine at poll time with a host-side upper bound of the committed lengths) right-aligns
each row's real slots into that bound with one gather per layer: the holes cost attention
work in between, at most one poll interval's worth of (K+1) slots per iteration.

Masks: with attn_implementation "sdpa" or "eager" the runner builds the 4-D mask itself
(transformers' own mask builder reads the 2-D mask's values for one-token queries, a host
sync); other implementations get the 2-D mask and transformers builds it.

Sliding windows (Mistral's sliding_window, layer_types with "sliding_attention": Qwen2 with
use_sliding_window, Gemma 2/3): transformers' layer keeps a key when kv_idx > q_idx - window, in
its cache's slot order, the padded sequence's; a row's left pads shift both sides alike, so that
is q_pos - k_pos < window in the row's own positions. Slots here are not in position order
(holes), so the runner keeps every slot's position (``slot_pos``) and builds the window into the
4-D mask: one windowed mask where every layer slides (Mistral), or transformers' per-layer-type
dict {"full_attention": ..., "sliding_attention": ...} (the models with layer_types take it as
their own mask mapping). The cache then keeps every slot (a DynamicCache without the config: no
layer drops what the window passed; the mask hides it). Measured before this: a prompt past the
window raised a shape error in sdpa (the sliding layer had dropped the slots the mask listed).
The "2d" implementations (flash attention, ...) build the window from slot order: refused.
"""
import inspect
import weakref

import torch

from .hf_support import alibi_from_mask, hf_unsupported_reason
from .sliding_window import sliding_layout
from .wrapped import unwrapped


def _dynamic_cache_class():
    """transformers.DynamicCache, imported on first use: importing transformers costs ~0.6 s of
    `import specdec_fast` (python -X importtime, 2-core EPYC), and a kernels-only user never needs it."""
    try:
        from transformers import DynamicCache
    except ImportError as e:  # pragma: no cover - transformers is a dependency, but may be broken
        raise ImportError("HFRunner needs transformers (pip install transformers)") from e
    return DynamicCache


def cache_keyword(model) -> str:
    """The forward's name for the KV cache: ``cache`` in transformers 5.24+ (``past_key_values``
    there is deprecated, a FutureWarning per call, and goes in 5.40), ``past_key_values`` before."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # no signature to read: the older name, which 5.24-5.39 still take
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def output_cache(out):
    """The KV cache a forward returned: ``out.cache`` in transformers 5.24+ (``out.past_key_values``
    there logs a deprecation), ``out.past_key_values`` before."""
    cache = getattr(out, "cache", None)
    return out.past_key_values if cache is None else cache


class UnsupportedModelError(ValueError):
    """A model no runner here can speculate on exactly (layers that keep what a rejected draft
    fed them, positions that do not follow position_ids: runners/hf_support.py): what
    patch_generate's fallback hands to transformers' own generate."""


def hf_refusal(model) -> str | None:
    """Why HFRunner(model) refuses ``model`` (the UnsupportedModelError it raises: hf_unsupported_reason,
    or layers other than attention by the sliding-window rule), or None."""
    reason = hf_unsupported_reason(model)
    if reason is not None:
        return reason
    try:
        sliding_layout(model.config, type(unwrapped(model)))
    except UnsupportedModelError as error:
        return str(error)
    return None


class HFRunner:
    """Runner (see runners/base.py) around a transformers causal LM instance (weights shared)."""

    needs_compact = True  # rejected drafts leave holes that compact() reclaims

    def __init__(self, model, *, compact_slack: int = 64):
        reason = hf_unsupported_reason(model)
        if reason is not None:
            raise UnsupportedModelError(reason)
        self._cache_class = _dynamic_cache_class()
        self._model_ref = weakref.ref(model)  # weak: an engine cached per model must not keep it alive
        self.config = model.config
        head = model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)
        self.device = next(model.parameters()).device
        impl = getattr(self.config, "_attn_implementation", None)
        self.mask_kind = {"sdpa": "bool", "eager": "additive"}.get(impl, "2d")
        self.window, self.window_per_layer_type = sliding_layout(self.config, type(unwrapped(model)))
        if self.window is not None and self.mask_kind == "2d":
            raise ValueError(f"a sliding-window model with attn_implementation={impl!r}: runner='hf' builds the window "
                             "into its own mask, for 'sdpa' or 'eager' attention; load the model with one of them")
        if alibi_from_mask(model) and self.window is None:
            self.mask_kind = "2d"  # ALiBi from the 2-D mask's running count of ones: true positions past holes
        self.dtype = next(model.parameters()).dtype
        self.compact_slack = compact_slack
        limits = [getattr(self.config, n, None) for n in ("max_position_embeddings", "n_positions")]
        # Draft slots past the model's last position are never emitted (max_new_tokens is checked
        # against it): clamping keeps learned position tables in range.
        self.max_position = next((v - 1 for v in limits if isinstance(v, int)), None)
        self.cache = None
        self._cache_keyword = cache_keyword(model)

    @property
    def model(self):
        model = self._model_ref()
        if model is None:
            raise RuntimeError("the model of this HFRunner was deleted")
        return model

    # -- helpers ---------------------------------------------------------------------------
    def _forward(self, input_ids, attention_mask, position_ids):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_keyword: self.cache},
            return_dict=True,
        )
        return out.logits

    def _mask(self, new_valid: torch.Tensor, new_pos: torch.Tensor):
        """Attention mask for N new slots (positions new_pos [B, N]) after the L cached ones: 2-D
        [B, L+N] or 4-D [B,1,N,L+N]; a sliding window's (module docstring): one windowed 4-D
        mask, or the dict of one per layer type."""
        keys = torch.cat([self.slot_valid, new_valid], dim=1)
        if self.mask_kind == "2d":
            return keys.long()
        n = new_valid.shape[1]
        length = self.slot_valid.shape[1]
        causal = torch.arange(length + n, device=self.device)[None, :] <= (length + torch.arange(n, device=self.device))[:, None]
        allowed = keys[:, None, None, :] & causal[None, None]
        # A query slot that is a hole still sees its own row's earlier real tokens (never empty:
        # its position is its row's last real token's, which the window keeps).
        if self.window is None:
            return self._mask_values(allowed)
        key_pos = torch.cat([self.slot_pos, new_pos], dim=1)
        windowed = allowed & ((new_pos[:, :, None] - key_pos[:, None, :]) < self.window)[:, None]
        if not self.window_per_layer_type:
            return self._mask_values(windowed)
        return {"full_attention": self._mask_values(allowed), "sliding_attention": self._mask_values(windowed)}

    def _mask_values(self, allowed: torch.Tensor) -> torch.Tensor:
        """A bool [B, 1, N, L+N] mask in the implementation's form (sdpa: bool, eager: additive)."""
        if self.mask_kind == "bool":
            return allowed
        return torch.zeros((), dtype=self.dtype, device=self.device).masked_fill(~allowed, torch.finfo(self.dtype).min)

    # -- the runner interface --------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, budgets=None,
                max_new_tokens=None, num_draft_tokens=None) -> torch.Tensor:
        """input_ids [B, P], attention_mask [B, P] (left padding) -> logits [B, V] of the last position.
        The sizes a paged runner reserves by (budgets, max_new_tokens, num_draft_tokens) do not
        apply: the DynamicCache grows as it goes (a new one per call)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        # Every layer keeps every slot; a sliding window is in the mask (module docstring). Not
        # DynamicCache(config=): transformers builds evicting sliding layers from any config that
        # carries a sliding_window, even one its model's code ignores (Llama: a shape error in sdpa
        # here, tests/engine/test_sliding_window_rule.py).
        self.cache = self._cache_class()
        mask = attention_mask.to(self.device).long()
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self._forward(input_ids, mask, position_ids)[:, -1]
        self.slot_valid = mask.bool()
        self.slot_pos = position_ids
        self.length = mask.sum(-1)  # real tokens per row: committed + tentative
        self.committed = self.length.clone()
        self.tentative_start = self.slot_valid.shape[1]
        return logits

    def release(self) -> None:
        """After a call: drop the DynamicCache (the next prefill makes a new one)."""
        self.cache = None

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, num_valid: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, N] (only the last num_valid[b] real) -> logits [B, N, V]."""
        n = tokens.shape[1]
        if num_valid is None:
            real = torch.ones(tokens.shape, dtype=torch.bool, device=self.device)
        else:
            real = torch.arange(n, device=self.device)[None, :] >= (n - num_valid)[:, None]
        rank = real.long().cumsum(1)
        position_ids = (self.length[:, None] + rank - 1).clamp(0, self.max_position)
        logits = self._forward(tokens.clamp(min=0).long(), self._mask(real, position_ids), position_ids)
        self.slot_valid = torch.cat([self.slot_valid, real], dim=1)
        self.slot_pos = torch.cat([self.slot_pos, position_ids], dim=1)
        self.length = self.length + rank[:, -1]
        return logits

    def commit(self, keep: torch.Tensor) -> None:
        """Keep the first keep[b] real tentative tokens of each row; the rest become holes."""
        tentative = self.slot_valid[:, self.tentative_start :]
        kept = tentative & (tentative.long().cumsum(1) <= keep[:, None])
        self.slot_valid = torch.cat([self.slot_valid[:, : self.tentative_start], kept], dim=1)
        self.committed = self.committed + kept.long().sum(1)
        self.length = self.committed.clone()
        self.tentative_start = self.slot_valid.shape[1]

    @torch.no_grad()
    def compact(self, max_len_bound: int) -> None:
        """Right-align each row's real slots into max_len_bound slots when holes exceed the slack."""
        length = self.slot_valid.shape[1]
        if self.tentative_start != length or length - max_len_bound < self.compact_slack:
            return
        keep = max(int(max_len_bound), 1)
        # Stable sort puts holes first, real slots after them in their original order.
        order = torch.argsort(self.slot_valid.to(torch.int8), dim=1, stable=True)[:, length - keep :]
        for layer in self.cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, index)
            index = order[:, None, :, None].expand(-1, layer.values.shape[1], -1, layer.values.shape[-1])
            layer.values = layer.values.gather(2, index)
        self.slot_valid = self.slot_valid.gather(1, order)
        self.slot_pos = self.slot_pos.gather(1, order)
        self.tentative_start = keep

    @property
    def cache_len(self) -> int:
        return self.slot_valid.shape[1]
