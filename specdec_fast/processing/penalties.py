"""Repetition, frequency and presence penalties per speculative position, in plain torch.

A verify kernel may apply the penalties fused (LogitsProcessing's fused_penalties); this is the
in-order version, which LogitsProcessing runs by default and whenever something must run after
the penalty and before the kernel (a user's logits processor, typical_p / epsilon / eta), and
the oracle of a fused one.

    repetition_penalty  transformers' RepetitionPenaltyLogitsProcessor as generate() builds it:
                        every token of the prefix from ``start`` (generate passes the left-pad
                        count of the attention mask as prompt_ignore_length, so pads do not count;
                        start=None counts from 0, pads included, the processor's own default),
                        each at most once: logit < 0 -> logit * p, else logit / p. Which of the two
                        generate() does depends on the installed transformers (5.23+ skip the pads,
                        5.4-5.22 count them): generate_skips_prompt_pads() says, and the engine follows it.
    frequency_penalty   vLLM's: logit -= f * count, count = occurrences among the generated tokens
    presence_penalty    vLLM's: logit -= p * (count > 0)        (after frequency, as vLLM)
                        where the generated tokens are prefix[P:] (this iteration's drafts included)

Sparse, like transformers' gather / scatter: only the columns of the row's tokens change, so
apply_penalties_ gathers the logits at the W = T + D token slots of the row for every position,
computes each slot's new value from that column's counts at that position (the prompt / generated
part: a [B, V] scatter_add_ shared by the N positions; the drafts: a [B, N, W, D] compare) and
scatters the values back. Slots outside a position's range (or holding a padded draft) write
their column's own new value too, so every write to a column is the same value: no races, no
[B, N, V] temporary. Measured on the CPU (1 thread, B = 8, N = 5, V = 32000, W = 1030): the dense
form (counts [B, N, V], factor tensors) took 30 ms, mostly allocating and faulting in fresh
[B, N, V] float32 temporaries; this one 1.3 ms (0.3 ms at B = 1; bench/bench_processing.py).
token_counts (dense) stays as the test oracle. Logits of another dtype are processed in float32
and rounded once.
"""
import functools
import inspect
import math
from numbers import Real

import torch

from .prefix import Prefixes


@functools.lru_cache(maxsize=None)
def generate_skips_prompt_pads() -> bool:
    """Whether the installed transformers' generate() keeps a prompt's left pads out of the repetition
    penalty (it passes the attention mask's pad count as prompt_ignore_length: transformers 5.23+
    does, 5.22 and earlier do not and penalise the pad token like any other). Read from the source of the
    method that builds the processors, so the engine's tokens equal that version's generate()."""
    try:
        from transformers.generation.utils import GenerationMixin

        return "prompt_ignore_length" in inspect.getsource(GenerationMixin._get_logits_processor)
    except (ImportError, AttributeError, OSError, TypeError):  # no source to read: the newer rule
        return True


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


def _prefix_counts(prefixes: Prefixes, begin: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [B / group, V]: occurrences of each token in seq[b, begin[b] : end[b]] (no drafts), once
    per group of rows (Prefixes.group: the rows of a group share seq, end and begin)."""
    group = prefixes.group
    ext, end, begin = prefixes.ext[::group], prefixes.end[::group], begin[::group]
    j = torch.arange(ext.shape[1], device=ext.device)[None, :]
    in_range = (j >= begin[:, None]) & (j < end[:, None]) & (ext >= 0) & (ext < vocab_size)  # [B, W]
    # Slots outside the range add 0 to some column, spread by their index (j % V): no spare
    # column, and on CUDA (an atomic add each) no pile-up of most of a long buffer on one address.
    counts = torch.zeros(ext.shape[0], vocab_size, dtype=torch.int32, device=ext.device)
    counts.scatter_add_(1, torch.where(in_range, ext, j % vocab_size), in_range.to(torch.int32))
    return counts


def _counted_drafts(prefixes: Prefixes, begin: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [B, N, D]: draft d is in position i's prefix, in the vocabulary and at or after begin."""
    drafts, end = prefixes.drafts, prefixes.end
    d = torch.arange(drafts.shape[1], device=drafts.device)
    seen = d[None, None, :] < prefixes.seen[:, :, None]  # [B, N, D]
    real = (drafts >= 0) & (drafts < vocab_size) & (end[:, None] + d[None, :] >= begin[:, None])  # [B, D]
    return seen & real[:, None, :]


def token_counts(prefixes: Prefixes, begin: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [B, N, V] (dense): how often each token occurs in prefix[begin[b] : length[b, i]] of
    every position (begin int64 [B]). Out-of-vocabulary ids and padded drafts count nowhere."""
    counts = _prefix_counts(prefixes, begin, vocab_size).repeat_interleave(prefixes.group, 0)  # [B, V]
    counts = counts[:, None, :].repeat(1, prefixes.n, 1)  # [B, N, V]
    drafts = prefixes.drafts
    if drafts.shape[1]:
        counted = _counted_drafts(prefixes, begin, vocab_size)
        spread = torch.arange(drafts.shape[1], device=drafts.device) % vocab_size
        counts.scatter_add_(2, torch.where(counted, drafts[:, None, :], spread), counted.to(torch.int32))
    return counts


def column_counts(prefixes: Prefixes, begin: torch.Tensor, columns: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [B, N, W]: token_counts at columns [B, W] (values in [0, V)), without [B, N, V] (nor
    [B, V] for a group's rows: one [B / group, V] count gathered at the group's columns)."""
    rows, width = columns.shape
    shared = _prefix_counts(prefixes, begin, vocab_size)  # [B / group, V]
    counts = shared.gather(1, columns.reshape(shared.shape[0], -1)).reshape(rows, 1, width)  # [B, 1, W]
    drafts = prefixes.drafts
    if not drafts.shape[1]:
        return counts.expand(-1, prefixes.n, -1)
    counted = _counted_drafts(prefixes, begin, vocab_size)  # [B, N, D]
    hits = (columns[:, None, :, None] == drafts[:, None, None, :]) & counted[:, :, None, :]  # [B, N, W, D]
    return counts + hits.sum(-1, dtype=torch.int32)


def apply_penalties_(logits: torch.Tensor, prefixes: Prefixes, *, prompt_width, repetition_penalty: float = 1.0,
                     frequency_penalty: float = 0.0, presence_penalty: float = 0.0, start=None) -> None:
    """logits [B, N, V] penalised in place (module docstring); prompt_width: P, an int or an int64
    device tensor (0-dim: one value for a call that graphs replay); start int64 [B] or None (0)."""
    repetition_penalty, frequency_penalty, presence_penalty = check_penalties(
        repetition_penalty, frequency_penalty, presence_penalty)
    batch, n, vocab = logits.shape
    dev = logits.device
    columns = prefixes.ext.clamp(0, vocab - 1)  # [B, W]: every column a row's slots can name
    index = columns[:, None, :].expand(batch, n, -1)  # [B, N, W]
    x = logits.gather(2, index).float()
    if repetition_penalty != 1.0:
        begin = torch.zeros(batch, dtype=torch.long, device=dev) if start is None else start.long()
        seen = column_counts(prefixes, begin, columns, vocab) > 0
        x = torch.where(seen, torch.where(x < 0, x * repetition_penalty, x / repetition_penalty), x)
    if frequency_penalty != 0.0 or presence_penalty != 0.0:
        begin = prompt_width.long().expand(batch) if isinstance(prompt_width, torch.Tensor) else \
            torch.full((batch,), prompt_width, dtype=torch.long, device=dev)
        counts = column_counts(prefixes, begin, columns, vocab).float()
        if frequency_penalty != 0.0:
            x = x - frequency_penalty * counts
        if presence_penalty != 0.0:
            x = x - presence_penalty * (counts > 0).float()
    logits.scatter_(2, index, x.to(logits.dtype))
