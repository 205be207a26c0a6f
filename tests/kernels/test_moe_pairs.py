"""moe_pairs (torch reference, Triton) against a float64 loop over the pairs, over a table of
awkward sizes (K and N not multiples of the tiles, one pair per token or eight, the same expert
chosen twice, unused experts), gated (SwiGLU) and scaled forms, float32 / bfloat16; bad inputs."""
import pytest
import torch
import torch.nn.functional as F

from specdec_fast.kernels.moe import moe_pairs

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}

# (tokens, pairs_per_token, experts E, rows N, K, gated, scaled, dtype)
CASES = {
    "decode_top8_of_16": (1, 8, 16, 48, 64, True, False, torch.float32),
    "verify5_top2_ragged_k": (5, 2, 8, 33, 200, False, True, torch.float32),
    "gated_and_scaled_bf16": (3, 2, 6, 40, 130, True, True, torch.bfloat16),
    "one_pair_per_token_down": (7, 1, 4, 70, 24, False, True, torch.float32),
    "repeated_expert_n_below_tile": (2, 4, 3, 10, 17, True, False, torch.float32),
}


def _inputs(tokens, r, experts, n, k, scaled, dtype, seed, device):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, k, generator=gen).to(dtype)
    weight = (torch.randn(experts, n, k, generator=gen) / k ** 0.5).to(dtype)
    chosen = torch.randint(0, experts, (tokens * r,), generator=gen)
    chosen[:2] = chosen[0]  # a repeated expert
    scale = torch.rand(tokens * r, generator=gen) if scaled else None
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(x), to(chosen), to(weight), to(scale)


def _oracle(x, chosen, weight, r, scale, gated):
    x, weight = x.double().cpu(), weight.double().cpu()
    rows = []
    for p, e in enumerate(chosen.tolist()):
        y = weight[e] @ x[p // r]
        if gated:
            gate, up = y.chunk(2)
            y = F.silu(gate) * up
        rows.append(y * (1.0 if scale is None else float(scale[p])))
    return torch.stack(rows)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_pairs_loop(name, backend, device):
    tokens, r, experts, n, k, gated, scaled, dtype = CASES[name]
    x, chosen, weight, scale = _inputs(tokens, r, experts, n, k, scaled, dtype, len(name), device)
    out = moe_pairs(x, chosen, weight, pairs_per_token=r, scale=scale, gated=gated, backend=backend)
    assert out.dtype == dtype and out.shape == (tokens * r, n // 2 if gated else n)
    torch.testing.assert_close(out.cpu().double(), _oracle(x, chosen, weight, r, scale, gated),
                               atol=TOL[dtype], rtol=TOL[dtype])


def test_control_the_pair_reads_its_own_token_and_expert():
    """The oracle tells pairs apart: tokens or experts read for another pair give other rows."""
    x, chosen, weight, _ = _inputs(5, 2, 8, 33, 200, False, torch.float32, 3, "cpu")
    out = moe_pairs(x, chosen, weight, pairs_per_token=2)
    assert not torch.allclose(out.double(), _oracle(x, chosen.roll(1), weight, 2, None, False), atol=1e-3)
    assert not torch.allclose(out.double(), _oracle(x.roll(1, 0), chosen, weight, 2, None, False), atol=1e-3)


BAD = {
    "int_experts32": (dict(experts=lambda c: c.int()), TypeError, "int64"),
    "wrong_pair_count": (dict(pairs_per_token=3), ValueError, "entries"),
    "k_mismatch": (dict(weight=lambda w: w[:, :, :-1].contiguous()), ValueError, "K = "),
    "odd_gated_rows": (dict(weight=lambda w: w[:, :-1].contiguous(), gated=True), ValueError, "even"),
    "dtype_mismatch": (dict(weight=lambda w: w.double()), TypeError, "dtype"),
    "scale_shape": (dict(scale=torch.ones(3)), ValueError, "scale"),
    "cpp_backend": (dict(backend="cpp"), ValueError, "no C\\+\\+ backend"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_inputs(name):
    change, error, match = BAD[name]
    x, chosen, weight, _ = _inputs(2, 2, 4, 8, 16, False, torch.float32, 0, "cpu")
    kw = dict(pairs_per_token=2)
    for key, value in change.items():
        if key == "experts":
            chosen = value(chosen)
        elif key == "weight":
            weight = value(weight)
        else:
            kw[key] = value
    with pytest.raises(error, match=match):
        moe_pairs(x, chosen, weight, **kw)
