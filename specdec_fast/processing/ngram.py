"""no_repeat_ngram_size on the device, per speculative position (transformers'
NoRepeatNGramLogitsProcessor): at a position whose prefix has length L >= n, every n-gram of the
prefix (pads included, as transformers sees input_ids) whose first n - 1 tokens equal the
prefix's last n - 1 tokens bans its last token (-inf). n = 1 bans every token of the prefix.

On the device: the n-grams are the windows of Prefixes.ext (the row's tokens with this
iteration's drafts in place, [B, T + D]); position i of a row keeps the windows that end inside
its prefix (start + n <= length[b, i]) and match its last n - 1 tokens: a [B, N, T + D, n - 1]
comparison, then a scatter_ of True into a ban mask [B, N, V + SPARE] (matches at their token,
the rest spread over SPARE columns past the vocabulary) and one masked_fill_ of the logits, as
transformers does it. Plain stores, no atomics: a scatter_reduce_(amin) straight into the logits
would skip the mask, but on CUDA it is a compare-and-swap loop per entry, and the non-matching
windows (almost all of B * N * T) would pile onto a few addresses. The whole buffer width T is
scanned every call (static shape): O(B * N * T * n) integer compares.

encoder_no_repeat_ngram_size (EncoderNoRepeatNGram; transformers' EncoderNoRepeatNGramLogitsProcessor
as generate builds it for a decoder-only model, from the prompt): the same rule with only the
n-grams that lie inside the prompt (its first P slots, left pads included), P a device scalar
re-filled per call.
"""
from numbers import Integral

import torch

from .prefix import Prefixes

SPARE = 64  # columns past the vocabulary that absorb the non-matching windows' stores


def check_ngram_size(value, name: str = "no_repeat_ngram_size") -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"{name} must be an int >= 0 (0 = off), got {value!r}")
    return int(value)


class NoRepeatNGram:
    def __init__(self, ngram_size: int):
        self.n = check_ngram_size(ngram_size)

    def _window_limit(self, prefixes: Prefixes) -> torch.Tensor:
        """int64 [B, N]: a window counts when start + n is at most this (the position's prefix)."""
        return prefixes.lengths

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        """logits [B, N, V]: banned tokens -inf (in place)."""
        n, vocab = self.n, logits.shape[-1]
        ext = prefixes.ext  # [B, T + D]
        if ext.shape[1] < n:
            return  # no window fits the buffer: no prefix is long enough (static shapes)
        windows = ext.unfold(1, n, 1)  # [B, S, n], S = T + D - n + 1
        starts = torch.arange(windows.shape[1], device=ext.device)
        inside = starts[None, None, :] + n <= self._window_limit(prefixes)[:, :, None]  # [B, N, S]
        query = prefixes.last(n - 1)  # [B, N, n - 1]
        match = (windows[:, None, :, : n - 1] == query[:, :, None, :]).all(-1) & inside  # [B, N, S]
        banned = windows[:, None, :, n - 1].expand_as(match)  # [B, N, S]
        ban = match & (banned >= 0) & (banned < vocab)
        index = torch.where(ban, banned, vocab + starts % SPARE)
        mask = torch.zeros(*logits.shape[:2], vocab + SPARE, dtype=torch.bool, device=logits.device)
        mask.scatter_(2, index, True)
        logits.masked_fill_(mask[..., :vocab], float("-inf"))


class EncoderNoRepeatNGram(NoRepeatNGram):
    """encoder_no_repeat_ngram_size (module docstring): the n-grams of the prompt only."""

    def __init__(self, ngram_size: int, prompt_width: int, device):
        super().__init__(ngram_size)
        self.prompt_width = torch.full((), prompt_width, dtype=torch.long, device=device)  # re-filled per call

    def set_prompt_width(self, prompt_width: int) -> None:
        self.prompt_width.fill_(prompt_width)

    def _window_limit(self, prefixes: Prefixes) -> torch.Tensor:
        return torch.minimum(prefixes.lengths, self.prompt_width)
