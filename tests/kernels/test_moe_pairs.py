"""moe_pairs (torch reference; Triton, both schedules: one program per pair, and pairs grouped by
expert) against a float64 loop over the pairs, over a table of awkward sizes (K and N not multiples
of the tiles, and whole tiles, one pair per token or eight, the same expert chosen twice, unused
experts, an expert chosen by more pairs than a tile holds), the SwiGLU and GPT-OSS activations, biases, transposed
weights (GPT-OSS's views), scaled forms, float32 / bfloat16; group_pairs; bad inputs."""
import pytest
import torch
import torch.nn.functional as F

from specdec_fast.kernels._backend import cpp_op_available
from specdec_fast.kernels.moe import group_pairs, moe_pairs

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}

# (tokens, pairs_per_token, experts E, rows R, K, act, scaled, biased, transposed, dtype)
CASES = {
    "decode_top8_of_16": (1, 8, 16, 48, 64, "silu", False, False, False, torch.float32),
    "verify5_top2_ragged_k": (5, 2, 8, 33, 200, None, True, False, False, torch.float32),
    "gated_and_scaled_bf16": (3, 2, 6, 40, 130, "silu", True, False, False, torch.bfloat16),
    "one_pair_per_token_down": (7, 1, 4, 70, 24, None, True, False, False, torch.float32),
    "repeated_expert_n_below_tile": (2, 4, 3, 10, 17, "silu", False, False, False, torch.float32),
    "gpt_oss_gate_up_transposed_biased": (6, 2, 5, 36, 40, "gpt_oss", False, True, True, torch.float32),
    "gpt_oss_down_transposed_biased_bf16": (4, 1, 5, 24, 18, None, True, True, True, torch.bfloat16),
    "wide_batch_40_tokens_top4_of_6": (40, 4, 6, 66, 72, "silu", False, False, False, torch.float32),  # > 16 a tile
    "prefill_90_tokens_one_expert_hot": (90, 2, 3, 20, 33, "gpt_oss", True, True, False, torch.float32),
    # whole tiles along N and K for both schedules (the unmasked loads: every real model's shapes)
    "whole_tiles_swiglu": (4, 2, 5, 128, 128, "silu", False, False, False, torch.float32),
    "whole_tiles_gpt_oss_transposed_bf16": (4, 2, 5, 128, 128, "gpt_oss", True, True, True, torch.bfloat16),
    "whole_tiles_down": (9, 1, 3, 64, 256, None, True, False, False, torch.float32),
    "whole_rows_ragged_k": (3, 2, 4, 128, 100, "silu", True, False, False, torch.float32),
    # Nemotron-H's ungated experts (relu2: R = I outputs, an odd count too), a decode's and a wide batch's
    "relu2_ungated_odd_rows": (3, 4, 6, 45, 40, "relu2", False, False, False, torch.float32),
    "relu2_wide_batch_bf16": (40, 2, 5, 64, 96, "relu2", True, False, False, torch.bfloat16),
}
LIMIT, ALPHA = 0.7, 1.702


def _inputs(tokens, r, experts, rows, k, scaled, biased, transposed, dtype, seed, device, hot=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, k, generator=gen).to(dtype)
    weight = (torch.randn(experts, rows, k, generator=gen) / k ** 0.5).to(dtype)
    if transposed:  # stored [E, K, R] as GPT-OSS stores its experts, read as an [E, R, K] view
        weight = weight.transpose(1, 2).contiguous().transpose(1, 2)
    chosen = torch.randint(0, experts, (tokens * r,), generator=gen)
    chosen[:2] = chosen[0]  # a repeated expert
    if hot:  # three quarters of the pairs choose expert 0: more than one tile of BLOCK_M pairs
        chosen[: 3 * chosen.numel() // 4] = 0
    scale = torch.rand(tokens * r, generator=gen) if scaled else None
    bias = (torch.randn(experts, rows, generator=gen) * 0.5).to(dtype) if biased else None
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(x), to(chosen), to(weight), to(scale), to(bias)


def _oracle(x, chosen, weight, r, scale, act, bias=None):
    x, weight = x.double().cpu(), weight.double().cpu()
    rows = []
    for p, e in enumerate(chosen.tolist()):
        y = weight[e] @ x[p // r] + (0.0 if bias is None else bias[e].double().cpu())
        if act == "silu":
            gate, up = y.chunk(2)
            y = F.silu(gate) * up
        elif act == "gpt_oss":
            gate, up = y[0::2].clamp(max=LIMIT), y[1::2].clamp(-LIMIT, LIMIT)
            y = (up + 1) * gate * torch.sigmoid(ALPHA * gate)
        elif act == "relu2":
            y = y.clamp(min=0) ** 2
        rows.append(y * (1.0 if scale is None else float(scale[p])))
    return torch.stack(rows)


@pytest.mark.parametrize("schedule", ["torch", "cpp", "pair", "expert"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_pairs_loop(name, schedule, device):
    """schedule: the torch spec, the C++ op (CPU), or one of the Triton schedules."""
    tokens, r, experts, rows, k, act, scaled, biased, transposed, dtype = CASES[name]
    backend = schedule if schedule in ("torch", "cpp") else "triton"
    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cpp":
        if not cpp_op_available("moe_experts"):
            pytest.skip("the C++ op did not build")
        device = "cpu"
    x, chosen, weight, scale, bias = _inputs(tokens, r, experts, rows, k, scaled, biased, transposed, dtype,
                                             len(name), device, hot="hot" in name)
    out = moe_pairs(x, chosen, weight, pairs_per_token=r, scale=scale, act=act, bias=bias, alpha=ALPHA,
                    limit=LIMIT, backend=backend, schedule=schedule if backend == "triton" else None)
    assert out.dtype == dtype and out.shape == (tokens * r, rows // 2 if act in ("silu", "gpt_oss") else rows)
    torch.testing.assert_close(out.cpu().double(), _oracle(x, chosen, weight, r, scale, act, bias),
                               atol=TOL[dtype], rtol=TOL[dtype])


def test_hot_expert_takes_several_tiles():
    """The "hot" case's expert 0 has more pairs than one tile of the expert schedule holds."""
    pytest.importorskip("triton")
    from specdec_fast.kernels.moe.triton_grouped import block_m

    tokens, r, experts, *_ = CASES["prefill_90_tokens_one_expert_hot"]
    assert 3 * tokens * r // 4 > block_m(tokens * r, experts)


def test_group_pairs_sorts_stably_and_bounds_each_expert():
    chosen = torch.tensor([3, 0, 3, 1, 0, 3, 9])  # 9: outside the 4 experts, in no expert's range
    order, offsets = group_pairs(chosen, 4)
    assert order.tolist() == [1, 4, 3, 0, 2, 5, 6] and offsets.tolist() == [0, 2, 3, 3, 6]
    # the expert bounds are made once per (E, device, dtype), not at every call (a launch per MoE layer per step)
    from specdec_fast.kernels.moe import _expert_bounds

    assert _expert_bounds(4, chosen) is _expert_bounds(4, chosen) and _expert_bounds(4, chosen).tolist() == [0, 1, 2, 3, 4]
    assert group_pairs(chosen, 4)[1].tolist() == [0, 2, 3, 3, 6] and group_pairs(chosen, 2)[1].tolist() == [0, 2, 3]


def test_cpp_refuses_an_expert_id_out_of_range():
    """The C++ op groups the pairs on the host: an id outside [0, E) is an error there (the Triton
    schedules cannot check without a host sync: their rows stay unwritten)."""
    if not cpp_op_available("moe_experts"):
        pytest.skip("the C++ op did not build")
    x, chosen, weight, _, _ = _inputs(2, 2, 4, 8, 16, False, False, False, torch.float32, 0, "cpu")
    chosen[1] = 4
    with pytest.raises(RuntimeError, match="expert id 4 of pair 1 is outside"):
        moe_pairs(x, chosen, weight, pairs_per_token=2, backend="cpp")


def test_control_the_pair_reads_its_own_token_and_expert():
    """The oracle tells pairs apart: tokens or experts read for another pair give other rows."""
    x, chosen, weight, _, _ = _inputs(5, 2, 8, 33, 200, False, False, False, torch.float32, 3, "cpu")
    out = moe_pairs(x, chosen, weight, pairs_per_token=2)
    assert not torch.allclose(out.double(), _oracle(x, chosen.roll(1), weight, 2, None, None), atol=1e-3)
    assert not torch.allclose(out.double(), _oracle(x.roll(1, 0), chosen, weight, 2, None, None), atol=1e-3)


def test_control_the_gpt_oss_activation_differs_from_swiglu():
    """The table's GPT-OSS rows would fail read as SwiGLU (halves, no clamp), and without the bias."""
    x, chosen, weight, _, bias = _inputs(6, 2, 5, 36, 40, False, True, True, torch.float32, 1, "cpu")
    out = moe_pairs(x, chosen, weight, pairs_per_token=2, act="gpt_oss", bias=bias, alpha=ALPHA, limit=LIMIT)
    assert not torch.allclose(out.double(), _oracle(x, chosen, weight, 2, None, "silu", bias), atol=1e-3)
    assert not torch.allclose(out.double(), _oracle(x, chosen, weight, 2, None, "gpt_oss"), atol=1e-3)


def test_control_relu2_is_applied():
    """The table's relu2 rows would fail without their activation (the products alone) or with relu alone."""
    x, chosen, weight, _, _ = _inputs(3, 4, 6, 45, 40, False, False, False, torch.float32, 2, "cpu")
    out = moe_pairs(x, chosen, weight, pairs_per_token=4, act="relu2")
    assert not torch.allclose(out.double(), _oracle(x, chosen, weight, 4, None, None), atol=1e-3)
    assert not torch.allclose(out.double(), _oracle(x, chosen, weight, 4, None, None).clamp(min=0), atol=1e-3)


BAD = {
    "int_experts32": (dict(experts=lambda c: c.int()), TypeError, "int64"),
    "wrong_pair_count": (dict(pairs_per_token=3), ValueError, "entries"),
    "k_mismatch": (dict(weight=lambda w: w[:, :, :-1].contiguous()), ValueError, "K = "),
    "odd_gated_rows": (dict(weight=lambda w: w[:, :-1].contiguous(), act="silu"), ValueError, "even"),
    "unknown_activation": (dict(act="gelu"), ValueError, "act must be"),
    "dtype_mismatch": (dict(weight=lambda w: w.double()), TypeError, "dtype"),
    "scale_shape": (dict(scale=torch.ones(3)), ValueError, "scale"),
    "bias_shape": (dict(bias=torch.ones(4, 7)), ValueError, "bias"),
    "unknown_schedule": (dict(schedule="token"), ValueError, "schedule"),
    "groups_of_other_experts": (dict(groups=(torch.zeros(4, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))),
                                ValueError, "groups"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_inputs(name):
    change, error, match = BAD[name]
    x, chosen, weight, _, _ = _inputs(2, 2, 4, 8, 16, False, False, False, torch.float32, 0, "cpu")
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
