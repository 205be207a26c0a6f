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
    past it). A criterion that reads scores gets None (it cannot run here: ValueError from it).
"""
import numpy as np
import torch


def split_criteria(criteria):
    """(max_length or None, EOS ids from EosTokenCriteria or None, host criteria list) of a merged
    StoppingCriteriaList-like sequence."""
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
    return max_length, eos, host


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
    checked position up to gen_len (prompt width P at the front) and returns the rows newly
    found finished; ``cut`` [B] holds each row's final length (None: not cut)."""

    def __init__(self, criteria, prompt_width: int, batch: int):
        self.criteria, self.prompt_width, self.batch = list(criteria), prompt_width, batch
        self.checked = np.zeros(batch, dtype=np.int64)  # tokens per row already checked
        self.cut = [None] * batch

    def check(self, seq: np.ndarray, gen_len: np.ndarray) -> list:
        """Rows (indices) found finished in this check (each at its first firing token)."""
        newly = []
        lengths = np.asarray(gen_len[: self.batch])
        while True:
            todo = [b for b in range(self.batch) if self.cut[b] is None and self.checked[b] < lengths[b]]
            if not todo:
                return newly
            step = int(min(self.checked[b] for b in todo)) + 1  # the earliest unchecked position s
            rows = [b for b in todo if self.checked[b] + 1 == step]
            input_ids = torch.from_numpy(np.ascontiguousarray(seq[rows, : self.prompt_width + step]))
            done = torch.zeros(len(rows), dtype=torch.bool)
            for criterion in self.criteria:  # StoppingCriteriaList.__call__: any criterion
                done |= torch.as_tensor(criterion(input_ids, None)).reshape(-1).to(torch.bool).cpu()
            for row, stop in zip(rows, done.tolist()):
                self.checked[row] = step
                if stop:
                    self.cut[row] = step
                    newly.append(row)


STOP_OPTIONS = ("stopping_criteria", "max_time", "stop_strings")
TOKENIZER_NEEDED = ("There are one or more stop strings, either in the arguments to `generate` or in the model's generation "
                    "config, but we could not locate a tokenizer. When generating with stop strings, you must pass the "
                    "model's tokenizer to the `tokenizer` argument of `generate`.")


def call_limits(opts, prompt_width: int, tokenizer=None):
    """(max_new_tokens, EOS ids, host criteria) of a call: transformers' default criteria for its
    options (max length, max_time, stop_strings, EOS) merged with its stopping_criteria, the max
    length and EOS ones turned into the loop's device limits. Without criteria options: the
    options' own max_new_tokens and EOS, no host criteria (nothing built)."""
    extra = opts.extra
    if not any(extra.get(name) for name in STOP_OPTIONS):
        return opts.max_new_tokens, opts.eos_token_ids, []
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
    max_length, eos, host = split_criteria(merge_criteria(defaults, extra.get("stopping_criteria")))
    return max(max_length - prompt_width, 1), eos, host
