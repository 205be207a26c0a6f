"""Stopping criteria as transformers' generate() applies them, at the exact token where they fire.

transformers builds MaxLengthCriteria (max_length), MaxTimeCriteria (max_time), StopStringCriteria
(stop_strings, with the tokenizer) and EosTokenCriteria (eos_token_id), then merges the user's
stopping_criteria in: a user criterion of a built-in's exact class takes its place, the others
follow (GenerationMixin._get_stopping_criteria / _merge_criteria_processor_list). A row ends at
the first step where the list says so, and is padded after it.

Speculation emits several tokens per row per iteration, so the criteria must see every prefix in
turn. Here:
  - MaxLengthCriteria and EosTokenCriteria (theirs or the user's) become the loop's own device
    limits: max_new_tokens = max_length - prompt width, and the EOS ids (exact per token, no host
    work: engine/loop.py's append);
  - every other criterion (MaxTime, StopString, a user's own) runs on the host, batched as
    transformers calls it, once per step position: for position s the rows that emitted their
    s-th token since the last check, input_ids = their first P + s tokens [n, P + s] (all rows
    share the left-padded prompt width P), scores None. The tokens come from the host copy of the
    token buffer that the loop's polls already make (run_ahead.py: the whole buffer when criteria
    run, instead of row 0 for a streamer), so no sync is added: a row found finished at token s
    is cut there (the tokens the device made after it are dropped, pad after) and marked finished
    on the device, so it is fed nothing from the next iteration on (at most R - 1 iterations run
    past it). Without an EOS criterion transformers pads nothing and runs every row until all are
    done: then so does this (HostStops), and since speculation moves rows at different speeds,
    rows that are short of the step where the last row was done run on to exactly that step
    (loop.py _all_at_final_length: their max_new_tokens lowered to it).
  - scores: transformers passes None, unless return_dict_in_generate and output_scores, when it
    passes the tuple of the steps' processed scores so far. The loop has no such tuple (the
    scores are computed after it: outputs.py), so there the criteria get ScoresAfterTheLoop: a
    criterion that never reads it runs as it would; one that reads it raises an
    UnsupportedOptionError, which patch_generate hands to transformers. (Found by the options
    fuzzing round on the hf runner's families: a confidence criterion reading scores[-1] was
    given None, stopped nowhere, and the tokens ran past transformers'.)
"""
from dataclasses import dataclass

import numpy as np
import torch


class ScoresAfterTheLoop:
    """What a host criterion gets as ``scores`` where transformers would pass the tuple of the
    processed scores so far (output_scores with return_dict_in_generate): any read of it raises
    an UnsupportedOptionError naming why (module docstring)."""

    def _refuse(self, *args, **kwargs):
        from ..options.rules import UnsupportedOptionError

        raise UnsupportedOptionError(
            "a stopping criterion read `scores` (with output_scores=True transformers passes it the processed scores "
            "of the steps so far), which speculative decoding computes only after its loop: drop output_scores from "
            "this call, or run it on transformers' generate (patch_generate does so by itself)")

    __getitem__ = __len__ = __iter__ = __bool__ = __getattr__ = _refuse


def split_criteria(criteria):
    """(max_length or None, EOS ids from EosTokenCriteria or None, host criteria list, pad_after)
    of a merged StoppingCriteriaList-like sequence; pad_after: transformers' has_eos_stopping_criteria
    (some criterion has an eos_token_id attribute: rows are padded after they end)."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    max_length, eos, host = None, None, []
    for criterion in criteria or ():
        if type(criterion) is MaxLengthCriteria:
            max_length = int(criterion.max_length) if max_length is None else min(max_length, int(criterion.max_length))
        elif type(criterion) is EosTokenCriteria:
            ids = criterion.eos_token_id.reshape(-1).tolist()
            eos = ids if eos is None else eos + ids
        else:
            host.append(criterion)
    pad_after = any(hasattr(criterion, "eos_token_id") for criterion in criteria or ())
    return max_length, eos, host, pad_after


def merge_criteria(defaults: list, custom) -> list:
    """transformers' _merge_criteria_processor_list: a custom criterion of a default's exact type
    replaces it; the other custom ones follow, in order."""
    custom = list(custom or ())
    merged = []
    for default in defaults:
        replacement = next((c for c in custom if type(c) is type(default)), None)
        merged.append(default if replacement is None else replacement)
    merged += [c for c in custom if not any(c is m for m in merged)]
    return merged


class HostStops:
    """The host-side criteria of one call over its R rows (B real ones).

    check(seq [R, T] numpy int64, gen_len [R] numpy) reads each real row's tokens from its last
    checked position up to gen_len (prompt width P at the front), in transformers' batches (one
    call per step position), and returns the rows to mark finished on the device.

    What a row that a criterion ends looks like follows transformers' _sample: with an EOS
    criterion in the list (pad_after: one with an eos_token_id attribute) the row is padded after
    that token; without one, transformers keeps generating every row until all are done, so the
    row goes on (not finished) and every row ends at the step where the last one was done.
    ``lengths(gen_len)`` gives the rows' final lengths."""

    def __init__(self, criteria, prompt_width: int, batch: int, pad_after: bool = True, scores_expected: bool = False):
        self.criteria, self.prompt_width, self.batch = list(criteria), prompt_width, batch
        self.pad_after = pad_after
        self.scores = ScoresAfterTheLoop() if scores_expected else None  # what transformers would pass
        self.checked = np.zeros(batch, dtype=np.int64)  # tokens per row already checked
        self.done = [None] * batch  # the step (generated length) at which each row was done

    @property
    def all_done(self) -> bool:
        return None not in self.done

    def check(self, seq: np.ndarray, gen_len: np.ndarray) -> list:
        """Rows (indices) to mark finished now (pad_after: each at its first firing token)."""
        newly = []
        lengths = np.asarray(gen_len[: self.batch])
        while True:
            todo = [b for b in range(self.batch) if self.done[b] is None and self.checked[b] < lengths[b]]
            if not todo:
                return newly if self.pad_after else []
            step = int(min(self.checked[b] for b in todo)) + 1  # the earliest unchecked position s
            rows = [b for b in todo if self.checked[b] + 1 == step]
            input_ids = torch.from_numpy(np.ascontiguousarray(seq[rows, : self.prompt_width + step]))
            done = torch.zeros(len(rows), dtype=torch.bool)
            for criterion in self.criteria:  # StoppingCriteriaList.__call__: any criterion
                done |= torch.as_tensor(criterion(input_ids, self.scores)).reshape(-1).to(torch.bool).cpu()
            for row, stop in zip(rows, done.tolist()):
                self.checked[row] = step
                if stop:
                    self.done[row] = step
                    newly.append(row)

    def length(self, row: int, gen_len: int) -> int:
        """Row ``row``'s final length given its generated length on the device."""
        if self.pad_after:
            return gen_len if self.done[row] is None else min(gen_len, self.done[row])
        return min(gen_len, max(self.done)) if self.all_done else gen_len


STOP_OPTIONS = ("stopping_criteria", "max_time", "stop_strings")
TOKENIZER_NEEDED = ("There are one or more stop strings, either in the arguments to `generate` or in the model's generation "
                    "config, but we could not locate a tokenizer. When generating with stop strings, you must pass the "
                    "model's tokenizer to the `tokenizer` argument of `generate`.")


@dataclass
class CallLimits:
    """A call's stopping, as the loop takes it: max_new_tokens, EOS ids (device limits), the
    host-side criteria and whether rows they end are padded after (HostStops)."""

    max_new_tokens: int
    eos_token_ids: list | None
    host: list
    pad_after: bool = True
    scores_expected: bool = False  # transformers would pass the criteria the scores so far

    def stops(self, prompt_width: int, batch: int):
        return HostStops(self.host, prompt_width, batch, self.pad_after, self.scores_expected) if self.host else None


def call_limits(opts, prompt_width: int, tokenizer=None) -> CallLimits:
    """A call's CallLimits: transformers' default criteria for its options (max length, max_time,
    stop_strings, EOS) merged with its stopping_criteria, the max length and EOS ones turned into
    the loop's device limits. Without criteria options: the options' own max_new_tokens and EOS,
    no host criteria (nothing built)."""
    extra = opts.extra
    if not any(extra.get(name) for name in STOP_OPTIONS):
        return CallLimits(opts.max_new_tokens, opts.eos_token_ids, [])
    from transformers.generation.stopping_criteria import (EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria,
                                                           StopStringCriteria)

    defaults = [MaxLengthCriteria(prompt_width + opts.max_new_tokens)]
    if extra.get("max_time") is not None:
        defaults.append(MaxTimeCriteria(max_time=extra["max_time"]))
    if extra.get("stop_strings") is not None:
        if tokenizer is None:
            raise ValueError(TOKENIZER_NEEDED)
        defaults.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=extra["stop_strings"]))
    if opts.eos_token_ids:
        defaults.append(EosTokenCriteria(eos_token_id=torch.tensor(opts.eos_token_ids)))
    max_length, eos, host, pad_after = split_criteria(merge_criteria(defaults, extra.get("stopping_criteria")))
    scores_expected = bool(extra.get("return_dict_in_generate") and extra.get("output_scores"))
    return CallLimits(max(max_length - prompt_width, 1), eos, host, pad_after, scores_expected)
