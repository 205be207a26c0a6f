"""csrc/philox.h and csrc/vec_math.h against the spec: the C++ Philox stream is bit-exact with
kernels/rng/reference.py, its float maps are exact, and fast_exp/fast_log stay within one ulp
of float64 math (measured max: exp 0.95, log 0.77; they feed every decision of the C++ backend)."""
import math

import pytest
import torch

from specdec_fast.kernels.rng import STREAM_ACCEPT, STREAM_DRAFT, STREAM_TOKEN, gumbel, random_bits, uniform, uniform_open

from .backends import kernel_backends

pytestmark = pytest.mark.skipif("cpp" not in kernel_backends(), reason="C++ backend not tested on this machine")


@pytest.fixture(scope="module")
def ops():
    from specdec_fast.kernels._cpp_build import load_cpu_ops

    assert load_cpu_ops(), "the C++ CPU ops must build on the test machine"
    return torch.ops.specdec_fast


def _draw_args(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    full = lambda hi: torch.randint(0, hi, (n,), generator=g, dtype=torch.int64)  # noqa: E731
    seeds = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    seeds[:4] = torch.tensor([0, -1, 2**63 - 1, -(2**63)])  # the int64 extremes
    offsets = full(2**56)
    offsets[:4] = torch.tensor([0, 2**56 - 1, 2**32, 2**32 - 1])
    positions = full(2**32)
    positions[:2] = torch.tensor([0, 2**32 - 1])
    vocab = full(2**32)
    vocab[:2] = torch.tensor([0, 2**32 - 1])
    return seeds, offsets, positions, vocab


@pytest.mark.parametrize("stream", [STREAM_ACCEPT, STREAM_TOKEN, STREAM_DRAFT, 255])
def test_philox_bits_match_the_reference(ops, stream):
    seeds, offsets, positions, vocab = _draw_args(4096, seed=stream)
    bits, u, uo, g = ops.philox_draws(seeds, offsets, positions, vocab, stream)
    expected = random_bits(seeds, offsets, positions, stream, vocab)
    assert torch.equal(bits, expected)
    assert torch.equal(u, uniform(expected))
    assert torch.equal(uo, uniform_open(expected))
    # gumbel uses csrc's own log: a few ulp from torch.log, never more.
    torch.testing.assert_close(g, gumbel(expected), rtol=4e-7, atol=4e-7)


def test_philox_known_answer_through_the_stream(ops):
    # counter (0, 0, 0, 0), key (0, 0) -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8 (Random123 known-answer
    # vector): vocab index v draws word v % 4 of counter word v // 4
    zero = torch.zeros(4, dtype=torch.int64)
    bits, *_ = ops.philox_draws(zero, zero, zero, torch.arange(4), 0)
    assert [int(b) for b in bits] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def gumbel_block_is_the_spec(ops, v0, n, seed=-7, offset=2**40 + 3, position=5):
    """ops.gumbel_noise (csrc/rng.cpp: philox.h gumbel_block) of vocab indices v0 .. v0 + n - 1 against the spec."""
    got = ops.gumbel_noise(torch.tensor([seed, offset, position]), STREAM_TOKEN, v0, n)
    bits = random_bits(torch.tensor(seed), torch.tensor(offset), position, STREAM_TOKEN, torch.arange(v0, v0 + n))
    torch.testing.assert_close(got, gumbel(bits), rtol=4e-7, atol=4e-7)


GUMBEL_BLOCKS = [(0, 256), (1, 7), (2, 300), (3, 1), (5, 1000), (128256 - 250, 250), (2**32 - 9, 9)]


@pytest.mark.parametrize("v0, n", GUMBEL_BLOCKS)
def test_gumbel_block_is_the_spec_at_any_alignment(ops, v0, n):
    """The C++ kernels' noise loop (philox.h gumbel_block: one Philox call per four indices, eight calls
    a step on AVX2: tests/kernels/test_cpp_vector_widths.py builds that path) gives each vocab index its
    own spec draw, wherever the block starts."""
    gumbel_block_is_the_spec(ops, v0, n)


def _ulps(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Error in units of the float32 spacing at the exact value (float64 in, float64 out)."""
    exact32 = exact.float()
    spacing = (torch.nextafter(exact32.abs(), torch.tensor(float("inf"))) - exact32.abs()).double()
    return (got.double() - exact).abs() / spacing


def test_fast_exp_is_within_one_ulp(ops):
    x = torch.cat([torch.linspace(-103.0, 88.7, 200001), torch.randn(100000) * 5, torch.tensor([0.0, -0.0, 1e-30, -1e-30])])
    e, _ = ops.fast_exp_log(x)
    exact = torch.exp(x.double())
    normal = exact >= 2.0**-126  # below that float32 is subnormal: check absolutely
    assert float(_ulps(e[normal], exact[normal]).max()) <= 1.0
    assert float((e[~normal].double() - exact[~normal]).abs().max()) <= 2.0**-149
    specials, _ = ops.fast_exp_log(torch.tensor([float("-inf"), -200.0, 0.0, 100.0, float("inf")]))
    assert specials.tolist() == [0.0, 0.0, 1.0, float("inf"), float("inf")]


def test_fast_log_is_within_one_ulp(ops):
    positive = torch.cat([
        torch.logspace(-44, 38, 200001),  # subnormals up to near the float32 max
        torch.rand(100000) + 0.5,  # around 1, where log is small and relative error matters
        torch.tensor([1.0, 2.0**-149, 2.0**-126, 1 - 2.0**-24, 1 + 2.0**-23]),
    ]).float()
    positive = positive[positive > 0]
    _, lg = ops.fast_exp_log(positive)
    exact = torch.log(positive.double())
    nonzero = exact != 0
    assert float(_ulps(lg[nonzero], exact[nonzero]).max()) <= 1.0
    assert float(lg[~nonzero].abs().max()) == 0.0
    _, specials = ops.fast_exp_log(torch.tensor([0.0, float("inf"), -1.0, float("nan")]))
    assert specials[0] == float("-inf") and specials[1] == float("inf") and math.isnan(specials[2]) and math.isnan(specials[3])
