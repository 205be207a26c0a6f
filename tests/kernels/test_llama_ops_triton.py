"""The Triton Llama-layer ops (add_rms_norm, rms_norm, silu_mul; kernels/llama_ops/triton.py)
against the torch reference over awkward sizes, strided rows and the three dtypes, on the test
device (CUDA, else the interpreter); and add_rms_norm's reference against a float64 oracle."""
import pytest
import torch

from specdec_fast.kernels.llama_ops import add_rms_norm, add_rms_norm_reference, rms_norm, silu_mul, silu_mul_reference

pytest.importorskip("triton")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# one float ulp of each dtype at 1.0 (the kernels round once where torch rounds once; rsqrt,
# exp and the sum order may still move the last bit)
TOL = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def exact_rounding(dtype, device) -> bool:
    """Whether x.to(dtype) in a kernel rounds to nearest even here. The interpreter (triton 3.6)
    truncates float32 -> bfloat16 (its cast keeps the top 16 bits); CUDA rounds to nearest."""
    return dtype != torch.bfloat16 or torch.device(device).type == "cuda"


def tol(dtype, device) -> float:
    """TOL, or 4 bfloat16 ulps where three chained roundings may each truncate (interpreter)."""
    return TOL[dtype] if exact_rounding(dtype, device) else 4 * TOL[dtype]


def _rows(gen, t, h, dtype, device, scale=3.0, stride_pad=0):
    """[t, h] in dtype on device; with stride_pad the rows lie h + stride_pad apart (a view)."""
    base = (torch.randn(t, h + stride_pad, generator=gen) * scale).to(dtype)
    return base.to(device)[:, :h]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h,pad", [(1, 1, 0), (1, 64, 0), (3, 33, 5), (5, 200, 0), (2, 4096, 16)])
def test_add_rms_norm_matches_reference(dtype, t, h, pad, device):
    gen = torch.Generator().manual_seed(t * 7 + h)
    x, delta = _rows(gen, t, h, dtype, device, stride_pad=pad), _rows(gen, t, h, dtype, device, stride_pad=2 * pad)
    w = _rows(gen, 1, h, dtype, device, scale=1.0)[0]
    res, out = add_rms_norm(x, delta, w, 1e-5, backend="triton")
    res_ref, out_ref = add_rms_norm_reference(x.cpu(), delta.cpu(), w.cpu(), 1e-5)
    assert res.dtype == out.dtype == dtype and res.shape == out.shape == (t, h)
    limit = tol(dtype, device)
    if exact_rounding(dtype, device):
        assert torch.equal(res.cpu(), res_ref), "the residual is one rounded add, as torch's"
    else:
        torch.testing.assert_close(res.cpu(), res_ref, rtol=limit, atol=limit)
    torch.testing.assert_close(out.cpu(), out_ref, rtol=limit, atol=limit)
    # write_residual=False (the final norm) and delta=None (the first layer's norm)
    none, out2 = add_rms_norm(x, delta, w, 1e-5, write_residual=False, backend="triton")
    assert none is None and torch.equal(out2, out)
    _, plain = add_rms_norm(x, None, w, 1e-5, backend="triton")
    torch.testing.assert_close(plain.cpu(), rms_norm(x.cpu(), w.cpu(), 1e-5, backend="torch"), rtol=limit, atol=limit)
    torch.testing.assert_close(rms_norm(x, w, 1e-5, backend="triton"), plain, rtol=0, atol=0)


def test_add_rms_norm_reference_against_float64():
    gen = torch.Generator().manual_seed(3)
    x, d, w = torch.randn(4, 48, generator=gen), torch.randn(4, 48, generator=gen), torch.randn(48, generator=gen)
    res, out = add_rms_norm_reference(x, d, w, 1e-6)
    r = x.double() + d.double()
    oracle = w.double() * r / torch.sqrt(r.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(res.double(), r, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(out.double(), oracle, rtol=1e-5, atol=1e-6)


def test_add_rms_norm_zero_rows_and_bad_input(device):
    w = torch.ones(8, device=device)
    res, out = add_rms_norm(torch.zeros(0, 8, device=device), torch.zeros(0, 8, device=device), w, 1e-6, backend="triton")
    assert res.shape == out.shape == (0, 8)
    zero = torch.zeros(2, 8, device=device)  # eps keeps it finite
    assert torch.equal(add_rms_norm(zero, zero, w, 1e-6, backend="triton")[1], zero)
    with pytest.raises(ValueError, match="delta must have x's shape"):
        add_rms_norm(torch.zeros(2, 8), torch.zeros(2, 7), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="no C\\+\\+ backend"):
        add_rms_norm(torch.zeros(2, 8), None, torch.ones(8), 1e-6, backend="cpp")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,f", [(1, 1), (2, 96), (3, 1000), (1, 2100)])
def test_silu_mul_reads_gate_up_in_place(dtype, t, f, device):
    """gate and up as the two halves of one [T, 2F] product (row stride 2F), as the runner passes them."""
    gen = torch.Generator().manual_seed(t + f)
    gate_up = (torch.randn(t, 2 * f, generator=gen) * 6).to(dtype)
    gate_up[0, 0] = -100.0  # exp overflow side: silu -> -0
    gu = gate_up.to(device)
    y = silu_mul(gu[:, :f], gu[:, f:], backend="triton")
    expected = silu_mul_reference(gate_up[:, :f], gate_up[:, f:])
    assert y.dtype == dtype and y.shape == (t, f) and y.is_contiguous()
    limit = tol(dtype, device)
    torch.testing.assert_close(y.cpu(), expected, rtol=limit, atol=limit)


def test_backend_choice(device):
    x = torch.randn(2, 4, device=device)
    with pytest.raises(ValueError, match="backend must be"):
        silu_mul(x, x, backend="vllm")
    torch.testing.assert_close(silu_mul(x, x, backend="triton"), silu_mul_reference(x, x))  # interpreter / CUDA


@pytest.mark.slow
def test_layer_kernels_compile_for_sm90():
    """Ahead-of-time compile of add_rms_norm, silu_mul and rope_append_kv for an H100 in a
    process without the interpreter (typing, layouts, ptxas), as the attention kernels are."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(__file__), "aot_compile_layer_ops.py")
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas in this triton install")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "layer ops ok" in proc.stdout
