"""Per-row sampling parameters as device tensors, validated once, shared by every kernel.

Each parameter is a Python scalar (same for every row) or a tensor [B]. Scalars are checked
on the host for free; tensors are checked only when ``check`` is True (that reads their
values, i.e. synchronises).
"""
from dataclasses import dataclass
from numbers import Integral, Real

import torch

from .rng import MAX_OFFSET
from .rng.reference import derive_row_seeds


@dataclass(frozen=True)
class SamplingTensors:
    """Standardisation and randomness parameters, one entry per row (all on one device).

    temperature: float32 [B]  (0 = greedy)       top_k: int32 [B]  (0 = off)
    top_p:       float32 [B]  (1 = off)          min_p: float32 [B] (0 = off)
    seed:        int64 [B]                       offset: int64 [B] in [0, 2**56)
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    seed: torch.Tensor
    offset: torch.Tensor

    @property
    def batch(self) -> int:
        return self.temperature.shape[0]


def _per_row(value, name: str, batch: int, device, dtype: torch.dtype, integral: bool) -> tuple[torch.Tensor, bool]:
    """(tensor [batch] of dtype on device, whether it came from a tensor whose values are unchecked)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            value = value.reshape(1).expand(batch)
        if value.dim() != 1 or value.shape[0] != batch:
            raise ValueError(f"{name} must be a scalar or a tensor of shape [{batch}], got shape {tuple(value.shape)}")
        if value.device != torch.device(device):
            raise ValueError(f"{name} is on {value.device} but the logits are on {device}")
        if integral and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
            raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")
        if not integral and not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"{name} must be a real tensor, got {value.dtype}")
        return value.to(dtype).contiguous(), True
    if isinstance(value, bool) or not isinstance(value, Integral if integral else Real):
        kind = "an int" if integral else "a number"
        raise TypeError(f"{name} must be {kind} or a tensor [B], got {type(value).__name__}")
    return torch.full((batch,), value, dtype=dtype, device=device), False


def _check(ok: torch.Tensor, name: str, rule: str, values: torch.Tensor) -> None:
    if not bool(ok.all()):
        bad = values[~ok][0].item()
        raise ValueError(f"{name} must satisfy {rule}, got {bad}")


def make_sampling_tensors(
    batch: int,
    device,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    seed=0,
    offset=0,
    check: bool = True,
) -> SamplingTensors:
    """Validate the sampling arguments and broadcast them to per-row tensors [batch].

    An int seed gives each row its own stream (derive_row_seeds); a tensor seed [B] is used
    as given. Raises ValueError/TypeError naming the argument on bad input.
    """
    if not isinstance(offset, torch.Tensor) and isinstance(offset, Integral) and not 0 <= offset < MAX_OFFSET:
        raise ValueError(f"offset must satisfy 0 <= offset < 2**56, got {offset}")
    t, t_tensor = _per_row(temperature, "temperature", batch, device, torch.float32, integral=False)
    k, k_tensor = _per_row(top_k, "top_k", batch, device, torch.int32, integral=True)
    p, p_tensor = _per_row(top_p, "top_p", batch, device, torch.float32, integral=False)
    m, m_tensor = _per_row(min_p, "min_p", batch, device, torch.float32, integral=False)
    o, o_tensor = _per_row(offset, "offset", batch, device, torch.int64, integral=True)
    if isinstance(seed, torch.Tensor):
        s = _per_row(seed, "seed", batch, device, torch.int64, integral=True)[0]  # any int64 is a valid seed
    else:
        if isinstance(seed, bool) or not isinstance(seed, Integral):
            raise TypeError(f"seed must be an int or an int64 tensor [B], got {type(seed).__name__}")
        if not -(1 << 63) <= seed < (1 << 63):
            raise ValueError(f"seed must fit in int64, got {seed}")
        s = derive_row_seeds(seed, batch, device)
    # Scalars are always checked (host values, free); tensors only when asked (reads values).
    for tensor, from_tensor, name, ok_fn, rule in (
        (t, t_tensor, "temperature", lambda v: torch.isfinite(v) & (v >= 0), "0 <= temperature < inf"),
        (k, k_tensor, "top_k", lambda v: v >= 0, "top_k >= 0"),
        (p, p_tensor, "top_p", lambda v: (v > 0) & (v <= 1), "0 < top_p <= 1"),
        (m, m_tensor, "min_p", lambda v: (v >= 0) & (v <= 1), "0 <= min_p <= 1"),
        (o, o_tensor, "offset", lambda v: (v >= 0) & (v < MAX_OFFSET), "0 <= offset < 2**56"),
    ):
        if batch and (check or not from_tensor):
            _check(ok_fn(tensor), name, rule, tensor)
    return SamplingTensors(t, k, p, m, s, o)
