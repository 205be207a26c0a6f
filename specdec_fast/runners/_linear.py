"""The matrix products of the paged runners, in one place: linear(x [..., in], weight [out, in]
(a view; may be the transpose of a [in, out] tensor, as GPT-2's Conv1D stores it), bias [out]
or None, residual [..., out] or None) -> residual + (x @ weight.T + bias) [..., out]; and
linears(x, ((weight, bias), ...)) -> [linear(x, weight, bias), ...] (q/k/v, gate/up: one C++ call).

On CPU, float32, at most CPP_MAX_ROWS rows, the C++ skinny_linear (csrc/skinny_linear.cpp)
streams the weight once per call whatever the row count; torch's sgemm packs the whole weight
once M > 1 (the demo target scored 5 tokens in 1.6x the time of 1). Everywhere else (CUDA,
other dtypes, more rows, autograd) torch's F.linear.
"""
import torch
import torch.nn.functional as F

# Rows of x up to which the C++ op beats F.linear on the demo pair's shapes, chosen per ISA of its
# tiles (kernels/linear AUTO_ROWS_BY_ISA: the AVX2 measurements are there). AVX-512
# (bench/bench_linear.py, 1 thread, AMD EPYC Zen 4, CPU-time medians, load ~2-3 on the shared 2-core box): lm_head
# 256 -> 4096 M=1 62 vs 112 us, M=5 162 vs 296 us, M=6 189 vs 294 us; every shape: M=6
# 0.64-0.98x, M=7 0.88-1.10x, M=8 1.25-1.47x of F.linear's time.
# A transposed ("cols", GPT-2 Conv1D) weight goes to C++ from 2 rows on: one row took 0.9-1.9x
# F.linear's time (its GEMV streams W^T better), 2 and 5 rows 0.4-1.0x (GPT-2 small shapes,
# 768 -> 2304 / 3072, 3072 -> 768, 768 -> 768).
from ..kernels.linear import AUTO_ROWS as CPP_MAX_ROWS  # noqa: E402

_cpp_ready = None  # lazily: whether torch.ops.specdec_fast.skinny_linear is there


def _cpp_available() -> bool:
    global _cpp_ready
    if _cpp_ready is None:
        from ..kernels._backend import cpp_op_available

        _cpp_ready = cpp_op_available("skinny_linear")
    return _cpp_ready


def _cpp_takes(x: torch.Tensor, weight: torch.Tensor, bias, residual) -> bool:
    k = x.shape[-1]
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and 0 < k and x.numel() <= CPP_MAX_ROWS * k and (k == 1 or x.stride(-1) == 1)
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
            and (residual is None or residual.dtype == torch.float32)
            and (weight.stride(1) == 1 or k == 1 or (x.numel() > k and (weight.stride(0) == 1 or weight.shape[0] <= 1)))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) and _cpp_available())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    if x.dim() >= 1 and _cpp_takes(x, weight, bias, residual):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        if residual is not None:
            residual = residual.reshape(-1, residual.shape[-1]) if residual.dim() != 2 else residual
            if residual.shape[-1] > 1 and residual.stride(-1) != 1:
                residual = residual.contiguous()
        y = torch.ops.specdec_fast.skinny_linear(x2, weight, bias, residual)
        return y if x.dim() == 2 else y.view(*lead, weight.shape[0])
    y = F.linear(x, weight, bias)
    return y if residual is None else residual + y


def linears(x: torch.Tensor, pairs) -> list:
    """[linear(x, weight, bias) for weight, bias in pairs]; x [T, in] (2-D). On the C++ path one
    dispatch for all of them (each dispatch from Python costs microseconds: the draft step is
    dominated by them)."""
    if x.dim() == 2 and all(_cpp_takes(x, w, b, None) for w, b in pairs):
        return torch.ops.specdec_fast.skinny_linear_n(x, [w for w, _ in pairs], [b for _, b in pairs])
    return [linear(x, w, b) for w, b in pairs]


def _checked_linears(x, weights, biases) -> list:
    return linears(x, tuple(zip(weights, biases)))


def layer_linears(rows: int, x_like: torch.Tensor, weights, biases):
    """The (linear, linears) functions for one forward whose activations are 2-D contiguous
    tensors like x_like with ``rows`` rows and whose weights/biases are those given (all of the
    layers'): the raw C++ ops when they take every one of them, else the checked functions above.
    Signatures: linear(x, weight, bias, residual), linears(x, weights, biases) -> list.
    Why: the checks cost ~2.6 us per call from Python (measured; a draft step makes 8 calls)."""
    if (x_like.dim() == 2 and x_like.is_contiguous() and x_like.shape[0] == rows
            and all(_cpp_takes(x_like, w, b, None) for w, b in zip(weights, biases))):
        ops = torch.ops.specdec_fast
        return ops.skinny_linear, ops.skinny_linear_n
    return linear, _checked_linears
