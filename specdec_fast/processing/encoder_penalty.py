"""encoder_repetition_penalty for a decoder-only call: transformers'
EncoderRepetitionPenaltyLogitsProcessor, which generate() builds from the prompt (its
``inputs_tensor``: input_ids, left pads included) when the model has no encoder.

Every token that occurs in the row's prompt, the pad token of its left padding too, has its
logit scaled towards more likely: with q = 1 / penalty (transformers keeps that inverse), s < 0
-> s * q, else s / q, once per token however often it occurs (transformers' gather / scatter over
the prompt ids writes one value per column). Slot 1b of pipeline.py's order: after sequence_bias,
before repetition_penalty. text-generation-webui exposes it as its "hallucinations filter".

Device-side and graph safe: the prompt's columns come from the first P slots of seq (P a device
scalar re-filled per call, so one captured graph serves calls of any prompt width) as a [B, V]
mask per apply, then one where over [B, N, V].
"""
import torch

from .prefix import Prefixes


def check_encoder_penalty(value) -> float:
    """transformers' check: a float > 0 (an int raises there too)."""
    if not isinstance(value, float) or not value > 0:
        raise ValueError(f"encoder_repetition_penalty must be a float > 0 (as transformers requires), got {value!r}")
    return value


class EncoderRepetitionPenalty:
    """The processor of one call (module docstring): penalty, the padded prompt width P, device."""

    def __init__(self, penalty: float, prompt_width: int, device):
        self.inverse = 1 / check_encoder_penalty(penalty)  # transformers' self.penalty
        self.prompt_width = torch.full((), prompt_width, dtype=torch.long, device=device)  # re-filled per call

    def set_prompt_width(self, prompt_width: int) -> None:
        self.prompt_width.fill_(prompt_width)

    def prompt_columns(self, prefixes: Prefixes, vocab_size: int) -> torch.Tensor:
        """bool [B, V]: the tokens of each row's prompt (seq[:, :P])."""
        seq = prefixes.seq
        slots = torch.arange(seq.shape[1], device=seq.device)[None, :]
        ids = torch.where(slots < self.prompt_width, seq.long(), vocab_size)  # past the prompt: a spare column
        mask = torch.zeros(seq.shape[0], vocab_size + 1, dtype=torch.bool, device=seq.device)
        return mask.scatter_(1, ids, True)[:, :vocab_size]

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        """logits [B, N, V] in place."""
        columns = self.prompt_columns(prefixes, logits.shape[-1])[:, None, :]
        scaled = torch.where(logits < 0, logits * self.inverse, logits / self.inverse)
        logits.copy_(torch.where(columns, scaled, logits))
