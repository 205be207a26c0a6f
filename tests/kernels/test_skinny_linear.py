"""skinny_linear: every backend against a float64 oracle over awkward sizes (M 1..16, K 33..688,
N 1..4096), both weight layouts (nn.Linear [N, K] and the transpose of a contiguous [K, N]),
bias / residual / neither, strided x rows; routing; bad input."""
import pytest
import torch

from specdec_fast.kernels.linear import AUTO_ROWS, MAX_ROWS, cpp_applies, skinny_linear, skinny_linear_reference
from tests.kernels.backends import ON_CUDA, cpp_tested, kernel_backends

BACKENDS = [b for b in kernel_backends() if b in ("cpp", "torch")]
needs_cpp = pytest.mark.skipif("cpp" not in BACKENDS, reason="the C++ backend is off here")


def _oracle(x, w, b, r):
    y = x.double() @ w.double().T
    if b is not None:
        y = y + b.double()
    return y if r is None else r.double() + y


def _weight(gen, n, k, layout):
    if layout == "rows":
        return torch.randn(n, k, generator=gen)
    return torch.randn(k, n, generator=gen).t()  # GPT-2 Conv1D: [K, N] storage, a view


def _tolerance(k):
    return 2e-6 * k  # fp32 sums of k products of N(0, 1) values (observed <= 2e-7 * k)


# (M, K, N): every M of the brief meets each K and N; the big N only with a mid K (keeps CI quick).
SIZES = [(m, k, n) for m in (1, 2, 5, 7, 16) for k, n in ((33, 111), (128, 1), (688, 111), (33, 1), (128, 4096))]
SIZES += [(5, 688, 4096), (16, 688, 4096), (3, 256, 688)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["rows", "cols"])
@pytest.mark.parametrize("m,k,n", SIZES)
def test_matches_float64_oracle(backend, layout, m, k, n):
    gen = torch.Generator().manual_seed(m * 7919 + k * 31 + n)
    x = torch.randn(m, k, generator=gen)
    w = _weight(gen, n, k, layout)
    for bias, residual in ((None, None), (torch.randn(n, generator=gen), None),
                           (torch.randn(n, generator=gen), torch.randn(m, n, generator=gen)),
                           (None, torch.randn(m, n, generator=gen))):
        y = skinny_linear(x, w, bias, residual, backend=backend)
        assert y.shape == (m, n) and y.dtype == torch.float32
        torch.testing.assert_close(y.double(), _oracle(x, w, bias, residual), rtol=0, atol=_tolerance(k))


@needs_cpp
@pytest.mark.parametrize("layout", ["rows", "cols"])
def test_strided_x_rows_and_noncontiguous_x(layout):
    """x rows with a gap (a slice of a wider tensor, as runner.prefill's hidden[:, -1]) are read in
    place; an x with a non-unit last stride is copied by the entry point."""
    gen = torch.Generator().manual_seed(3)
    w = _weight(gen, 50, 40, layout)
    wide = torch.randn(5, 3, 40, generator=gen)
    x = wide[:, -1]  # [5, 40], row stride 120
    assert x.stride() == (120, 1)
    torch.testing.assert_close(skinny_linear(x, w, backend="cpp").double(), _oracle(x, w, None, None), rtol=0, atol=1e-4)
    xt = torch.randn(40, 5, generator=gen).t()  # [5, 40], last stride 5
    torch.testing.assert_close(skinny_linear(xt, w, backend="cpp").double(), _oracle(xt, w, None, None), rtol=0, atol=1e-4)
    with pytest.raises(RuntimeError, match="unit stride in its last dim"):
        torch.ops.specdec_fast.skinny_linear(xt, w, None, None)


@needs_cpp
def test_cpp_is_deterministic_and_row_independent():
    """Row m's result does not depend on the other rows (tiles of 8 rows, remainders): M=16 rows
    equal the same rows computed one at a time."""
    gen = torch.Generator().manual_seed(5)
    x, w, b = torch.randn(16, 200, generator=gen), torch.randn(300, 200, generator=gen), torch.randn(300, generator=gen)
    full = skinny_linear(x, w, b, backend="cpp")
    rows = torch.cat([skinny_linear(x[i:i + 1], w, b, backend="cpp") for i in range(16)])
    assert torch.equal(full, rows)
    assert torch.equal(full, skinny_linear(x, w, b, backend="cpp"))


@needs_cpp
def test_empty_and_degenerate_sizes():
    w = torch.randn(7, 5)
    assert skinny_linear(torch.randn(0, 5), w, backend="cpp").shape == (0, 7)
    b = torch.randn(7)
    torch.testing.assert_close(skinny_linear(torch.randn(3, 0), torch.randn(7, 0), b, backend="cpp"), b.expand(3, 7))
    assert skinny_linear(torch.randn(2, 5), torch.randn(0, 5), backend="cpp").shape == (2, 0)


def test_routing(device):
    """The automatic choice on this machine's test device: C++ for float32 CPU tensors where the
    cpp column runs (within its shape rules), torch elsewhere (CUDA tensors, other dtypes)."""
    x, w = torch.randn(4, 8, device=device), torch.randn(6, 8, device=device)
    cpp_here = x.device.type == "cpu" and cpp_tested()
    assert cpp_applies(x, w) == cpp_here
    assert cpp_applies(x, torch.randn(8, 6, device=device).t()) == cpp_here
    assert not cpp_applies(torch.randn(MAX_ROWS + 1, 8, device=device), w)
    assert not cpp_applies(x.double(), w.double())
    assert not cpp_applies(x, torch.randn(6, 8, 2, device=device)[..., 0])  # no unit stride in either dim
    # the automatic choice: C++ up to AUTO_ROWS rows (measured crossover), torch above
    xm = torch.randn(AUTO_ROWS + 1, 8, device=device)
    assert cpp_applies(xm, w) == cpp_here
    assert torch.equal(skinny_linear(xm, w), skinny_linear_reference(xm, w))
    # the automatic choice falls back to torch where the C++ op does not apply
    xd, wd = torch.randn(20, 8, dtype=torch.float64, device=device), torch.randn(6, 8, dtype=torch.float64, device=device)
    torch.testing.assert_close(skinny_linear(xd, wd), skinny_linear_reference(xd, wd))
    xb, wb = x.bfloat16(), w.bfloat16()
    torch.testing.assert_close(skinny_linear(xb, wb), skinny_linear_reference(xb, wb))


def test_bad_input():
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        skinny_linear([[1.0]], w)
    with pytest.raises(ValueError, match="x must have 2 dims"):
        skinny_linear(torch.randn(3), w)
    with pytest.raises(ValueError, match="weight must be \\[N, K\\] with K = 8"):
        skinny_linear(x, torch.randn(5, 7))
    with pytest.raises(TypeError, match="weight dtype"):
        skinny_linear(x, w.double())
    with pytest.raises(TypeError, match="floating point"):
        skinny_linear(x.long(), w.long())
    with pytest.raises(ValueError, match="bias must have shape \\[5\\]"):
        skinny_linear(x, w, torch.randn(4))
    with pytest.raises(ValueError, match="residual must have shape \\[3, 5\\]"):
        skinny_linear(x, w, None, torch.randn(3, 4))
    with pytest.raises(TypeError, match="residual dtype"):
        skinny_linear(x, w, None, torch.randn(3, 5).double())
    with pytest.raises(ValueError, match="backend must be None, 'cpp', 'triton' or 'torch'"):
        skinny_linear(x, w, backend="cuda")
    with pytest.raises(ValueError, match="backend='cpp' needs"):
        skinny_linear(torch.randn(MAX_ROWS + 1, 8), w, backend="cpp")


@needs_cpp
def test_cpp_op_checks():
    from specdec_fast.kernels._cpp_build import load_cpu_ops

    assert load_cpu_ops(), "the C++ CPU ops must build on the test machine"  # not left to an earlier test in the worker
    op = torch.ops.specdec_fast.skinny_linear
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    with pytest.raises(RuntimeError, match="float32"):
        op(x.double(), w.double(), None, None)
    with pytest.raises(RuntimeError, match="unit stride along K"):
        op(x, torch.randn(5, 8, 2)[..., 0], None, None)
    with pytest.raises(RuntimeError, match="bias must be"):
        op(x, w, torch.randn(4), None)
    with pytest.raises(RuntimeError, match="residual must be"):
        op(x, w, None, torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="weight \\[N, K\\] must have K"):
        op(x, torch.randn(5, 9), None, None)


@pytest.mark.skipif(not ON_CUDA, reason="CUDA only")
def test_cuda_goes_to_torch():
    x, w = torch.randn(3, 8, device="cuda"), torch.randn(5, 8, device="cuda")
    assert not cpp_applies(x, w)
    torch.testing.assert_close(skinny_linear(x, w), skinny_linear_reference(x, w))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("m", [1, 5, 16])
def test_skinny_linear_n_equals_one_call_per_weight(backend, m):
    """q/k/v-like weights (different N, one with a bias, one in the transposed layout): each
    output equals skinny_linear of that weight alone, bit for bit on the same backend."""
    from specdec_fast.kernels.linear import skinny_linear_n

    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 48, generator=gen)
    weights = [torch.randn(64, 48, generator=gen), torch.randn(48, 16, generator=gen).t(), torch.randn(17, 48, generator=gen)]
    biases = [None, torch.randn(16, generator=gen), None]
    outs = skinny_linear_n(x, weights, biases, backend=backend)
    assert len(outs) == 3
    for out, w, b in zip(outs, weights, biases):
        assert torch.equal(out, skinny_linear(x, w, b, backend=backend))
        torch.testing.assert_close(out.double(), _oracle(x, w, b, None), rtol=0, atol=_tolerance(48))
    assert all(torch.equal(a, b) for a, b in zip(skinny_linear_n(x, weights[:1], backend=backend), outs[:1]))


def test_skinny_linear_n_bad_input():
    from specdec_fast.kernels.linear import skinny_linear_n

    x = torch.randn(2, 8)
    with pytest.raises(TypeError, match="non-empty list"):
        skinny_linear_n(x, torch.randn(4, 8))
    with pytest.raises(TypeError, match="non-empty list"):
        skinny_linear_n(x, [])
    with pytest.raises(ValueError, match="one entry per weight"):
        skinny_linear_n(x, [torch.randn(4, 8)], [None, None])
    with pytest.raises(ValueError, match="K = 8"):
        skinny_linear_n(x, [torch.randn(4, 8), torch.randn(4, 9)])
    if "cpp" in BACKENDS:
        from specdec_fast.kernels._cpp_build import load_cpu_ops

        assert load_cpu_ops(), "the C++ CPU ops must build on the test machine"
        with pytest.raises(RuntimeError, match="one entry"):
            torch.ops.specdec_fast.skinny_linear_n(x, [torch.randn(4, 8)], [])
