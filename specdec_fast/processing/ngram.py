"""no_repeat_ngram_size on the device, per speculative position (transformers'
NoRepeatNGramLogitsProcessor): at a position whose prefix has length L >= n, every n-gram of the
prefix (pads included, as transformers sees input_ids) whose first n - 1 tokens equal the
prefix's last n - 1 tokens bans its last token (-inf). n = 1 bans every token of the prefix.

On the device: the n-grams are the windows of Prefixes.ext (the row's tokens with this
iteration's drafts in place, [B, T + D]); position i of a row keeps the windows that end inside
its prefix (start + n <= length[b, i]) and match its last n - 1 tokens: a [B, N, T + D, n - 1]
comparison, then one scatter_reduce_(amin) of -inf (matches) / +inf (the rest: no change) into
the logits, so only the B * N * (T + D) candidate entries are touched and equal bans collide
harmlessly (amin is order-free). The whole buffer width T is scanned every call (static shape):
O(B * N * T * n) integer compares.
"""
from numbers import Integral

import torch

from .prefix import Prefixes


def check_ngram_size(value) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"no_repeat_ngram_size must be an int >= 0 (0 = off), got {value!r}")
    return int(value)


class NoRepeatNGram:
    def __init__(self, ngram_size: int):
        self.n = check_ngram_size(ngram_size)

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        """logits [B, N, V]: banned tokens -inf (in place)."""
        n, vocab = self.n, logits.shape[-1]
        ext = prefixes.ext  # [B, T + D]
        if ext.shape[1] < n:
            return  # no window fits the buffer: no prefix is long enough (static shapes)
        windows = ext.unfold(1, n, 1)  # [B, S, n], S = T + D - n + 1
        starts = torch.arange(windows.shape[1], device=ext.device)
        inside = starts[None, None, :] + n <= prefixes.lengths[:, :, None]  # [B, N, S]
        query = prefixes.last(n - 1)  # [B, N, n - 1]
        match = (windows[:, None, :, : n - 1] == query[:, :, None, :]).all(-1) & inside  # [B, N, S]
        banned = windows[:, None, :, n - 1].expand_as(match)  # [B, N, S]
        in_vocab = (banned >= 0) & (banned < vocab)
        index = torch.where(in_vocab, banned, 0)
        value = torch.where(match & in_vocab, float("-inf"), float("inf")).to(logits.dtype)
        logits.scatter_reduce_(2, index, value, "amin")
