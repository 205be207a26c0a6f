"""Wrapper of the C++ CPU op torch.ops.specdec_fast.skinny_linear (csrc/skinny_linear.cpp)."""
import torch

from .._cpp_build import load_cpu_ops


def skinny_linear_cpp(x, weight, bias=None, residual=None) -> torch.Tensor:
    """Validated float32 CPU inputs (see __init__.py) -> y [M, N] float32."""
    if not load_cpu_ops():
        raise RuntimeError("the C++ CPU ops did not build")
    return torch.ops.specdec_fast.skinny_linear(x, weight, bias, residual)


def skinny_linear_n_cpp(x, weights, biases) -> list:
    """Validated float32 CPU inputs -> [x @ W_i.T + b_i], one dispatch."""
    if not load_cpu_ops():
        raise RuntimeError("the C++ CPU ops did not build")
    return torch.ops.specdec_fast.skinny_linear_n(x, list(weights), list(biases))
