"""Token masks that depend on the prefix length only (or on nothing), per speculative position:
min_length / min_new_tokens (EOS -inf while the prefix is too short), suppress_tokens (always
-inf), begin_suppress_tokens (-inf at the first generated position only), forced_bos_token_id /
forced_eos_token_id (every other token -inf at one length), remove_invalid_values (NaN and
+-inf to finite values), exponential_decay_length_penalty (EOS raised by a factor that grows
with the length). transformers' MinLengthLogitsProcessor,
MinNewTokensLengthLogitsProcessor, SuppressTokensLogitsProcessor,
SuppressTokensAtBeginLogitsProcessor, ForcedBOSTokenLogitsProcessor,
ForcedEOSTokenLogitsProcessor, InfNanRemoveLogitsProcessor, ExponentialDecayLengthPenalty.

transformers' counting, with L = a position's prefix length (input_ids.shape[-1]) and P the
prompt width (pads included; input_ids_seq_length):
    min_length      EOS banned while L < min_length (the prompt counts, pads included)
    min_new_tokens  EOS banned while L - P < min_new_tokens
    begin_suppress  banned when L == begin_index = P (P + 1 when P == 1 and forced_bos_token_id is
                    set), i.e. at the first generated token of every row
    forced_bos      only the token allowed (logit 0) when L == 1: a one-token prompt's first new token
    forced_eos      only EOS allowed (logit 0) when L == max_length - 1 = P + max_new_tokens - 1:
                    the last token a row can generate
    exponential     EOS logit s -> s + |s| (factor^(L - start - P) - 1) when L > start + P
Token ids outside [0, V) are ignored (transformers' torch.isin over the vocabulary), except the
forced ones: a forced id outside the vocabulary raises (transformers' indexing would).

On the device: each touches its token columns only (index_fill_ / index_copy_ of a where over
[B, N, E]), never a [B, N, V] pass, but for the forced tokens' fill (a masked_fill_ over [B, N, V]
where the length hits); the length test is a [B, N] compare, no host read.
"""
from numbers import Integral, Real

import torch

from .prefix import Prefixes


def token_list(value, name: str) -> list:
    """A list of token ids (ints; any value: out-of-vocabulary ids are ignored, as transformers does)."""
    if isinstance(value, (bool, str)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a list of token ids, got {value!r}")
    ids = list(value.tolist() if isinstance(value, torch.Tensor) else value)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, Integral):
            raise ValueError(f"{name} must be a list of int token ids, got {value!r}")
    return [int(t) for t in ids]


def nonnegative_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def _columns(ids, vocab_size: int, device) -> torch.Tensor:
    return torch.tensor(sorted({t for t in ids if 0 <= t < vocab_size}), dtype=torch.long, device=device)


class SuppressTokens:
    """ids -inf at every position."""

    def __init__(self, ids, vocab_size: int, device):
        self.ids = _columns(ids, vocab_size, device)

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        logits.index_fill_(2, self.ids, float("-inf"))


class LengthMask:
    """ids -inf at the positions whose prefix length L satisfies ``L < threshold`` (kind "below")
    or ``L == threshold`` (kind "equal"). threshold_of(P, max_new_tokens) -> int gives the
    threshold for a call's prompt width P and max_new_tokens (None where no caller gives it); it is
    kept in a device tensor that set_prompt_width / set_max_new_tokens re-fill in place, so one mask
    (and a CUDA graph that captured it) serves calls of any prompt width and length."""

    def __init__(self, ids, threshold_of, kind: str, vocab_size: int, device, prompt_width: int,
                 max_new_tokens: int | None = None):
        if kind not in ("below", "equal"):
            raise ValueError(f"kind must be 'below' or 'equal', got {kind!r}")
        self.ids, self.kind, self.threshold_of = _columns(ids, vocab_size, device), kind, threshold_of
        self.threshold = torch.zeros((), dtype=torch.long, device=device)
        self.prompt_width, self.max_new_tokens = prompt_width, max_new_tokens
        self._refill()

    def _refill(self) -> None:
        self.threshold.fill_(int(self.threshold_of(self.prompt_width, self.max_new_tokens)))

    def set_prompt_width(self, prompt_width: int) -> None:
        self.prompt_width = prompt_width
        self._refill()

    def set_max_new_tokens(self, max_new_tokens: int) -> None:
        self.max_new_tokens = max_new_tokens
        self._refill()

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        lengths = prefixes.lengths  # [B, N]
        hit = lengths < self.threshold if self.kind == "below" else lengths == self.threshold
        columns = logits.index_select(2, self.ids)  # [B, N, E]
        logits.index_copy_(2, self.ids, torch.where(hit[:, :, None], float("-inf"), columns))


def min_length_mask(eos_ids, min_length: int, vocab_size: int, device, prompt_width: int = 0) -> LengthMask:
    """MinLengthLogitsProcessor(min_length, eos): an absolute length (the prompt counts)."""
    return LengthMask(eos_ids, lambda width, new: min_length, "below", vocab_size, device, prompt_width)


def min_new_tokens_mask(eos_ids, prompt_width: int, min_new_tokens: int, vocab_size: int, device) -> LengthMask:
    """MinNewTokensLengthLogitsProcessor(P, min_new_tokens, eos): L - P < min_new <=> L < P + min_new."""
    return LengthMask(eos_ids, lambda width, new: width + min_new_tokens, "below", vocab_size, device, prompt_width)


def begin_index(prompt_width: int, forced_bos_token_id=None) -> int:
    """transformers' begin_index of SuppressTokensAtBeginLogitsProcessor (generation/utils.py)."""
    return prompt_width if (prompt_width > 1 or forced_bos_token_id is None) else prompt_width + 1


def begin_suppress_mask(ids, prompt_width: int, vocab_size: int, device, forced_bos_token_id=None) -> LengthMask:
    return LengthMask(ids, lambda width, new: begin_index(width, forced_bos_token_id), "equal", vocab_size, device,
                      prompt_width)


def forced_ids(value, name: str, vocab_size: int) -> list:
    """A forced token id or list of them, each in [0, V)."""
    ids = [value] if isinstance(value, Integral) and not isinstance(value, bool) else token_list(value, name)
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if not ids or bad:
        raise ValueError(f"{name} must be token ids in [0, {vocab_size}), got {value!r}")
    return ids


class ForcedTokens(LengthMask):
    """At the positions whose prefix length L equals the threshold, every logit -inf but the ids',
    which become 0 (transformers' ForcedBOS / ForcedEOS processors); elsewhere nothing changes.
    The threshold as LengthMask keeps it."""

    def __init__(self, ids, threshold_of, vocab_size: int, device, prompt_width: int, max_new_tokens: int):
        super().__init__(ids, threshold_of, "equal", vocab_size, device, prompt_width, max_new_tokens)

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        hit = (prefixes.lengths == self.threshold)[:, :, None]  # [B, N, 1]
        columns = logits.index_select(2, self.ids)  # [B, N, E], before the fill
        logits.masked_fill_(hit, float("-inf"))
        logits.index_copy_(2, self.ids, torch.where(hit, 0.0, columns))


def forced_bos(token, vocab_size: int, device, prompt_width: int) -> ForcedTokens:
    """ForcedBOSTokenLogitsProcessor(token): at L == 1 (a one-token prompt's first new token)."""
    return ForcedTokens(forced_ids(token, "forced_bos_token_id", vocab_size), lambda width, new: 1, vocab_size,
                        device, prompt_width, 0)


def forced_eos(tokens, vocab_size: int, device, prompt_width: int, max_new_tokens: int) -> ForcedTokens:
    """ForcedEOSTokenLogitsProcessor(max_length, tokens), max_length = P + max_new_tokens (what
    generate() sets from max_new_tokens, or what max_length leaves): at L == max_length - 1."""
    return ForcedTokens(forced_ids(tokens, "forced_eos_token_id", vocab_size), lambda width, new: width + new - 1,
                        vocab_size, device, prompt_width, max_new_tokens)


def exponential_decay_value(value) -> tuple:
    """(start, factor) of exponential_decay_length_penalty, checked: an int >= 0 and a real number."""
    if (not isinstance(value, (tuple, list)) or len(value) != 2 or isinstance(value[0], bool)
            or not isinstance(value[0], Integral) or value[0] < 0 or isinstance(value[1], bool)
            or not isinstance(value[1], Real)):
        raise ValueError(f"exponential_decay_length_penalty must be (start index >= 0, decay factor), got {value!r}")
    return int(value[0]), float(value[1])


class ExponentialDecay:
    """ExponentialDecayLengthPenalty((start, factor), eos, P): at a position of prefix length
    L > start + P, each finite EOS logit s becomes s + |s| * (factor^(L - start - P) - 1); others,
    and non-finite EOS logits, are unchanged. transformers computes the factor with Python's pow in
    double and multiplies the float32 |s| by it rounded to float32; here torch.pow in float64 on
    the device, rounded the same way (a last-bit difference of the two pows could move that
    rounding in a ~2^-29 case; tests/processing compares with transformers' class)."""

    def __init__(self, value, eos_ids, vocab_size: int, device, prompt_width: int):
        self.start, factor = exponential_decay_value(value)
        if not eos_ids:
            raise ValueError("exponential_decay_length_penalty needs an eos_token_id (the token it raises)")
        self.ids = _columns(eos_ids, vocab_size, device)
        self.factor = torch.tensor(factor, dtype=torch.float64, device=device)
        self.regulation_start = torch.zeros((), dtype=torch.long, device=device)
        self.set_prompt_width(prompt_width)

    def set_prompt_width(self, prompt_width: int) -> None:
        self.regulation_start.fill_(self.start + prompt_width)

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        steps = prefixes.lengths - self.regulation_start  # [B, N]
        scale = (torch.pow(self.factor, steps.to(torch.float64)) - 1).to(logits.dtype)
        columns = logits.index_select(2, self.ids)  # [B, N, E]
        penalty = (columns.abs() * scale[:, :, None]).masked_fill(~torch.isfinite(columns), 0.0)
        logits.index_copy_(2, self.ids, torch.where((steps > 0)[:, :, None], columns + penalty, columns))


class RemoveInvalidValues:
    """InfNanRemoveLogitsProcessor (remove_invalid_values=True): NaN -> 0, +inf -> the dtype's
    largest float, -inf -> its lowest, at every position (transformers' float32 copy: the stage asks
    for float32 logits)."""

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        info = torch.finfo(logits.dtype)
        torch.nan_to_num_(logits, nan=0.0, posinf=info.max, neginf=info.min)
