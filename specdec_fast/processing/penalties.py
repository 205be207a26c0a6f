"""Repetition, frequency and presence penalties per speculative position, in plain torch.

The verify kernels apply repetition_penalty fused (another path); this is the in-order version
that the eager pipeline needs when something must run after the penalty and before the kernel
(a user's logits processor, typical_p / epsilon / eta: LogitsProcessing decides), and the
oracle of the fused one.

    repetition_penalty  transformers' RepetitionPenaltyLogitsProcessor as generate() builds it:
                        every token of the prefix from ``start`` (generate passes the left-pad
                        count of the attention mask as prompt_ignore_length, so pads do not count;
                        start=None counts from 0, pads included, the processor's own default),
                        each at most once: logit < 0 -> logit * p, else logit / p
    frequency_penalty   vLLM's: logit -= f * count, count = occurrences among the generated tokens
    presence_penalty    vLLM's: logit -= p * (count > 0)        (after frequency, as vLLM)
                        where the generated tokens are prefix[P:] (this iteration's drafts included)

Device-side and sync-free, but not cheap: counts [B, N, V] int32 by scatter_add_ and float32
[B, N, V] passes; logits of another dtype are processed in float32 and rounded once.
"""
import math
from numbers import Real

import torch

from .prefix import Prefixes


def check_penalties(repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0) -> tuple:
    """-> (repetition, frequency, presence) as floats; ValueError naming a bad one."""
    for name, value in (("repetition_penalty", repetition_penalty), ("frequency_penalty", frequency_penalty),
                        ("presence_penalty", presence_penalty)):
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {repetition_penalty!r}")
    for name, value in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
        if not -2 <= value <= 2:  # vLLM's range
            raise ValueError(f"{name} must be in [-2, 2] (0 = off), got {value!r}")
    return float(repetition_penalty), float(frequency_penalty), float(presence_penalty)


def token_counts(prefixes: Prefixes, begin: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [B, N, V]: how often each token occurs in prefix[begin[b] : length[b, i]] of every
    position (begin int64 [B]). Out-of-vocabulary ids and padded drafts count nowhere."""
    ext, end, drafts = prefixes.ext, prefixes.end, prefixes.drafts
    batch, width = ext.shape
    n, dev = prefixes.n, ext.device
    j = torch.arange(width, device=dev)[None, :]
    in_seq = (j >= begin[:, None]) & (j < end[:, None]) & (ext >= 0) & (ext < vocab_size)  # [B, T + D]
    # Slots outside the range add 0 to some column, spread by their index (j % V): no spare
    # column, and on CUDA (an atomic add each) no pile-up of most of a long buffer on one address.
    base = torch.zeros(batch, vocab_size, dtype=torch.int32, device=dev)
    base.scatter_add_(1, torch.where(in_seq, ext, j % vocab_size), in_seq.to(torch.int32))
    counts = base[:, None, :].repeat(1, n, 1)  # [B, N, V]
    num_drafts = drafts.shape[1]
    if num_drafts:
        d = torch.arange(num_drafts, device=dev)
        seen = d[None, None, :] < (prefixes.first + prefixes.positions)[None, :, None]  # [1, N, D]
        real = (drafts >= 0) & (drafts < vocab_size) & (end[:, None] + d[None, :] >= begin[:, None])  # [B, D]
        counted = seen & real[:, None, :]  # [B, N, D]
        index = torch.where(counted, drafts[:, None, :], d % vocab_size)
        counts.scatter_add_(2, index, counted.to(torch.int32))
    return counts


def apply_penalties_(logits: torch.Tensor, prefixes: Prefixes, *, prompt_width: int, repetition_penalty: float = 1.0,
                     frequency_penalty: float = 0.0, presence_penalty: float = 0.0, start=None) -> None:
    """logits [B, N, V] penalised in place (module docstring); start int64 [B] or None (0)."""
    repetition_penalty, frequency_penalty, presence_penalty = check_penalties(
        repetition_penalty, frequency_penalty, presence_penalty)
    vocab, batch, dev = logits.shape[-1], logits.shape[0], logits.device
    x = logits.float()
    if repetition_penalty != 1.0:
        begin = torch.zeros(batch, dtype=torch.long, device=dev) if start is None else start.long()
        seen = (token_counts(prefixes, begin, vocab) > 0).float()
        # x * p where seen and x < 0, x / p where seen and x >= 0, else x: as x * f1 / f2 with
        # f = m * p + (1 - m), m in {0, 1}: exactly p or 1, so the result is bit-for-bit
        # transformers' where(x < 0, x * p, x / p). Not torch.where: a bool-masked select runs
        # ~45x slower than a float multiply on the CPU here (4.6 ms vs 0.1 ms on [8, 5, 32000]).
        below = seen * (x < 0).float()
        above = seen - below
        x = x * (below * repetition_penalty + (1 - below)) / (above * repetition_penalty + (1 - above))
    if frequency_penalty != 0.0 or presence_penalty != 0.0:
        begin = torch.full((batch,), prompt_width, dtype=torch.long, device=dev)
        counts = token_counts(prefixes, begin, vocab).float()  # float once: int32 * float ran ~10x slower
        if frequency_penalty != 0.0:
            x = x - frequency_penalty * counts
        if presence_penalty != 0.0:
            x = x - presence_penalty * (counts > 0).float()
    logits.copy_(x)
