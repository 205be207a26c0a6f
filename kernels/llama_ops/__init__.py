"""Fused elementwise ops of a Llama decoder layer: rms_norm, add_rms_norm, rope_qk_ (in place),
silu_mul, rope_cos_sin.

Backends: "cpp" (csrc/llama_fused.cpp: float32 CPU tensors, one call instead of 3-7 torch
ops each), "triton" (triton.py: rms_norm, add_rms_norm, silu_mul in one launch each; CUDA, or
CPU under TRITON_INTERPRET=1), "torch" (reference.py: the spec; everything else).
backend=None picks "cpp" for float32 CPU tensors when it builds, "triton" for CUDA tensors
(rms_norm / add_rms_norm / silu_mul), else "torch". Semantics: see reference.py.
"""
import torch

from .._backend import cpp_op_available, require_triton, triton_available, triton_interpreting
from .reference import (add_rms_norm_reference, rms_norm_reference, rope_cos_sin_reference, rope_qk_reference,
                        silu_mul_reference)

__all__ = ["rms_norm", "add_rms_norm", "rope_qk_", "silu_mul", "rope_cos_sin", "rms_norm_reference",
           "add_rms_norm_reference", "rope_qk_reference", "silu_mul_reference", "rope_cos_sin_reference",
           "fused_cpp_applies"]

_OPS = ("rms_norm", "rope_qk_", "silu_mul", "rope_cos_sin")


def _tensor(name, t, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {t.dtype}")


def _same(ref_name, ref, **others):
    for name, t in others.items():
        if t.dtype != ref.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from {ref_name} dtype {ref.dtype}")
        if t.device != ref.device:
            raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")


def fused_cpp_applies(*tensors) -> bool:
    """True when the C++ ops take these tensors: float32 on CPU, and the ops built."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and all(cpp_op_available(op) for op in _OPS))


def _use_cpp(backend, *tensors) -> bool:
    if backend not in (None, "cpp", "torch"):
        raise ValueError(f"backend must be None, 'cpp' or 'torch', got {backend!r}")
    applies = fused_cpp_applies(*tensors)
    if backend == "cpp" and not applies:
        raise ValueError("backend='cpp' needs float32 CPU tensors and the C++ ops built")
    return backend != "torch" and applies


def _choose(backend, *tensors) -> str:
    """"triton", "cpp" or "torch" for an op that has all three (rms_norm, add_rms_norm, silu_mul)."""
    if backend not in (None, "triton", "cpp", "torch"):
        raise ValueError(f"backend must be None, 'triton', 'cpp' or 'torch', got {backend!r}")
    on_cuda = tensors[0].device.type == "cuda"
    if backend == "triton" or (backend is None and on_cuda):
        if not triton_available():
            if backend == "triton":
                require_triton()
            return "torch"
        if not on_cuda and not triton_interpreting():
            raise ValueError("backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported")
        return "triton"
    return "cpp" if _use_cpp(backend, *tensors) else "torch"


def _unit_last(t):
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, backend: str | None = None) -> torch.Tensor:
    """x [T, H], weight [H], eps > 0 -> weight * (x * rsqrt(mean(x^2) + eps)) [T, H]."""
    _tensor("x", x, 2)
    _tensor("weight", weight, 1)
    _same("x", x, weight=weight)
    if weight.shape[0] != x.shape[1]:
        raise ValueError(f"weight must have shape [{x.shape[1]}] (x's last dim), got {tuple(weight.shape)}")
    _check_eps(eps)
    chosen = _choose(backend, x, weight)
    if chosen == "triton":
        from .triton import add_rms_norm_triton

        return add_rms_norm_triton(_unit_last(x), None, weight.contiguous(), eps)[1]
    if chosen == "torch":
        return rms_norm_reference(x, weight, eps)
    from .cpp import rms_norm_cpp

    return rms_norm_cpp(_unit_last(x), weight.contiguous(), eps)


def _check_eps(eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, *,
                 write_residual: bool = True, backend: str | None = None):
    """x, delta [T, H] (delta None: no add), weight [H] -> (residual = x + delta, rms_norm(residual)).
    write_residual=False returns (None, out) (Triton then skips the residual's store). Backends:
    "triton" (one launch) or "torch"; None picks triton for CUDA tensors."""
    _tensor("x", x, 2)
    _tensor("weight", weight, 1)
    if delta is not None:
        _tensor("delta", delta, 2)
        _same("x", x, delta=delta)
        if delta.shape != x.shape:
            raise ValueError(f"delta must have x's shape {tuple(x.shape)}, got {tuple(delta.shape)}")
    _same("x", x, weight=weight)
    if weight.shape[0] != x.shape[1]:
        raise ValueError(f"weight must have shape [{x.shape[1]}] (x's last dim), got {tuple(weight.shape)}")
    _check_eps(eps)
    if backend == "cpp":
        raise ValueError("add_rms_norm has no C++ backend ('triton' or 'torch')")
    if _choose(backend, x, weight) == "triton":
        from .triton import add_rms_norm_triton

        return add_rms_norm_triton(_unit_last(x), None if delta is None else _unit_last(delta), weight.contiguous(),
                                   eps, write_residual=write_residual)
    residual, out = add_rms_norm_reference(x, delta, weight, eps)
    return (residual if write_residual else None), out


def rope_qk_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: str | None = None) -> None:
    """Rotates q [T, Hq, D] and k [T, Hk, D] in place: x * cos + rotate_half(x) * sin, cos/sin [T, R]
    (R = D, or fewer even dims: a partial rotary embedding rotates the first R, the rest pass)."""
    _tensor("q", q, 3)
    _tensor("k", k, 3)
    _tensor("cos", cos, 2)
    _tensor("sin", sin, 2)
    _same("q", q, k=k, cos=cos, sin=sin)
    t, _, d = q.shape
    if k.shape[0] != t or k.shape[2] != d:
        raise ValueError(f"k must be [{t}, Hk, {d}] like q, got {tuple(k.shape)}")
    if d % 2:
        raise ValueError(f"head_dim must be even, got {d}")
    for name, c in (("cos", cos), ("sin", sin)):
        if c.shape[0] != t or c.shape[1] > d or c.shape[1] % 2 or c.shape != cos.shape:
            raise ValueError(f"{name} must have shape [{t}, R] (R even, at most {d}, as cos), got {tuple(c.shape)}")
    if not _use_cpp(backend, q, k, cos, sin) or d > 512 or q.stride(-1) != 1 or k.stride(-1) != 1:
        rope_qk_reference(q, k, cos, sin)
        return
    from .cpp import rope_qk_cpp

    rope_qk_cpp(q, k, cos.contiguous(), sin.contiguous())


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """gate, up [T, F] -> silu(gate) * up [T, F]."""
    _tensor("gate", gate, 2)
    _tensor("up", up, 2)
    _same("gate", gate, up=up)
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have one shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    chosen = _choose(backend, gate, up)
    if chosen == "triton":
        from .triton import silu_mul_triton

        return silu_mul_triton(_unit_last(gate), _unit_last(up))
    if chosen == "torch":
        return silu_mul_reference(gate, up)
    from .cpp import silu_mul_cpp

    return silu_mul_cpp(_unit_last(gate), _unit_last(up))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float = 1.0, *, backend: str | None = None):
    """positions [T] int32/int64, inv_freq [D/2] float32 -> cos, sin [T, D] float32 (see reference.py)."""
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"positions must be a 1-D int32/int64 tensor, got {getattr(positions, 'dtype', type(positions))}")
    _tensor("inv_freq", inv_freq, 1)
    if inv_freq.dtype != torch.float32:
        raise TypeError(f"inv_freq must be float32, got {inv_freq.dtype}")
    if positions.device != inv_freq.device:
        raise ValueError(f"positions is on {positions.device} but inv_freq is on {inv_freq.device}")
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)):
        raise TypeError(f"scaling must be a float, got {scaling!r}")
    if not _use_cpp(backend, inv_freq):
        return rope_cos_sin_reference(positions, inv_freq, scaling)
    from .cpp import rope_cos_sin_cpp

    return rope_cos_sin_cpp(positions, inv_freq, scaling)
