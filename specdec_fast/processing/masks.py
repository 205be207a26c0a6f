"""Token masks that depend on the prefix length only (or on nothing), per speculative position:
min_length / min_new_tokens (EOS -inf while the prefix is too short), suppress_tokens (always
-inf), begin_suppress_tokens (-inf at the first generated position only). transformers'
MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor, SuppressTokensLogitsProcessor,
SuppressTokensAtBeginLogitsProcessor.

transformers' counting, with L = a position's prefix length (input_ids.shape[-1]) and P the
prompt width (pads included; input_ids_seq_length):
    min_length      EOS banned while L < min_length (the prompt counts, pads included)
    min_new_tokens  EOS banned while L - P < min_new_tokens
    begin_suppress  banned when L == begin_index = P (P + 1 when P == 1 and forced_bos_token_id is
                    set), i.e. at the first generated token of every row
Token ids outside [0, V) are ignored (transformers' torch.isin over the vocabulary).

On the device: each touches its token columns only (index_fill_ / index_copy_ of a where over
[B, N, E]), never a [B, N, V] pass; the length test is a [B, N] compare, no host read.
"""
from numbers import Integral

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
    or ``L == threshold`` (kind "equal"). threshold_of(P) -> int gives the threshold for a prompt
    width P; it is kept in a device tensor that set_prompt_width re-fills in place, so one mask
    (and a CUDA graph that captured it) serves calls of any prompt width."""

    def __init__(self, ids, threshold_of, kind: str, vocab_size: int, device, prompt_width: int):
        if kind not in ("below", "equal"):
            raise ValueError(f"kind must be 'below' or 'equal', got {kind!r}")
        self.ids, self.kind, self.threshold_of = _columns(ids, vocab_size, device), kind, threshold_of
        self.threshold = torch.zeros((), dtype=torch.long, device=device)
        self.set_prompt_width(prompt_width)

    def set_prompt_width(self, prompt_width: int) -> None:
        self.threshold.fill_(int(self.threshold_of(prompt_width)))

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        lengths = prefixes.lengths  # [B, N]
        hit = lengths < self.threshold if self.kind == "below" else lengths == self.threshold
        columns = logits.index_select(2, self.ids)  # [B, N, E]
        logits.index_copy_(2, self.ids, torch.where(hit[:, :, None], float("-inf"), columns))


def min_length_mask(eos_ids, min_length: int, vocab_size: int, device, prompt_width: int = 0) -> LengthMask:
    """MinLengthLogitsProcessor(min_length, eos): an absolute length (the prompt counts)."""
    return LengthMask(eos_ids, lambda _: min_length, "below", vocab_size, device, prompt_width)


def min_new_tokens_mask(eos_ids, prompt_width: int, min_new_tokens: int, vocab_size: int, device) -> LengthMask:
    """MinNewTokensLengthLogitsProcessor(P, min_new_tokens, eos): L - P < min_new <=> L < P + min_new."""
    return LengthMask(eos_ids, lambda width: width + min_new_tokens, "below", vocab_size, device, prompt_width)


def begin_index(prompt_width: int, forced_bos_token_id=None) -> int:
    """transformers' begin_index of SuppressTokensAtBeginLogitsProcessor (generation/utils.py)."""
    return prompt_width if (prompt_width > 1 or forced_bos_token_id is None) else prompt_width + 1


def begin_suppress_mask(ids, prompt_width: int, vocab_size: int, device, forced_bos_token_id=None) -> LengthMask:
    return LengthMask(ids, lambda width: begin_index(width, forced_bos_token_id), "equal", vocab_size, device,
                      prompt_width)
