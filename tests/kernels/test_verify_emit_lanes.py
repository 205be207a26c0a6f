"""The emission's per-lane pass (kernels/verify/_triton_emit.py LANES, chain_verify_triton /
sample_triton emit_lanes=True; the plans' choice where a program streams more than one block)
against the torch reference, token for token: sampling modes with rejected rows (the residual path), draft logits or the
one-hot draft, penalties, several chunks and blocks per row with a partial last block, K = 1
(the penalised kernel's runtime-trip-count loop), and sample() with positions. The tie rule
(the lowest index among equal maxima, whichever lane and step held it) and a chunk that is -inf
throughout (the pass takes no value: the chunk's start index, as the block-reduction loop
writes) is set up explicitly. A control shrinks the skip test's noise margin and shows the table
catches it. (Ties of noisy values do not occur: the noise differs per index; the final
reduction's lowest-index rule only keeps the result the block-reduction loop's.)"""
import pytest
import torch
import triton.language as tl

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.penalties import make_penalty_tensors
from specdec_fast.kernels.verify import chain_verify_reference, sample_reference
from specdec_fast.kernels.verify import _triton_emit
from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

from .test_verify_backends import _modes, _problem

CASES = [  # (batch, k, vocab, mode, draft logits, block_v, num_chunks, penalties): 2-13 steps per chunk
    (5, 2, 200, "plain", True, 16, 1, False),
    (3, 3, 111, "mixed", True, 16, 2, False),
    (4, 2, 300, "top_k", False, 32, 2, False),
    (3, 1, 150, "combined", True, 16, 1, True),
    (2, 3, 97, "temperature", False, 16, 3, True),
    (6, 1, 64, "greedy", True, 16, 2, False),
    (4, 2, 200, "plain", False, 64, 3, False),
]


def _ids(case):
    b, k, v, mode, draft, block_v, chunks, pen = case
    return f"B{b}-K{k}-V{v}-{mode}-{'draft' if draft else 'onehot'}-bv{block_v}x{chunks}{'-pen' if pen else ''}"


def random_penalties(batch, vocab, seed, device):
    """A repetition and a presence penalty over 5 random tokens of each row's history."""
    g = torch.Generator().manual_seed(seed)
    return make_penalty_tensors(torch.randint(0, vocab, (batch, 5), generator=g).to(device), vocab,
                                repetition_penalty=1.3, presence_penalty=0.4)


def check_against_the_reference(target, draft, drafts, params, pen, position_step, **overrides):
    """chain_verify_triton and sample_triton (positions b * position_step, stream 3) with the plan
    overrides, token for token against the reference; returns whether the residual path ran (some
    row rejected a draft it had)."""
    batch = target.shape[0]
    expected = chain_verify_reference(target, draft, drafts, params, pen)
    got = chain_verify_triton(target, draft, drafts, params, pen, **overrides)
    assert torch.equal(got[1], expected[1]) and torch.equal(got[0], expected[0]), (got, expected)
    positions = torch.arange(batch, dtype=torch.int64, device=target.device) * position_step
    assert torch.equal(sample_triton(target[:, 0], params, positions, 3, **overrides),
                       sample_reference(target[:, 0], params, positions, 3))
    return bool(((expected[1] < (drafts >= 0).sum(1)) & (expected[1] >= 0)).any())


def _check_case(case, device, shift, lanes=True):
    """One problem of ``case`` (its seed moved by ``shift``), token for token against the reference,
    through the per-lane pass (lanes) or the block-reduction loop; returns whether the residual path
    ran (some row rejected a draft it had)."""
    batch, k, vocab, mode, with_draft, block_v, num_chunks, with_pen = case
    seed = 7 * vocab + k + 1000 * shift
    target, draft, drafts, offsets = _problem(batch, k, vocab, torch.float32, with_draft, True, seed, mode, device)
    params = make_sampling_tensors(batch, device, seed=11 + shift, offset=offsets, **_modes(batch, device)[mode])
    pen = random_penalties(batch, vocab, vocab + shift, device) if with_pen else None
    return check_against_the_reference(target, draft, drafts, params, pen, 5, block_v=block_v, num_chunks=num_chunks,
                                       emit_lanes=lanes)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_per_lane_emission_matches_the_reference(case, device):
    """Sampling cases must reach the residual path. Whether a seed's rows reject depends on torch's
    random stream (torch.multinomial draws the drafts; under torch 2.6 the first seed of
    B3-K1-V150-combined-pen accepted every draft), so the case moves on to the next seed, each
    checked token for token, until one has rejected a draft: at most MAX_SEEDS."""
    mode = case[3]
    for shift in range(MAX_SEEDS):
        rejected = _check_case(case, device, shift)
        if rejected or mode == "greedy":
            return
    pytest.fail(f"no row rejected a draft in {MAX_SEEDS} seeds: the residual path never ran")


MAX_SEEDS = 4


def _dead_chunk(device):
    """Rows whose second chunk (of 3, 32 tokens each) is -inf throughout: the pass takes no value
    there (it writes the chunk's start, as the block-reduction loop does); the other chunks decide."""
    batch, k, vocab = 3, 2, 96
    g = torch.Generator().manual_seed(4)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2.0
    target[:, :, 32:64] = float("-inf")
    params = make_sampling_tensors(batch, device, seed=3, temperature=torch.tensor([0.0, 1.0, 0.7]).to(device))
    drafts = torch.tensor([[70, 5], [10, 11], [3, -1]], device=device)
    return target.to(device), drafts, params


def test_a_chunk_that_is_minus_inf_throughout(device):
    target, drafts, params = _dead_chunk(device)
    expected = chain_verify_reference(target, None, drafts, params)
    got = chain_verify_triton(target, None, drafts, params, block_v=16, num_chunks=3, emit_lanes=True)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (got, expected)


def test_control_a_skip_bound_without_the_noise_margin_fails(device, monkeypatch):
    """The per-lane skip test bounds a tile's keys (prob / E) by prob x NOISE_RATIO_MAX against its
    lanes' bests; with a bound far too small (e**-30, as a log-space margin of -30) it skips tiles
    whose noise could still win, and the sampled rows' tokens change: the table's full-distribution
    case catches a wrong bound (truncated and greedy rows skip anyway)."""
    if device != "cpu":
        pytest.skip("the control patches a module constant, which only the interpreter reads at run time")
    monkeypatch.setattr(_triton_emit, "NOISE_RATIO_MAX", tl.constexpr(9.4e-14))
    with pytest.raises(AssertionError):  # T = 1 rows, 13 steps per chunk: the margin decides
        test_per_lane_emission_matches_the_reference(CASES[0], device)


def test_control_the_block_loop_s_skip_bound_without_the_noise_margin_fails(device, monkeypatch):
    """The block-reduction loop's skip test (a tile's largest prob, and for the residual its largest
    q, times NOISE_RATIO_MAX against the row's best key) with the same far too small bound: the table's
    first case, token for token through that loop first, then its tokens change."""
    if device != "cpu":
        pytest.skip("the control patches a module constant, which only the interpreter reads at run time")
    assert _check_case(CASES[0], device, 0, lanes=False)  # the residual path ran, the reference's tokens
    monkeypatch.setattr(_triton_emit, "NOISE_RATIO_MAX", tl.constexpr(9.4e-14))
    with pytest.raises(AssertionError):
        _check_case(CASES[0], device, 0, lanes=False)


@pytest.mark.parametrize("emit_block_v", [16, 32])
def test_the_emission_block_alone_gives_the_reference_tokens(device, emit_block_v):
    """emit_block_v (the emission's vocab block, apart from the selection's: more emission programs
    for a small batch) splits the emitted row into many one-block chunks whose candidates the row
    tile's last program merges: the reference's tokens, with rejected rows, and for the sampler."""
    batch, k, vocab = 3, 3, 300
    for shift in range(MAX_SEEDS):
        target, draft, drafts, offsets = _problem(batch, k, vocab, torch.float32, True, True, 50 + shift, "plain",
                                                  device)
        params = make_sampling_tensors(batch, device, seed=3 + shift, offset=offsets, **_modes(batch, device)["plain"])
        expected = chain_verify_reference(target, draft, drafts, params)
        got = chain_verify_triton(target, draft, drafts, params, emit_block_v=emit_block_v)
        assert torch.equal(got[1], expected[1]) and torch.equal(got[0], expected[0]), (got, expected)
        positions = torch.arange(batch, dtype=torch.int64, device=device)
        assert torch.equal(sample_triton(target[:, 0], params, positions, 3, emit_block_v=emit_block_v),
                           sample_reference(target[:, 0], params, positions, 3))
        if (expected[1] < (drafts >= 0).sum(1)).any():  # the residual path ran
            return
    pytest.fail(f"no row rejected a draft in {MAX_SEEDS} seeds: the residual path never ran")
