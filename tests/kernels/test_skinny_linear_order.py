"""skinny_linear (C++): the summation order the AVX-512 and the AVX2 tiles share, bit for bit,
against a float32 torch emulation of it; awkward sizes for every row tile (M 1..7, chunks of 11
and 16 rows) and column tails (N % 8, N % 16, K % 16); the ISA the library reports."""
import pytest
import torch

from specdec_fast.kernels._cpp_build import cpu_isa
from specdec_fast.kernels.linear import AUTO_ROWS, AUTO_ROWS_BY_ISA, skinny_linear
from tests.kernels.backends import kernel_backends

pytestmark = pytest.mark.skipif("cpp" not in kernel_backends(), reason="the C++ backend is off here")


@pytest.fixture(autouse=True, scope="module")
def _cpu_ops():
    """The library loaded for the tests that call torch.ops.specdec_fast directly (not left to an earlier test in
    the worker: alone, they found no op)."""
    from specdec_fast.kernels._cpp_build import load_cpu_ops

    assert load_cpu_ops(), "the C++ CPU ops must build on the test machine"


def _emulate(x, w, bias, residual):
    """y [M, N] float32 summed in csrc/skinny_linear.cpp's order. "rows" weights (unit stride
    along K): 16 lane accumulators over k steps of 16, reduced (l + l+8, halves, then
    (l0 + l2) + (l1 + l3)), then the K % 16 tail in k order. "cols" weights: k order. Then
    + bias, then residual +. Each product is rounded once (no FMA), as -ffp-contract=off makes it."""
    m, k = x.shape
    prod = x[:, None, :] * w[None, :, :]  # [M, N, K], float32
    if k <= 1 or w.stride(1) == 1:
        k16 = k - k % 16
        acc = torch.zeros(m, w.shape[0], 16)
        for b in range(0, k16, 16):
            acc = acc + prod[:, :, b:b + 16]
        s8 = acc[..., :8] + acc[..., 8:]
        s4 = s8[..., :4] + s8[..., 4:]
        y = (s4[..., 0] + s4[..., 2]) + (s4[..., 1] + s4[..., 3])
    else:
        k16, y = 0, torch.zeros(m, w.shape[0])
    for i in range(k16, k):
        y = y + prod[:, :, i]
    if bias is not None:
        y = y + bias
    return y if residual is None else residual + y


@pytest.mark.parametrize("layout", ["rows", "cols"])
@pytest.mark.parametrize("k,n", [(1, 7), (15, 9), (16, 17), (33, 65), (130, 130), (47, 200)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 11, 16])
def test_bits_equal_the_documented_order(layout, m, k, n):
    gen = torch.Generator().manual_seed(m * 1009 + k * 37 + n)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) if layout == "rows" else torch.randn(k, n, generator=gen).t()
    bias, residual = torch.randn(n, generator=gen), torch.randn(m, n, generator=gen)
    for b, r in ((None, None), (bias, None), (bias, residual), (None, residual)):
        y = skinny_linear(x, w, b, r, backend="cpp")
        assert torch.equal(y, _emulate(x, w, b, r)), (layout, m, k, n, b is None, r is None)


def test_library_reports_the_isa_routing_assumes():
    """The tiles compiled (-march=native) are the ones AUTO_ROWS was measured for."""
    assert torch.ops.specdec_fast.skinny_linear_isa() == cpu_isa()
    assert AUTO_ROWS == AUTO_ROWS_BY_ISA[cpu_isa()]
