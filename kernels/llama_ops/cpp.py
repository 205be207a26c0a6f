"""Wrappers of the C++ CPU ops rms_norm, rope_qk_, silu_mul, rope_cos_sin (csrc/llama_fused.cpp)."""
import torch

from .._cpp_build import load_cpu_ops


def _ops():
    if not load_cpu_ops():
        raise RuntimeError("the C++ CPU ops did not build")
    return torch.ops.specdec_fast


def rms_norm_cpp(x, weight, eps: float) -> torch.Tensor:
    return _ops().rms_norm(x, weight, float(eps))


def rope_qk_cpp(q, k, cos, sin) -> None:
    _ops().rope_qk_(q, k, cos, sin)


def silu_mul_cpp(gate, up) -> torch.Tensor:
    return _ops().silu_mul(gate, up)


def rope_cos_sin_cpp(positions, inv_freq, scaling: float):
    cos, sin = _ops().rope_cos_sin(positions, inv_freq, float(scaling))
    return cos, sin
