"""moe_pairs: each (token, expert) pair's product with its expert's weight, for the few tokens of a
decode or verify step (runners/_moe.py); validation + dispatch.

Backends: "triton" (triton.py; CUDA, or CPU under TRITON_INTERPRET=1), "torch" (reference.py: the
spec). backend=None: triton on CUDA, torch elsewhere (no C++ op: the CPU runners take the torch
path of runners/_moe.py).
"""
import torch

from .._backend import resolve_backend
from .reference import moe_pairs_reference

__all__ = ["moe_pairs", "moe_pairs_reference"]


def _check(x, experts, weight, pairs_per_token, scale, gated):
    for name, t, ndim in (("x", x, 2), ("experts", experts, 1), ("weight", weight, 3)):
        if not isinstance(t, torch.Tensor) or t.dim() != ndim:
            raise ValueError(f"{name} must be a {ndim}-d tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if not x.is_floating_point() or weight.dtype != x.dtype:
        raise TypeError(f"x and weight must share a float dtype, got {x.dtype} and {weight.dtype}")
    if experts.dtype != torch.int64:
        raise TypeError(f"experts must be int64, got {experts.dtype}")
    if weight.shape[2] != x.shape[1]:
        raise ValueError(f"weight must be [E, N, K] with K = {x.shape[1]} (x's width), got {tuple(weight.shape)}")
    if x.stride(1) != 1 or weight.stride(2) != 1:
        raise ValueError("x and weight need a unit stride along K")
    if isinstance(pairs_per_token, bool) or not isinstance(pairs_per_token, int) or pairs_per_token < 1:
        raise ValueError(f"pairs_per_token must be a positive int, got {pairs_per_token!r}")
    if experts.shape[0] != x.shape[0] * pairs_per_token:
        raise ValueError(f"experts must have {x.shape[0] * pairs_per_token} entries (tokens x pairs_per_token), "
                         f"got {experts.shape[0]}")
    if gated and weight.shape[1] % 2:
        raise ValueError(f"a gated weight stacks gate and up rows: an even row count, got {weight.shape[1]}")
    if scale is not None and (not isinstance(scale, torch.Tensor) or tuple(scale.shape) != (experts.shape[0],)
                              or not scale.is_floating_point()):
        raise ValueError(f"scale must be a float tensor of shape [{experts.shape[0]}]")
    for name, t in (("experts", experts), ("weight", weight), ("scale", scale)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def moe_pairs(x: torch.Tensor, experts: torch.Tensor, weight: torch.Tensor, *, pairs_per_token: int,
              scale: torch.Tensor | None = None, gated: bool = False, backend=None) -> torch.Tensor:
    """x [T, K]; experts [P = T * pairs_per_token] int64 (pair p: token p // pairs_per_token, expert
    experts[p]; ids are not range-checked: no host sync); weight [E, N, K] (unit stride along K);
    gated: weight [E, 2I, K] of gate then up rows -> silu(gate) * up, [P, I]; scale [P] multiplies
    each pair's output. -> out [P, N or I] in x's dtype (float32 sums, rounded once)."""
    _check(x, experts, weight, pairs_per_token, scale, gated)
    if backend == "cpp":
        raise ValueError("moe_pairs has no C++ backend: backend='torch' or 'triton'")
    name = resolve_backend(backend, x.device, "moe_pairs")  # no C++ op: "triton" on CUDA, else "torch"
    if name == "triton":
        from .triton import moe_pairs_triton

        return moe_pairs_triton(x, experts, weight, pairs_per_token, scale, gated)
    return moe_pairs_reference(x, experts, weight, pairs_per_token, scale, gated)
