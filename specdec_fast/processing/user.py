"""A user's own logits processors (generate(logits_processor=LogitsProcessorList([...]))), run
eagerly: per row and per position, with the exact input_ids [1, length] transformers would pass
at that step (the row's prefix, pads included, ++ the drafts the position sees) and a float32
copy of that position's logits [1, V] (transformers processes a float32 copy), the result
written back.

Slow and not graph safe by nature: one host read of the lengths and drafts per call, then
B * N Python calls of user code. Positions whose prefix holds a padded draft (-1) are skipped
(never emitted). Two differences from transformers that no per-position scheme avoids: a
processor is called with batch 1 (rows differ in length, so they cannot be stacked as
transformers' left-aligned batch is), and it is also called for drafts that will be rejected
(a stateful processor counts more calls than transformers makes).
"""
import torch

from .prefix import Prefixes

GRAPH_NOTE = ("a user logits_processor runs eagerly on the host per row and position (exact input_ids), "
              "which a CUDA graph cannot replay")


def _check_arity(processor) -> None:
    """transformers' LogitsProcessorList passes extra kwargs only to processors that take more
    than (input_ids, scores), and generate() passes none: such a processor raises there."""
    import inspect

    args = inspect.signature(processor.__call__).parameters
    if len(args) > 2:
        raise ValueError(f"logits_processor {type(processor).__name__} takes arguments {list(args)[2:]} beyond "
                         "(input_ids, scores), which generate() does not pass")


class UserProcessors:
    """processors: callables (input_ids [1, L] int64, scores [1, V] float32) -> scores [1, V]."""

    graph_safe = False
    graph_note = GRAPH_NOTE

    def __init__(self, processors):
        self.processors = list(processors)
        for p in self.processors:
            if not callable(p):
                raise ValueError(f"logits_processor entries must be callable LogitsProcessors, got {p!r}")
            _check_arity(p)

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        """logits [B, N, V]: every real position processed in place (host loop)."""
        for b, i, input_ids in positions(prefixes):
            scores = logits[b, i][None, :].float()
            for processor in self.processors:  # LogitsProcessorList.__call__, as _sample calls it
                scores = processor(input_ids[None, :], scores)
            logits[b, i] = scores[0]


def positions(prefixes: Prefixes, rows: int | None = None):
    """(b, i, input_ids [L] int64) for every position i of rows b < rows (None: all; a tree's rows
    come in groups: rows * group of them) whose prefix holds no padded draft: the exact input_ids
    transformers would pass there. One host read."""
    ends, drafts, seen = prefixes.end.tolist(), prefixes.drafts.tolist(), prefixes.seen.tolist()
    seq, drafts_dev = prefixes.seq.long(), prefixes.drafts
    for b, end in enumerate(ends[: None if rows is None else rows * prefixes.group]):
        for i in range(prefixes.n):
            if any(t < 0 for t in drafts[b][: seen[b][i]]):
                break  # padded draft: this and later positions are never emitted
            yield b, i, torch.cat([seq[b, :end], drafts_dev[b, : seen[b][i]]])


class PrefixAllowedTokens:
    """generate(prefix_allowed_tokens_fn=fn): transformers' PrefixConstrainedLogitsProcessor in its
    slot. At each position fn(batch_id, input_ids [L]) -> the allowed token ids; every other logit
    -inf (transformers adds a 0 / -inf mask). batch_id = row // num_return_sequences (transformers
    groups the expanded rows so). Eager like the user's processors (a host call per row and
    position, drafts that will be rejected included); rows >= set_rows' count (a decoder's unused
    rows) are not asked."""

    graph_safe = False
    graph_note = ("prefix_allowed_tokens_fn runs on the host per row and position (exact input_ids), which a "
                  "CUDA graph cannot replay")

    def __init__(self, fn, num_return_sequences: int = 1):
        if not callable(fn):
            raise ValueError(f"prefix_allowed_tokens_fn must be callable (batch_id, input_ids) -> token ids, "
                             f"got {fn!r}")
        if (isinstance(num_return_sequences, bool) or not isinstance(num_return_sequences, int)
                or num_return_sequences < 1):
            raise ValueError(f"num_return_sequences must be an int >= 1, got {num_return_sequences!r}")
        self.fn, self.group, self.rows = fn, num_return_sequences, None

    def set_rows(self, rows: int) -> None:
        self.rows = rows

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        for b, i, input_ids in positions(prefixes, self.rows):
            batch_id = b // prefixes.group // self.group  # a tree's node rows: prefixes.group a row
            allowed = self.fn(batch_id, input_ids)
            if len(allowed) == 0:  # transformers' message
                raise ValueError(f"`prefix_allowed_tokens_fn` returned an empty list for batch ID {batch_id}. "
                                 "This means that the constraint is unsatisfiable. Please check your implementation of "
                                 "`prefix_allowed_tokens_fn` ")
            # index_fill_ of one index tensor: 304 against 518 us for transformers' mask[allowed] = 0 with a
            # list of 4095 ids (the demo vocabulary), the same values (negative ids wrap alike)
            index = torch.as_tensor(allowed, dtype=torch.long, device=logits.device)
            logits[b, i] += torch.full_like(logits[b, i], float("-inf")).index_fill_(0, index, 0)
