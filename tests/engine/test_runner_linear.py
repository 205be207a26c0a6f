"""runners/_linear.linear and runners/_layer_math: the C++ path (CPU float32, few rows) and the
torch path give the same results as the plain torch expressions, for every input shape the
runners pass (3-D x, a strided row slice, GPT-2's transposed weight view, bias, residual)."""
import pytest
import torch
import torch.nn.functional as F

import specdec_fast.runners._linear as runner_linear
from specdec_fast.runners._layer_math import fused_layer_math, gated_act, rms_norm, rope_cos_sin, rotate_qk
from specdec_fast.runners._linear import linear


def _cases(gen):
    w = torch.randn(24, 16, generator=gen)
    wt = torch.randn(16, 24, generator=gen).t()  # Conv1D layout
    b, x3 = torch.randn(24, generator=gen), torch.randn(2, 3, 16, generator=gen)
    yield torch.randn(5, 16, generator=gen), w, b, torch.randn(5, 24, generator=gen)
    yield x3, wt, b, torch.randn(2, 3, 24, generator=gen)
    yield x3[:, -1], w, None, None  # strided rows, as prefill's hidden[:, -1]
    yield torch.randn(40, 16, generator=gen), wt, b, None  # more rows than CPP_MAX_ROWS: torch
    yield torch.randn(3, 16, generator=gen).double(), w.double(), None, None  # float64: torch


@pytest.mark.parametrize("max_rows", [0, runner_linear.CPP_MAX_ROWS])
def test_linear_matches_torch(monkeypatch, max_rows):
    monkeypatch.setattr(runner_linear, "CPP_MAX_ROWS", max_rows)  # 0: every call takes the torch path
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for x, w, b, r in _cases(gen):
            expected = F.linear(x, w, b) if r is None else r + F.linear(x, w, b)
            got = linear(x, w, b, r)
            assert got.shape == expected.shape and got.dtype == expected.dtype
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_linear_keeps_autograd():
    """With gradients on, linear stays on torch (the C++ op has no backward)."""
    w = torch.randn(4, 3, requires_grad=True)
    linear(torch.randn(2, 3), w).sum().backward()
    assert w.grad is not None and w.grad.shape == (4, 3)


@pytest.mark.parametrize("fused", [False, True])
def test_layer_math_matches_torch(fused):
    if fused and not fused_layer_math(torch.float32, "cpu"):
        pytest.skip("the C++ ops are off here")
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 32, generator=gen), torch.randn(32, generator=gen)
    torch.testing.assert_close(rms_norm(x, w, 1e-6, fused), w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)))
    heads = torch.randn(5, 4, 8, generator=gen)  # qk-norm over head_dim of a 3-D tensor
    torch.testing.assert_close(rms_norm(heads, w[:8], 1e-6, fused),
                               w[:8] * (heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-6)))
    cos, sin = rope_cos_sin(torch.arange(5) + 7, 1.0 / 500 ** (torch.arange(0, 8, 2) / 8), 1.0, torch.float32)
    assert cos.shape == (5, 8)
    q, k = torch.randn(5, 4, 8, generator=gen), torch.randn(5, 2, 8, generator=gen)
    rot = lambda t: t * cos[:, None] + torch.cat((-t[..., 4:], t[..., :4]), -1) * sin[:, None]
    eq, ek = rot(q), rot(k)
    q2, k2 = rotate_qk(q, k, cos, sin, fused)
    assert torch.equal(q2, eq) and torch.equal(k2, ek)
    g, u = torch.randn(5, 12, generator=gen), torch.randn(5, 12, generator=gen)
    torch.testing.assert_close(gated_act(g, u, F.silu, True, fused), F.silu(g) * u)
    torch.testing.assert_close(gated_act(g, u, F.gelu, False, fused), F.gelu(g) * u)


def test_routing_rules():
    """C++ for CPU float32 with 1..CPP_MAX_ROWS rows; a transposed (Conv1D) weight from 2 rows on;
    torch for more rows, other dtypes and autograd."""
    from specdec_fast.runners._layer_math import fused_layer_math

    built = fused_layer_math(torch.float32, "cpu")  # the C++ ops built here (same library)
    takes = runner_linear._cpp_takes
    w, wt = torch.randn(6, 4), torch.randn(4, 6).t()
    with torch.no_grad():
        assert takes(torch.randn(1, 4), w, None, None) == built
        assert not takes(torch.randn(1, 4), wt, None, None)
        assert takes(torch.randn(2, 4), wt, None, None) == built
        assert takes(torch.randn(2, 3, 4), w, torch.randn(6), None) == built  # 6 rows
        assert not takes(torch.randn(runner_linear.CPP_MAX_ROWS + 1, 4), w, None, None)
        assert not takes(torch.randn(2, 4).double(), w.double(), None, None)
        assert not takes(torch.randn(2, 4), w, torch.randn(12)[::2], None)  # strided bias
    assert not takes(torch.randn(2, 4), w.requires_grad_(), None, None)


def test_layer_linears_picks_once_and_matches():
    """layer_linears: the raw C++ ops when they take every weight (float32 CPU, few rows), else
    the checked functions; both compute the same (linear with residual, linears with biases)."""
    from specdec_fast.runners._layer_math import fused_layer_math
    from specdec_fast.runners._linear import layer_linears

    gen = torch.Generator().manual_seed(2)
    ws, bs = [torch.randn(12, 16, generator=gen), torch.randn(4, 16, generator=gen)], [torch.randn(12, generator=gen), None]
    x, r = torch.randn(3, 16, generator=gen), torch.randn(3, 12, generator=gen)
    with torch.no_grad():
        lin, lins = layer_linears(3, x, ws, bs)
        assert (lin is torch.ops.specdec_fast.skinny_linear) == fused_layer_math(torch.float32, "cpu")
        torch.testing.assert_close(lin(x, ws[0], bs[0], r), r + F.linear(x, ws[0], bs[0]))
        for got, w, b in zip(lins(x, ws, bs), ws, bs):
            torch.testing.assert_close(got, F.linear(x, w, b))
        many = torch.randn(runner_linear.CPP_MAX_ROWS + 1, 16)
        assert layer_linears(many.shape[0], many, ws, bs)[0] is linear
        assert layer_linears(3, x.double(), [w.double() for w in ws], [None, None])[0] is linear
