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
  - every other criterion (MaxTime, StopString, a user's own) runs on the host as transformers
    calls it: once per step s, with every row, input_ids [B, P + s] (all rows share the
    left-padded prompt width P; a row that ended before s holds pads after its end, as
    transformers feeds it), once every unfinished row has made its s-th token; a criterion's
    answer, per row or one bool for the batch, applies to every row. (Found by the options
    fuzzing round: criteria were called per step with only the rows that had reached it, so one
    that judged the batch -- `bool((input_ids[:, -1] == x).any())` -- decided on part of it.)
    The tokens come from the host copy of the token buffer that the loop's polls already make
    (run_ahead.py: the whole buffer when criteria run, instead of row 0 for a streamer), so no
    sync is added: a row found finished at token s is cut there (the tokens the device made after
    it are dropped, pad after) and marked finished on the device, so it is fed nothing from the
    next iteration on (at most R - 1 iterations run past it). Without an EOS criterion
    transformers pads nothing and runs every row until all are done: then so does this
    (HostStops); speculation moves rows at different speeds, but a step is checked only once
    every row has made it, so when the last row is done at step T every row holds T tokens
    (those past T are cut).
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

    check(seq [R, T] numpy int64, gen_len [R] numpy, live [R] numpy or None) runs the criteria
    at every step s that every unfinished row has reached (live: 1 while a row may still grow,
    None: none may), with all B rows as transformers calls them, and returns the rows to mark
    finished on the device.

    What a row that a criterion ends looks like follows transformers' _sample: with an EOS
    criterion in the list (pad_after: one with an eos_token_id attribute) the row is padded after
    that token; without one, transformers keeps generating every row until all are done, so the
    row goes on (not finished) and every row ends at the step where the last one was done.
    ``lengths(gen_len)`` gives the rows' final lengths."""

    def __init__(self, criteria, prompt_width: int, batch: int, pad_after: bool = True, scores_expected: bool = False,
                 pad_token_id: int = 0):
        self.criteria, self.prompt_width, self.batch = list(criteria), prompt_width, batch
        self.pad_after, self.pad_token_id = pad_after, pad_token_id
        self.scores = ScoresAfterTheLoop() if scores_expected else None  # what transformers would pass
        self.step = 0  # the steps checked so far (every row at once)
        self.done = [None] * batch  # the step (generated length) at which each row was done

    @property
    def all_done(self) -> bool:
        return None not in self.done

    def check(self, seq: np.ndarray, gen_len: np.ndarray, live=None) -> list:
        """Rows (indices) to mark finished now (pad_after: each at its first firing step)."""
        newly = []
        lengths = np.asarray(gen_len[: self.batch])
        growing = np.zeros(self.batch, dtype=bool) if live is None else np.asarray(live[: self.batch]) != 0
        while not self.all_done:
            step = self.step + 1
            # A row's length at this step is final when it ended before it (its tokens: pads after).
            ended = [lengths[b] < step and not growing[b] or (self.pad_after and self.done[b] is not None)
                     for b in range(self.batch)]
            if all(ended):  # transformers' loop stopped at the step every row ended
                break
            if any(lengths[b] < step for b in range(self.batch) if not ended[b]):
                break  # a row that goes on has not made this step's token yet: at a later poll
            input_ids = np.array(seq[: self.batch, : self.prompt_width + step])
            for b in range(self.batch):
                end = self.prompt_width + (self.done[b] if self.pad_after and self.done[b] is not None else lengths[b])
                input_ids[b, end:] = self.pad_token_id  # a row that ended before this step, as transformers pads it
            input_ids = torch.from_numpy(input_ids)
            stop = torch.zeros(self.batch, dtype=torch.bool)
            for criterion in self.criteria:  # StoppingCriteriaList.__call__: any criterion (one bool: every row)
                stop |= torch.as_tensor(criterion(input_ids, self.scores)).reshape(-1).to(torch.bool).cpu()
            for row, fired in enumerate(stop.tolist()):
                if fired and self.done[row] is None and not ended[row]:
                    self.done[row] = step
                    newly.append(row)
            self.step = step
        return newly if self.pad_after else []

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

    def stops(self, prompt_width: int, batch: int, pad_token_id: int = 0):
        return (HostStops(self.host, prompt_width, batch, self.pad_after, self.scores_expected, pad_token_id)
                if self.host else None)


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
