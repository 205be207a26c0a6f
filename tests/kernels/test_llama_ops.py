"""The fused Llama-layer ops (rms_norm, rope_qk_, silu_mul): every backend against the torch
reference / a float64 oracle over awkward sizes and strides, and bad input."""
import pytest
import torch

from specdec_fast.kernels.llama_ops import (fused_cpp_applies, rms_norm, rms_norm_reference, rope_qk_, rope_qk_reference,
                                            silu_mul, silu_mul_reference)
from tests.kernels.backends import cpp_tested, kernel_backends

BACKENDS = [b for b in kernel_backends() if b in ("cpp", "torch")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t,h", [(1, 1), (1, 128), (5, 33), (7, 256), (16, 4096)])
def test_rms_norm(backend, t, h):
    gen = torch.Generator().manual_seed(t * 100 + h)
    x, w = torch.randn(t, h, generator=gen) * 3, torch.randn(h, generator=gen)
    y = rms_norm(x, w, 1e-5, backend=backend)
    xd = x.double()
    oracle = w.double() * (xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert y.dtype == torch.float32 and y.shape == (t, h)
    torch.testing.assert_close(y.double(), oracle, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y, rms_norm_reference(x, w, 1e-5), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_strided_rows_and_tiny_values(backend):
    gen = torch.Generator().manual_seed(1)
    wide = torch.randn(4, 3, 40, generator=gen)
    x, w = wide[:, 1], torch.randn(40, generator=gen)  # rows 120 apart
    torch.testing.assert_close(rms_norm(x, w, 1e-6, backend=backend), rms_norm_reference(x, w, 1e-6))
    zero = torch.zeros(2, 40)  # eps keeps it finite: 0 * rsqrt(eps) = 0
    assert torch.equal(rms_norm(zero, w, 1e-6, backend=backend), torch.zeros(2, 40))
    xt = torch.randn(40, 3, generator=gen).t()  # non-unit last stride: the entry point copies
    torch.testing.assert_close(rms_norm(xt, w, 1e-6, backend=backend), rms_norm_reference(xt, w, 1e-6))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t,hq,hk,d,r", [(1, 1, 1, 2, 2), (1, 8, 2, 32, 32), (5, 8, 2, 32, 32), (7, 4, 4, 64, 64),
                                         (3, 12, 1, 128, 128), (2, 2, 2, 6, 6),
                                         (5, 8, 2, 64, 32), (3, 4, 2, 80, 60)])  # partial: the first r dims rotated
def test_rope_qk_bit_identical_to_reference(backend, t, hq, hk, d, r):
    """Same float ops in the same order as the torch expression: equal bit for bit (the partial
    forms' passed dims untouched)."""
    gen = torch.Generator().manual_seed(t * 1000 + hq * 10 + d)
    q, k = torch.randn(t, hq, d, generator=gen), torch.randn(t, hk, d, generator=gen)
    ang = torch.randn(t, r, generator=gen) * 10
    cos, sin = ang.cos(), ang.sin()
    q_ref, k_ref = q.clone(), k.clone()
    rope_qk_reference(q_ref, k_ref, cos, sin)
    passed = q[..., r:].clone()
    rope_qk_(q, k, cos, sin, backend=backend)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref) and torch.equal(q[..., r:], passed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_qk_on_strided_views(backend):
    """q and k as head-strided views of one fused qkv buffer (rows of 3 heads): rotated in place,
    the v part untouched."""
    gen = torch.Generator().manual_seed(9)
    qkv = torch.randn(4, 3, 16, generator=gen)
    before = qkv.clone()
    cos, sin = torch.randn(4, 16, generator=gen), torch.randn(4, 16, generator=gen)
    q_ref, k_ref = before[:, :2].clone(), before[:, 2:].clone()
    rope_qk_reference(q_ref, k_ref, cos, sin)
    rope_qk_(qkv[:, :2], qkv[:, 2:], cos, sin, backend=backend)
    assert torch.equal(qkv[:, :2], q_ref) and torch.equal(qkv[:, 2:], k_ref)


def test_rope_rotation_by_hand():
    """D=4, angle pi/2 on every frequency: (a, b, c, d) -> (-c, -d, a, b)."""
    q = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    k = q.clone()
    cos, sin = torch.zeros(1, 4), torch.ones(1, 4)
    rope_qk_(q, k, cos, sin)
    assert torch.equal(q, torch.tensor([[[-3.0, -4.0, 1.0, 2.0]]])) and torch.equal(k, q)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t,f", [(1, 1), (1, 256), (5, 688), (7, 33), (16, 1000)])
def test_silu_mul(backend, t, f):
    gen = torch.Generator().manual_seed(t + f)
    gate, up = torch.randn(t, f, generator=gen) * 8, torch.randn(t, f, generator=gen)
    gate[0, 0] = -200.0  # exp overflow side: silu -> -0
    y = silu_mul(gate, up, backend=backend)
    g = gate.double()
    torch.testing.assert_close(y.double(), g / (1 + torch.exp(-g)) * up.double(), rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(y, silu_mul_reference(gate, up), rtol=2e-6, atol=1e-6)


def test_routing(device):
    """The automatic choice on this machine's test device: C++ for float32 CPU tensors where the
    cpp column runs, torch elsewhere (CUDA tensors, other dtypes)."""
    x = torch.randn(2, 4, device=device)
    assert fused_cpp_applies(x) == (x.device.type == "cpu" and cpp_tested())
    assert not fused_cpp_applies(x.double())
    xd, wd = x.double(), torch.randn(4, dtype=torch.float64, device=device)
    torch.testing.assert_close(rms_norm(xd, wd, 1e-6), rms_norm_reference(xd, wd, 1e-6))  # falls back to torch
    xb = x.bfloat16()
    torch.testing.assert_close(silu_mul(xb, xb), silu_mul_reference(xb, xb))


def test_bad_input():
    x, w = torch.randn(3, 8), torch.randn(8)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        rms_norm([1.0], w, 1e-6)
    with pytest.raises(ValueError, match="weight must have shape \\[8\\]"):
        rms_norm(x, torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match="eps must be"):
        rms_norm(x, w, -1.0)
    with pytest.raises(TypeError, match="weight dtype"):
        rms_norm(x, w.double(), 1e-6)
    with pytest.raises(ValueError, match="backend must be"):
        rms_norm(x, w, 1e-6, backend="vllm")
    q, k, c = torch.randn(2, 4, 8), torch.randn(2, 1, 8), torch.randn(2, 8)
    with pytest.raises(ValueError, match="k must be"):
        rope_qk_(q, torch.randn(3, 1, 8), c, c)
    with pytest.raises(ValueError, match="sin must have shape \\[2, R\\] \\(R even, at most 8, as cos\\)"):
        rope_qk_(q, k, torch.randn(2, 1, 8)[:, 0, :4], c)  # a partial cos, a full sin
    with pytest.raises(ValueError, match="cos must have shape \\[2, R\\]"):
        rope_qk_(q, k, torch.randn(2, 3), torch.randn(2, 3))  # an odd width
    with pytest.raises(ValueError, match="head_dim must be even"):
        rope_qk_(torch.randn(2, 4, 7), torch.randn(2, 1, 7), torch.randn(2, 7), torch.randn(2, 7))
    with pytest.raises(ValueError, match="q must have 3 dims"):
        rope_qk_(torch.randn(2, 8), k, c, c)
    with pytest.raises(ValueError, match="one shape"):
        silu_mul(x, torch.randn(3, 7))
    with pytest.raises(TypeError, match="floating point"):
        silu_mul(x.long(), x.long())


@pytest.mark.skipif("cpp" not in BACKENDS, reason="the C++ backend is off here")
def test_cpp_op_checks():
    from specdec_fast.kernels._cpp_build import load_cpu_ops

    assert load_cpu_ops(), "the C++ CPU ops must build on the test machine"  # not left to an earlier test in the worker
    ops = torch.ops.specdec_fast
    with pytest.raises(RuntimeError, match="float32"):
        ops.rms_norm(torch.randn(2, 4).double(), torch.randn(4).double(), 1e-6)
    with pytest.raises(RuntimeError, match="weight must be"):
        ops.rms_norm(torch.randn(2, 4), torch.randn(5), 1e-6)
    with pytest.raises(RuntimeError, match="cos and sin must be"):
        ops.rope_qk_(torch.randn(2, 4, 8), torch.randn(2, 1, 8), torch.randn(2, 8), torch.randn(3, 8))
    with pytest.raises(RuntimeError, match="head_dim must be even"):
        ops.rope_qk_(torch.randn(2, 4, 7), torch.randn(2, 1, 7), torch.randn(2, 7), torch.randn(2, 7))
    with pytest.raises(RuntimeError, match="one shape"):
        ops.silu_mul(torch.randn(2, 4), torch.randn(2, 5))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_rope_cos_sin(backend, dtype):
    """Against a float64 evaluation of the float32 angles: within one float32 ulp (the C++ op
    rounds once from double; torch's float cos/sin are within ~1 ulp too)."""
    from specdec_fast.kernels.llama_ops import rope_cos_sin, rope_cos_sin_reference

    positions = torch.tensor([0, 1, 7, 100, 4095, 70000], dtype=dtype)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32))
    for scaling in (1.0, 0.75):
        cos, sin = rope_cos_sin(positions, inv_freq, scaling, backend=backend)
        assert cos.shape == sin.shape == (6, 32) and cos.dtype == torch.float32
        angle = (positions.to(torch.float32)[:, None] * inv_freq[None, :]).double()
        angle = torch.cat((angle, angle), -1)
        torch.testing.assert_close(cos.double(), angle.cos() * scaling, rtol=0, atol=2.4e-7)
        torch.testing.assert_close(sin.double(), angle.sin() * scaling, rtol=0, atol=2.4e-7)
        ref_cos, ref_sin = rope_cos_sin_reference(positions, inv_freq, scaling)
        torch.testing.assert_close(cos, ref_cos, rtol=0, atol=2.4e-7)
        torch.testing.assert_close(sin, ref_sin, rtol=0, atol=2.4e-7)


def test_rope_cos_sin_bad_input():
    from specdec_fast.kernels.llama_ops import rope_cos_sin

    inv = torch.ones(4)
    with pytest.raises(TypeError, match="positions must be"):
        rope_cos_sin(torch.ones(3), inv)
    with pytest.raises(TypeError, match="inv_freq must be float32"):
        rope_cos_sin(torch.arange(3), inv.double())
    with pytest.raises(TypeError, match="scaling must be"):
        rope_cos_sin(torch.arange(3), inv, "1")
