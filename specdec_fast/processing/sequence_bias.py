"""sequence_bias and bad_words_ids on the device, per speculative position (transformers'
SequenceBiasLogitsProcessor and NoBadWordsLogitsProcessor, which is a sequence bias of -inf).

A sequence (t_0 .. t_{L-1}) with bias b adds b to token t_{L-1}'s logit at every position
whose prefix ends with t_0 .. t_{L-2} (always, for L = 1; never when the prefix is shorter
than L - 1). Biases of sequences ending in the same token add up. Arithmetic as transformers:
an additive bias (bad words: + -inf, so a +inf or NaN logit gives NaN there, as in transformers).

On the device: single-token biases are one index_add_ over their columns only; longer sequences
are matched all at once: their prefixes, left-aligned to the longest with a wildcard, against
the last L_max - 1 tokens of every position (Prefixes.last), then one index_add_ of the matched
biases into [B, N, S] columns. Cost O(B * N * S * L_max), no [B, N, V] temporary.
"""
import math
from numbers import Integral, Real

import torch

from .prefix import Prefixes

WILDCARD = -2  # left padding of shorter prefixes: matches any token and NO_TOKEN


def _token_ids(value, name: str, vocab_size: int) -> tuple:
    if not isinstance(value, (list, tuple)) or len(value) == 0:
        raise ValueError(f"{name}: each sequence must be a non-empty list of token ids, got {value!r}")
    for t in value:
        if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t < vocab_size:
            raise ValueError(f"{name}: token ids must be ints in [0, vocab_size={vocab_size}), got {value!r}")
    return tuple(int(t) for t in value)


def parse_sequence_bias(sequence_bias, vocab_size: int) -> dict:
    """transformers' forms (a list of [token ids, bias] pairs, or a dict {tuple of ids: bias})
    -> {tuple: float}; a repeated sequence keeps its last bias (transformers builds a dict)."""
    if isinstance(sequence_bias, dict):
        pairs = list(sequence_bias.items())
    elif isinstance(sequence_bias, (list, tuple)):
        pairs = sequence_bias
    else:
        pairs = None
    if not pairs:
        raise ValueError(f"sequence_bias must be a non-empty list of [token ids, bias] pairs, got {sequence_bias!r}")
    parsed = {}
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"sequence_bias: each entry must be [token ids, bias], got {pair!r}")
        ids, bias = pair
        if isinstance(bias, bool) or not isinstance(bias, Real) or math.isnan(bias):
            raise ValueError(f"sequence_bias: the bias of {ids!r} must be a number, got {bias!r}")
        parsed[_token_ids(ids, "sequence_bias", vocab_size)] = float(bias)
    return parsed


def parse_bad_words(bad_words_ids, vocab_size: int, eos_token_ids) -> dict:
    """bad_words_ids (a non-empty list of non-empty lists of ids) -> {tuple: -inf}, without the
    single-token sequences [eos] (transformers drops those: EOS stays possible)."""
    if not isinstance(bad_words_ids, (list, tuple)) or len(bad_words_ids) == 0:
        raise ValueError(f"bad_words_ids must be a non-empty list of lists of token ids, got {bad_words_ids!r}")
    eos = set(eos_token_ids or ())
    parsed = {}
    for words in bad_words_ids:
        ids = _token_ids(words, "bad_words_ids", vocab_size)
        if not (len(ids) == 1 and ids[0] in eos):
            parsed[ids] = float("-inf")
    return parsed


class SequenceBias:
    """Adds {token sequence: bias} per position. logits [B, N, V] in place (apply_)."""

    def __init__(self, biases: dict, vocab_size: int, device):
        single = {ids[0]: b for ids, b in biases.items() if len(ids) == 1}
        multi = [(ids, b) for ids, b in biases.items() if len(ids) > 1]
        self.vocab_size = vocab_size
        # any bias but -inf rounds differently in another dtype than transformers' float32 copy
        self.rounds = any(b != float("-inf") for b in biases.values())
        self.single_ids = torch.tensor(sorted(single), dtype=torch.long, device=device) if single else None
        self.single_bias = (torch.tensor([single[t] for t in sorted(single)], dtype=torch.float32, device=device)
                            if single else None)
        self.width = max((len(ids) - 1 for ids, _ in multi), default=0)  # L_max - 1
        if multi:
            prefixes = [[WILDCARD] * (self.width - len(ids) + 1) + list(ids[:-1]) for ids, _ in multi]
            self.prefixes = torch.tensor(prefixes, dtype=torch.long, device=device)  # [S, L_max - 1]
            self.last_ids = torch.tensor([ids[-1] for ids, _ in multi], dtype=torch.long, device=device)  # [S]
            self.multi_bias = torch.tensor([b for _, b in multi], dtype=torch.float32, device=device)  # [S]
        else:
            self.prefixes = self.last_ids = self.multi_bias = None

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        """logits [B, N, V] += each position's bias (in place)."""
        batch, n, _ = logits.shape
        if self.single_ids is not None:
            logits.index_add_(2, self.single_ids, self.single_bias.to(logits.dtype).expand(batch, n, -1))
        if self.prefixes is not None:
            context = prefixes.last(self.width)  # [B, N, W]
            same = (context[:, :, None, :] == self.prefixes) | (self.prefixes == WILDCARD)  # [B, N, S, W]
            bias = torch.where(same.all(-1), self.multi_bias, 0.0)  # [B, N, S]
            logits.index_add_(2, self.last_ids, bias.to(logits.dtype))
