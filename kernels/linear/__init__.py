"""skinny_linear: y [M, N] = x [M, K] @ weight.T (+ bias) (+ residual) for few rows M;
skinny_linear_n: several weights applied to one x in one call (q/k/v, gate/up).

Backends: "cpp" (csrc/skinny_linear.cpp: streams the weight once whatever M is; float32 CPU
tensors, weight [N, K] with a unit stride along K or the transpose of a contiguous [K, N]
tensor, M <= MAX_ROWS), "triton" (triton.py: CUDA, or the interpreter; weight [N, K] with a
unit stride along K; tuned for M <= 16, correct for any M; also the runner's GEMV layer with
fused RMSNorm / SwiGLU prologues), "torch" (reference.py: F.linear; every other dtype and device).
backend=None picks "cpp" where it applies and M <= AUTO_ROWS (measured crossover), else "torch":
never "triton" until a GPU shows it faster than cuBLAS (bench/bench_gemv.py --gpu).
"""
import torch

from .._backend import cpp_op_available
from .._cpp_build import cpu_isa
from .reference import skinny_linear_n_reference, skinny_linear_reference

__all__ = ["skinny_linear", "skinny_linear_n", "skinny_linear_reference", "skinny_linear_n_reference", "cpp_applies",
           "MAX_ROWS", "AUTO_ROWS", "AUTO_ROWS_BY_ISA"]

MAX_ROWS = 16  # the rows the C++ op is offered for (backend="cpp"); it computes any M correctly
# backend=None takes the C++ op up to AUTO_ROWS rows, measured per ISA the op's tiles are
# compiled for (-march=native; torch.ops.specdec_fast.skinny_linear_isa() names it):
#  - "avx512": bench/bench_linear.py, 1 thread, Zen 4, CPU time, C++ / F.linear over the demo
#    pair's shapes: M=5 0.55-0.84, M=6 0.64-0.98, M=7 0.88-1.10, M=8 1.25-1.47 (torch's packed
#    sgemm wins from there). bench/results/linear_cpu.json.
#  - "avx2": bench/results/linear_cpu_avx2.json (AMD EPYC Zen 4 with AVX-512 hidden by the VM,
#    1 thread, CPU time), nn.Linear ("rows") weights: target shapes (K 256/688) M=5 0.62-0.89,
#    M=6 0.78-1.00, M=7 0.71-0.91, M=8 0.94-1.23; the draft's K=128 shapes lose a few us from
#    M=4 (M=5 1.02-1.11, M=6 1.16-1.24; the draft scores 1-2 rows per step, the target 5);
#    transposed ("cols") weights 0.51-0.77 at M=2..7, torch's GEMV better at M=1 on the lm_heads
#    (1.03-1.15, see _rows_layout).
#  - "generic" (neither): the tiles are not tuned there and nothing was measured: torch.
AUTO_ROWS_BY_ISA = {"avx512": 6, "avx2": 6, "generic": 0}
AUTO_ROWS = AUTO_ROWS_BY_ISA[cpu_isa()]


def _tensor(name, t, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")


def _check(x, weight, bias, residual):
    _tensor("x", x, 2)
    _tensor("weight", weight, 2)
    if not (x.is_floating_point() and weight.is_floating_point()):
        raise TypeError(f"x and weight must be floating point, got {x.dtype} and {weight.dtype}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight dtype {weight.dtype} differs from x dtype {x.dtype}")
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"weight must be [N, K] with K = {k} (x's last dim), got shape {tuple(weight.shape)}")
    for name, t, shape in (("bias", bias, (n,)), ("residual", residual, (m, n))):
        if t is None:
            continue
        _tensor(name, t, len(shape))
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {tuple(t.shape)}")
        if t.dtype != x.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from x dtype {x.dtype}")
    for name, t in (("weight", weight), ("bias", bias), ("residual", residual)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def _weight_layout_ok(weight) -> bool:
    n, k = weight.shape
    return k <= 1 or n <= 1 or weight.stride(1) == 1 or weight.stride(0) == 1


def cpp_applies(x, weight) -> bool:
    """Whether the C++ op takes these (static properties only): CPU float32, M <= MAX_ROWS,
    a weight layout it streams (unit stride along K or along N) and the op built."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.shape[0] <= MAX_ROWS and _weight_layout_ok(weight) and cpp_op_available("skinny_linear"))


def _pick(backend, x, weights) -> bool:
    """True for the C++ op (raises for an impossible explicit choice)."""
    if backend not in (None, "cpp", "torch"):
        raise ValueError(f"backend must be None, 'cpp', 'triton' or 'torch', got {backend!r}")
    applies = all(cpp_applies(x, w) for w in weights)
    if backend == "cpp" and not applies:
        raise ValueError("backend='cpp' needs float32 CPU tensors, at most MAX_ROWS rows of x, a weight with a unit "
                         "stride along K or N, and the C++ ops built")
    return backend == "cpp" or (backend is None and applies and x.shape[0] <= AUTO_ROWS
                                and (x.shape[0] > 1 or all(_rows_layout(w) for w in weights)))


def _rows_layout(weight) -> bool:
    """[N, K] with a unit stride along K (nn.Linear). The other layout (W^T contiguous, GPT-2's
    Conv1D) goes to C++ automatically from 2 rows on: for 1 row torch's GEMV was faster on
    some shapes (0.9-1.9x the time of F.linear, GPT-2 small shapes; 2 and 5 rows 0.4-1.0x)."""
    return weight.shape[1] <= 1 or weight.stride(1) == 1


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None, *, backend: str | None = None) -> torch.Tensor:
    """x [M, K], weight [N, K] (a view: may be the transpose of [K, N]), bias [N] or None,
    residual [M, N] or None -> y [M, N] = residual + (x @ weight.T + bias), in x's dtype."""
    _check(x, weight, bias, residual)
    if backend == "triton":
        return _skinny_linear_triton(x, weight, bias, residual)
    if not _pick(backend, x, [weight]):
        return skinny_linear_reference(x, weight, bias, residual)
    from .cpp import skinny_linear_cpp

    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    if bias is not None:
        bias = bias.contiguous()
    if residual is not None and residual.shape[1] > 1 and residual.stride(1) != 1:
        residual = residual.contiguous()
    return skinny_linear_cpp(x, weight, bias, residual)


def _skinny_linear_triton(x, weight, bias, residual):
    from .._backend import resolve_backend
    from .triton import skinny_linear_triton

    resolve_backend("triton", x.device, "skinny_linear")  # raises where Triton cannot run
    if weight.shape[1] > 1 and weight.stride(1) != 1:
        raise ValueError("backend='triton' needs a weight with a unit stride along K (nn.Linear's [N, K] layout)")
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    if residual is not None and residual.shape[1] > 1 and residual.stride(1) != 1:
        residual = residual.contiguous()
    return skinny_linear_triton(x, weight, None if bias is None else bias.contiguous(), residual)


def skinny_linear_n(x: torch.Tensor, weights, biases=None, *, backend: str | None = None) -> list:
    """x [M, K], weights: a sequence of [N_i, K], biases: a matching sequence of [N_i] or None
    (None: no biases) -> [x @ weights[i].T + biases[i]] as a list of [M, N_i] tensors."""
    if isinstance(weights, torch.Tensor) or not isinstance(weights, (list, tuple)) or not weights:
        raise TypeError("weights must be a non-empty list or tuple of tensors")
    biases = [None] * len(weights) if biases is None else list(biases)
    if len(biases) != len(weights):
        raise ValueError(f"biases must have one entry per weight ({len(weights)}), got {len(biases)}")
    for w, b in zip(weights, biases):
        _check(x, w, b, None)
    if backend == "triton":
        return [_skinny_linear_triton(x, w, b, None) for w, b in zip(weights, biases)]
    if not _pick(backend, x, weights):
        return skinny_linear_n_reference(x, weights, biases)
    from .cpp import skinny_linear_n_cpp

    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    return skinny_linear_n_cpp(x, weights, [None if b is None else b.contiguous() for b in biases])
