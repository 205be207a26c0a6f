"""The Triton skinny linear (kernels/linear/triton.py) against its float64 spec
(fused_linear_reference) on the test device (CUDA, else the interpreter): every prologue x bias /
residual x rows 1..17 (both inner products: the elementwise one-row path and the tl.dot path,
a partial second tile of rows) x awkward N and K (tails of both tiles), strided rows of x, three
dtypes, explicit tile configs, out=; and controls showing the check catches a dropped K tail, a
missing norm statistic, gate and up swapped, and (CUDA) an unrounded silu."""
import pytest
import torch

from specdec_fast.kernels.linear.reference import fused_linear_reference
from specdec_fast.kernels.llama_ops.reference import rms_norm_reference

triton_mod = pytest.importorskip("specdec_fast.kernels.linear.triton")
GemvConfig, skinny_linear_triton = triton_mod.GemvConfig, triton_mod.skinny_linear_triton


def _ulp(dtype):
    return {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]


def _close(got, want, k, dtype, device, residual=None, rounded_terms=None):
    """|got - want| <= an ulp of the output's dtype at its magnitude (at the residual's too: the
    product is rounded before the residual is added), plus the float32 sum's error over k terms.
    The interpreter truncates float32 -> bfloat16 (tests/kernels/test_llama_ops_triton.py
    exact_rounding) where torch rounds to nearest: 2 ulps there instead of 1, and a prologue's
    rounded inputs may each be an ulp off, which moves the product by at most an ulp times
    rounded_terms (= sum |input| |weight| per output, the caller's bound)."""
    got, want = got.double().cpu(), want.double().cpu()
    truncating = dtype == torch.bfloat16 and torch.device(device).type != "cuda"
    scale = want.abs() if residual is None else want.abs() + residual.double().cpu().abs()
    limit = (2.0 if truncating else 1.0) * _ulp(dtype) * scale + 1e-6 * k ** 0.5 * (want.abs().max() + 1) + _ulp(dtype) * 1e-2
    if truncating and rounded_terms is not None:
        limit = limit + _ulp(dtype) * rounded_terms
    return bool(((got - want).abs() <= limit).all()), float((got - want).abs().max())


def _rounded_terms(p):
    """sum_k |h_k| |W_nk| (times the norm's statistic) for a prologue that rounds its output h per
    element, else None: the bound of an ulp's error in every h_k."""
    x, w = p["x"].cpu().double(), p["weight"].cpu().double()
    k = w.shape[1]
    if p["prologue"] == "none":
        return None
    if p["prologue"] == "silu_mul":
        return (torch.nn.functional.silu(x[:, :k]) * x[:, k:]).abs() @ w.abs().T
    scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + p["eps"])
    return scale * ((x * p["norm_weight"].cpu().double()).abs() @ w.abs().T)


def _problem(m, n, k, dtype, device, *, prologue="none", bias=False, residual=False, pad=0, seed=0):
    gen = torch.Generator().manual_seed(seed * 1009 + m * 97 + n * 13 + k)
    width = 2 * k if prologue == "silu_mul" else k
    x = (torch.randn(m, width + pad, generator=gen) * 2).to(dtype).to(device)[:, :width]
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
    r = (torch.randn(m, n, generator=gen) * 4).to(dtype).to(device) if residual else None
    nw = (1 + torch.randn(k, generator=gen) / 4).to(dtype).to(device) if prologue == "rms_norm" else None
    return dict(x=x, weight=w, bias=b, residual=r, prologue=prologue, norm_weight=nw, eps=1e-5)


def _run(p, **kw):
    return skinny_linear_triton(p["x"], p["weight"], p["bias"], p["residual"], prologue=p["prologue"],
                                norm_weight=p["norm_weight"], eps=p["eps"], **kw)


def _spec(p):
    return fused_linear_reference(p["x"].cpu(), p["weight"].cpu(), None if p["bias"] is None else p["bias"].cpu(),
                                  None if p["residual"] is None else p["residual"].cpu(), prologue=p["prologue"],
                                  norm_weight=None if p["norm_weight"] is None else p["norm_weight"].cpu(), eps=p["eps"])


# (M, N, K): one row and many (a whole and a partial dot tile, a second tile), N and K with tails
# of every tile in use (the interpreter's 64 x 256 and the tests' configs below), K = 16 (one step).
SHAPES = [(1, 64, 256), (1, 100, 80), (1, 1, 16), (2, 64, 256), (5, 130, 300), (16, 17, 64), (17, 64, 48)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("prologue", ["none", "rms_norm", "silu_mul"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_spec(m, n, k, prologue, dtype, device):
    extras = (m + n) % 3  # 0: neither, 1: bias, 2: bias and residual (spread over the table)
    p = _problem(m, n, k, dtype, device, prologue=prologue, bias=extras >= 1, residual=extras == 2, pad=3 * (m % 2))
    y = _run(p)
    assert y.shape == (m, n) and y.dtype == dtype and y.device == p["x"].device
    ok, err = _close(y, _spec(p), k, dtype, device, p["residual"], _rounded_terms(p))
    assert ok, f"max error {err}"


@pytest.mark.parametrize("config", [GemvConfig(16, 32, 4, 1), GemvConfig(32, 64, 4, 2), GemvConfig(16, 16, 1, 1)])
@pytest.mark.parametrize("m", [1, 6])
def test_explicit_tile_configs(m, config, device):
    """The GPU's tile shapes (several N and K tiles, tails) give the same values as the defaults."""
    p = _problem(m, 70, 200, torch.float32, device, prologue="rms_norm", bias=True, residual=True)
    ok, err = _close(_run(p, config=config), _spec(p), 200, torch.float32, device, p["residual"])
    assert ok, f"max error {err}"


def test_out_and_residual_in_place(device):
    """out= writes into a caller's buffer; out aliasing the residual (x += W h) is allowed: each
    element is read before it is written, by the same program."""
    p = _problem(3, 40, 64, torch.float32, device, residual=True)
    want = _spec(p)
    buf = torch.full((3, 40), 7.0, device=device)
    assert _run(p, out=buf).data_ptr() == buf.data_ptr()
    assert _close(buf, want, 64, torch.float32, device, p["residual"])[0]
    res = p["residual"].clone()
    skinny_linear_triton(p["x"], p["weight"], None, res, out=res)
    assert _close(res, want, 64, torch.float32, device, p["residual"])[0]


def test_public_entry_points(device):
    """skinny_linear / skinny_linear_n(backend="triton") run this kernel after the module's checks:
    the values of the spec, a strided x made contiguous, the transposed (Conv1D) layout refused."""
    from specdec_fast.kernels.linear import skinny_linear, skinny_linear_n

    p = _problem(4, 48, 96, torch.float32, device, bias=True, residual=True, pad=5)
    y = skinny_linear(p["x"], p["weight"], p["bias"], p["residual"], backend="triton")
    assert _close(y, _spec(p), 96, torch.float32, device, p["residual"])[0]
    ys = skinny_linear_n(p["x"], [p["weight"], p["weight"][:7]], [p["bias"], None], backend="triton")
    assert _close(ys[0], _spec(dict(p, residual=None)), 96, torch.float32, device)[0]
    assert _close(ys[1], _spec(dict(p, weight=p["weight"][:7], bias=None, residual=None)), 96, torch.float32, device)[0]
    assert _close(skinny_linear(p["x"].t().contiguous().t(), p["weight"], backend="triton"),
                  _spec(dict(p, bias=None, residual=None)), 96, torch.float32, device)[0]
    with pytest.raises(ValueError, match="unit stride along K"):
        skinny_linear(p["x"], p["weight"].t().contiguous().t(), backend="triton")


def test_empty_and_bad_prologue(device):
    x = torch.zeros(0, 8, device=device)
    assert skinny_linear_triton(x, torch.zeros(4, 8, device=device)).shape == (0, 4)
    with pytest.raises(ValueError, match="prologue"):
        skinny_linear_triton(torch.zeros(1, 8, device=device), torch.zeros(4, 8, device=device), prologue="gelu")


def test_rms_norm_prologue_near_transformers_order(device):
    """The fused order (statistic applied after the product) stays within a few bf16 ulps of
    F.linear(transformers' RMSNorm) -- the difference the module's doc states."""
    p = _problem(5, 96, 512, torch.bfloat16, device, prologue="rms_norm")
    y = _run(p).double().cpu()
    h = rms_norm_reference(p["x"].cpu(), p["norm_weight"].cpu(), p["eps"])
    ref = torch.nn.functional.linear(h.double(), p["weight"].cpu().double())
    assert ((y - ref).abs() <= 8 * _ulp(torch.bfloat16) * (ref.abs() + ref.abs().mean())).all()


def test_controls_catch_the_feared_mistakes(device):
    """The comparison, at the tolerance the table uses, rejects a product missing the last K
    column (a tail mask off by one), the rms_norm prologue without its statistic, silu_mul with
    gate and up swapped, and (CUDA) silu_mul without silu's rounding."""
    def close(y, want, p):
        return _close(y, want, 80, torch.bfloat16, device, p["residual"], _rounded_terms(p))[0]

    p = _problem(5, 64, 80, torch.bfloat16, device, prologue="none")
    y = _run(p)
    assert close(y, _spec(p), p)
    assert not close(y, _spec(dict(p, x=p["x"][:, :79], weight=p["weight"][:, :79])), p)
    p = _problem(5, 64, 80, torch.bfloat16, device, prologue="rms_norm")
    h = (p["x"].cpu().float() * p["norm_weight"].cpu().float()).to(torch.bfloat16)
    no_statistic = (h.double() @ p["weight"].cpu().double().T).to(torch.bfloat16)
    assert close(_run(p), _spec(p), p)
    assert not close(_run(p), no_statistic, p)
    p = _problem(16, 64, 80, torch.bfloat16, device, prologue="silu_mul", seed=4)
    swapped = _spec(dict(p, x=torch.cat([p["x"][:, 80:], p["x"][:, :80]], 1)))  # up read as gate
    assert close(_run(p), _spec(p), p)
    assert not close(_run(p), swapped, p)
    if torch.device(device).type == "cuda":  # the interpreter's truncation hides half an ulp per input
        gate, up = p["x"][:, :80].cpu().double(), p["x"][:, 80:].cpu().double()
        unrounded = ((torch.nn.functional.silu(gate) * up) @ p["weight"].cpu().double().T).to(torch.bfloat16)
        assert not close(_run(p), unrounded, p), "silu's rounding is visible at 1 ulp"
