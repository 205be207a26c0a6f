"""The device state of the penalties: PenaltyTensors, built once per generate() call from the
prompt (make_penalty_tensors) and updated in place after every append (add_tokens): no host
sync, the same tensors every call (CUDA-graph safe). Semantics: reference.py.

counts int32 [B, V], one word per (row, token): bits 0-29 the token's count among the row's
generated tokens, bit 30 set when the token occurs in the prompt. One tensor, so a kernel reads
one 4-byte word per logit (B * V * 4 bytes per pass over a position's logits).
"""
import math
from dataclasses import dataclass
from numbers import Real

import torch

from .._backend import canonical_device
from ..sampling_params import row_tensor
from .reference import PROMPT_BIT

# The three penalties, by the names PenaltyTensors.active uses.
PENALTIES = ("repetition", "frequency", "presence")
_PENALTY_SET = frozenset(PENALTIES)

# name -> (off value, rule on a value (Python scalar or tensor), rule text). repetition: transformers'
# RepetitionPenaltyLogitsProcessor requires a strictly positive float; frequency / presence: vLLM's
# and OpenAI's range (they also keep f * count from overflowing float32).
RULES = {
    "repetition_penalty": (1.0, lambda v: (v > 0) & (v < math.inf), "0 < repetition_penalty < inf"),
    "frequency_penalty": (0.0, lambda v: (v >= -2) & (v <= 2), "-2 <= frequency_penalty <= 2"),
    "presence_penalty": (0.0, lambda v: (v >= -2) & (v <= 2), "-2 <= presence_penalty <= 2"),
}


@dataclass(frozen=True)
class PenaltyTensors:
    """Per-row penalty state and parameters (all on one device).

    counts:     int32 [B, V]  bits 0-29: output count of token v; bit 30: v occurs in the prompt.
                Updated in place by add_tokens (never rebound: graphs read its address).
    repetition: float32 [B]   1 = off          frequency: float32 [B]  0 = off
    presence:   float32 [B]   0 = off
    active:     the PENALTIES some row may use, known on the host (a superset is allowed, never a
                subset). Empty: every launcher runs exactly its penalty-free code (no counts read).
    """

    counts: torch.Tensor
    repetition: torch.Tensor
    frequency: torch.Tensor
    presence: torch.Tensor
    active: frozenset = frozenset(PENALTIES)

    def __post_init__(self):
        active = frozenset(self.active)
        if not active <= _PENALTY_SET:
            raise ValueError(f"unknown penalties {sorted(active - _PENALTY_SET)}; choose from {PENALTIES}")
        object.__setattr__(self, "active", active)

    @property
    def batch(self) -> int:
        return self.counts.shape[0]

    @property
    def vocab(self) -> int:
        return self.counts.shape[1]


def _per_row(value, name: str, batch: int, device: torch.device, check: bool) -> tuple[torch.Tensor, set]:
    """(parameter ``name`` as float32 [batch] on device, the states {on, off} its rows may have)."""
    off, rule, text = RULES[name]
    if isinstance(value, torch.Tensor):
        value = row_tensor(value, name, batch, device, "the prompt is")
        if not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"{name} must be a real tensor, got {value.dtype}")
        value = value.to(torch.float32).contiguous()
        states = {True, False}
        if check and batch:
            ok = rule(value)
            if not bool(ok.all()):
                raise ValueError(f"{name} must satisfy {text}, got {value[~ok][0].item()}")
            on = value != off
            states = {state for state, present in ((True, bool(on.any())), (False, not bool(on.all()))) if present}
        return value, states
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number or a tensor [B], got {type(value).__name__}")
    value = float(value)
    if not rule(value):
        raise ValueError(f"{name} must satisfy {text}, got {value}")
    return torch.full((batch,), value, dtype=torch.float32, device=device), {value != off}


def make_penalty_tensors(
    input_ids: torch.Tensor,
    vocab: int,
    *,
    repetition_penalty=1.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
    check: bool = True,
) -> PenaltyTensors:
    """The penalty state of a batch from its padded prompt.

    input_ids: int [B, P] (P >= 0), the prompt as transformers sees it, left pads included (they
    count for the repetition penalty, as in transformers); entries outside [0, vocab) are not
    tokens of the logits' vocabulary and are ignored (transformers drops ids >= V too). vocab: V,
    the logits' last dimension. Parameters: Python scalars or tensors [B] on input_ids' device;
    scalars are validated on the host, tensors only with check=True (that reads them). Raises
    ValueError / TypeError naming the argument. Returns PenaltyTensors with counts = the prompt
    bits and zero output counts, and ``active`` from the parameters (exact for scalars and
    checked tensors, every penalty an unread tensor names otherwise)."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.int32, torch.int64) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be an int32 / int64 tensor [B, P], got {input_ids.dtype} "
                         f"{tuple(input_ids.shape)}")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 1 <= vocab < 2**31:
        raise ValueError(f"vocab must be an int in [1, 2**31), got {vocab!r}")
    batch = input_ids.shape[0]
    device = canonical_device(input_ids.device)
    params, active = {}, set()
    for name, value in (("repetition_penalty", repetition_penalty), ("frequency_penalty", frequency_penalty),
                        ("presence_penalty", presence_penalty)):
        params[name], states = _per_row(value, name, batch, device, check)
        if True in states:
            active.add(name.removesuffix("_penalty"))
    ids = input_ids.long()
    inside = (ids >= 0) & (ids < vocab)
    counts = torch.zeros(batch, vocab + 1, dtype=torch.int32, device=device)
    counts.scatter_(1, torch.where(inside, ids, vocab), PROMPT_BIT)  # a repeated token writes the same bit
    return PenaltyTensors(counts[:, :vocab].contiguous(), params["repetition_penalty"], params["frequency_penalty"],
                          params["presence_penalty"], frozenset(active))


def add_tokens(counts: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """counts int32 [B, V] += one per generated token, in place; returns counts.

    tokens: int [B, W], the tokens appended to each row this step; mask: bool [B, W], which of
    them are real (None: tokens >= 0). Entries outside [0, V) are never counted (-1 pads). One
    scatter_add, no host sync, same tensors every call (CUDA-graph safe); integer adds, so the
    result does not depend on their order. Counts stay below 2**30 for any real generation
    (bit 30 is the prompt bit)."""
    if not isinstance(counts, torch.Tensor) or counts.dtype != torch.int32 or counts.dim() != 2:
        raise ValueError(f"counts must be an int32 tensor [B, V] (PenaltyTensors.counts), got "
                         f"{getattr(counts, 'dtype', type(counts).__name__)} {tuple(getattr(counts, 'shape', ()))}")
    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int32, torch.int64) or tokens.dim() != 2 \
            or tokens.shape[0] != counts.shape[0]:
        raise ValueError(f"tokens must be an int32 / int64 tensor [B, W] with B = {counts.shape[0]}, got "
                         f"{getattr(tokens, 'dtype', type(tokens).__name__)} {tuple(getattr(tokens, 'shape', ()))}")
    if tokens.device != counts.device:
        raise ValueError(f"tokens is on {tokens.device} but counts is on {counts.device}")
    vocab = counts.shape[1]
    t = tokens.long()
    valid = (t >= 0) & (t < vocab)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != tokens.shape:
            raise ValueError(f"mask must be a bool tensor of the tokens' shape {tuple(tokens.shape)}, got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
        if mask.device != counts.device:
            raise ValueError(f"mask is on {mask.device} but counts is on {counts.device}")
        valid = valid & mask
    # Out-of-vocabulary entries add 0 at index 0 (a no-op): no column to drop, no copy of counts.
    return counts.scatter_add_(1, torch.where(valid, t, 0), valid.int())


def check_penalty_tensors(penalties, batch: int, vocab: int, device: torch.device) -> None:
    """penalties must be a PenaltyTensors for logits of ``batch`` rows over ``vocab`` tokens on
    ``device``: counts int32 [B, V] with unit vocabulary stride, parameters float32 [B]. Reads
    no values (no sync). Raises TypeError / ValueError naming the field."""
    if not isinstance(penalties, PenaltyTensors):
        raise TypeError(f"penalties must be a PenaltyTensors (make_penalty_tensors) or None, got "
                        f"{type(penalties).__name__}")
    counts = penalties.counts
    if counts.dtype != torch.int32 or counts.dim() != 2:
        raise TypeError(f"penalties.counts must be an int32 tensor [B, V], got {counts.dtype} {tuple(counts.shape)}")
    if tuple(counts.shape) != (batch, vocab):
        raise ValueError(f"penalties.counts must have shape [B, V] = [{batch}, {vocab}] to match the logits, "
                         f"got {list(counts.shape)}")
    if counts.device != device:
        raise ValueError(f"penalties.counts is on {counts.device} but the logits are on {device}")
    if vocab > 1 and counts.stride(1) != 1:
        raise ValueError(f"penalties.counts must have unit stride along the vocabulary, got strides {counts.stride()}")
    for name in PENALTIES:
        value = getattr(penalties, name)
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or tuple(value.shape) != (batch,):
            raise TypeError(f"penalties.{name} must be a float32 tensor [{batch}], got "
                            f"{getattr(value, 'dtype', type(value).__name__)} {tuple(getattr(value, 'shape', ()))}")
        if value.device != device:
            raise ValueError(f"penalties.{name} is on {value.device} but the logits are on {device}")
