"""Adversarial cases for the Triton selection kernels (top-k / top-p / min-p thresholds), token
for token against the torch reference, on small vocabularies with the candidate machinery
forced on (cap < V: the streaming + finishing kernels, several vocab chunks per row).

`paths` (chain_verify_triton(..., return_paths=True)) says how each distribution's thresholds
were settled, so the tests also check that each route really ran: the top set gathered while
streaming, an interval between rungs gathered by the finishing kernel's chunks, the exact
sweeps by one program (the fallback), a threshold inside one key (ties beyond the candidate
region), min-p summed by chunks. Interpreter cost: each call here is a few seconds.
"""
import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.verify import chain_verify_reference, sample_reference

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# paths bits (kernels/verify/_triton_select_finish.py): 1 << region, shifted per stage
TOP_SET, GATHERED, SWEPT, SINGLE_KEY = 1, 2, 4, 8
TOP_K, TOP_P, MIN_P = 0, 4, 8
NEG_INF = float("-inf")


def _triton():
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    return chain_verify_triton, sample_triton


def _on(device, *tensors):
    return [t.to(device) for t in tensors]


def _verify(target, draft, drafts, kw, *, device, cap, num_chunks=2, block_v=64, seed=0):
    """Run both backends on one problem (built on the CPU, run on ``device``); assert equal
    tokens; return the Triton paths."""
    chain_verify_triton, _ = _triton()
    target, draft, drafts = _on(device, target, draft, drafts)
    kw = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in kw.items()}
    params = make_sampling_tensors(target.shape[0], device, seed=seed, **kw)
    tokens, accepted, paths = chain_verify_triton(target, draft, drafts, params, cap=cap, num_chunks=num_chunks,
                                                  block_v=block_v, return_paths=True)
    expected = chain_verify_reference(target, draft, drafts, params)
    assert torch.equal(accepted, expected[1]), (accepted, expected[1])
    assert torch.equal(tokens, expected[0]), (tokens, expected[0])
    return paths.cpu()


def _rows(*rows):
    """Stack [V] logit rows into target [B, 2, V] (both positions the same row), draft [B, 1, V]
    (a perturbed copy), drafts [B, 1] (each row's argmax: often accepted)."""
    target = torch.stack([torch.stack([r, r]) for r in rows])
    g = torch.Generator().manual_seed(len(rows))
    draft = (target[:, :1] + 0.3 * torch.randn(target[:, :1].shape, generator=g)).contiguous()
    return target, draft, target[:, 0].argmax(-1, keepdim=True)


def _has(paths, bit, stage):
    return bool(((paths >> stage) & bit).any())


def _tie_rows(vocab, batch, seed):
    """Integer logits 0..5 (every threshold falls inside a tie group), a few -inf."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 6, (batch, vocab), generator=g).float()
    rows[:, 3::41] = NEG_INF
    return [r for r in rows]


@pytest.mark.slow
def test_top_k_ties_at_the_kth_value_and_k_around_the_cap(device):
    """V = 200, cap 64, one k per row: k <= 4 settles in the top set (k <= cap / 16), 5 and
    beyond between rungs or by the sweeps; k >= V turns top-k off. Ties everywhere."""
    top_k = torch.tensor([1, 4, 5, 17, 60, 199, 200, 260], dtype=torch.int32)
    target, draft, drafts = _rows(*_tie_rows(200, len(top_k), 3))
    paths = _verify(target, draft, drafts, dict(top_k=top_k), device=device, cap=64)
    selecting = (top_k < 200).repeat_interleave(3)  # 3 distributions per row (K = 1, draft logits)
    assert bool((paths[selecting] & 0xF).ne(0).all()) and not bool(paths[~selecting].any())


@pytest.mark.slow
def test_top_k_fallback_sweeps_and_single_key(device):
    """cap 16: a small top-k overflows its gathered top set (sweeps), and with 6 distinct values
    the refinement ends on one key holding the k-th value (ties beyond the region)."""
    target, draft, drafts = _rows(*_tie_rows(300, 2, 1))
    paths = _verify(target, draft, drafts, dict(top_k=4), device=device, cap=16)
    assert _has(paths, SWEPT, TOP_K) and _has(paths, SINGLE_KEY, TOP_K)


@pytest.mark.slow
def test_top_p_exact_boundaries_tiny_and_almost_one(device):
    """Rows whose masses are exact binary fractions (0.5, 0.25, 0.25): top_p lands exactly on a
    tie group's boundary (mass above = top_p: removed) and just above it (kept); tiny top_p
    (only the max group), 1 - 1e-7 (everything); and tie-heavy integer rows. One row each."""
    exact = torch.full((200,), NEG_INF)
    exact[[10, 20, 30]] = torch.tensor([0.6931471805599453, 0.0, 0.0])
    ties = _tie_rows(200, 2, 7)
    target, draft, drafts = _rows(exact, exact, exact, exact, exact, ties[0], ties[1])
    top_p = torch.tensor([0.5, 0.5000001, 0.75, 1e-6, 1 - 1e-7, 0.3, 1 - 1e-7])
    _verify(target, draft, drafts, dict(top_p=top_p), device=device, cap=32)


@pytest.mark.slow
def test_top_k_between_rungs(device):
    """A top-k above cap / 16 on random rows settles between rungs: gathered by the chunks."""
    g = torch.Generator().manual_seed(3)
    target = torch.randn(2, 2, 400, generator=g) * 3
    draft = (target[:, :1] + 0.1 * torch.randn(2, 1, 400, generator=g)).contiguous()
    paths = _verify(target, draft, target[:, 0].argmax(-1, keepdim=True), dict(top_k=40), device=device, cap=64)
    assert _has(paths, GATHERED, TOP_K)


@pytest.mark.slow
def test_top_p_between_rungs_and_swept_on_flat_rows(device):
    """Flat-ish random rows (scale 0.5): the kept set of top_p = 0.9 is most of the row, far
    beyond the top set; the chunks gather the interval between rungs that holds it, or (tiny
    cap) the sweeps find it."""
    g = torch.Generator().manual_seed(3)
    target = torch.randn(2, 2, 400, generator=g) * 0.5
    draft = target[:, :1] + 0.1 * torch.randn(2, 1, 400, generator=g)
    drafts = target[:, 0].argmax(-1, keepdim=True)
    paths = _verify(target, draft.contiguous(), drafts, dict(top_p=0.9), device=device, cap=128, num_chunks=3)
    assert _has(paths, GATHERED, TOP_P) or _has(paths, SWEPT, TOP_P)
    paths = _verify(target, draft.contiguous(), drafts, dict(top_p=0.9), device=device, cap=16)
    assert _has(paths, SWEPT, TOP_P)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flat", "near_flat", "one_finite", "mostly_inf"])
def test_degenerate_rows_every_mode(kind, device):
    """All logits equal, all within 1e-6 of each other (distinct keys, no room between them),
    a single finite logit, 90% -inf: top-k, top-p, min-p and all three, per row."""
    vocab = 160
    g = torch.Generator().manual_seed(11)
    if kind == "flat":
        row = torch.zeros(vocab)
    elif kind == "near_flat":
        row = 1.0 + 1e-6 * torch.randn(vocab, generator=g)
    elif kind == "one_finite":
        row = torch.full((vocab,), NEG_INF)
        row[77] = 2.0
    else:
        row = torch.randn(vocab, generator=g) * 3
        row[torch.rand(vocab, generator=g) < 0.9] = NEG_INF
        row[5] = 1.0
    target, draft, drafts = _rows(row, row, row, row)
    kw = dict(top_k=torch.tensor([5, 0, 0, 40], dtype=torch.int32), top_p=torch.tensor([1.0, 0.6, 1.0, 0.9]),
              min_p=torch.tensor([0.0, 0.0, 0.3, 0.05]))
    _verify(target, draft, drafts, kw, device=device, cap=32)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1e-3, 100.0])
def test_extreme_temperatures(temperature, device):
    g = torch.Generator().manual_seed(5)
    target = torch.randn(2, 2, 300, generator=g) * 3
    draft = (target[:, :1] + torch.randn(2, 1, 300, generator=g)).contiguous()
    drafts = torch.randint(0, 300, (2, 1), generator=g)
    kw = dict(temperature=temperature, top_k=torch.tensor([20, 0], dtype=torch.int32),
              top_p=torch.tensor([0.9, 0.95]), min_p=torch.tensor([0.0, 0.05]))
    _verify(target, draft, drafts, kw, device=device, cap=64)


@pytest.mark.slow
def test_mixed_rows_in_one_batch_and_min_p_routes(device):
    """Every mode and combination in one batch (greedy and T = 1 rows beside selecting rows),
    min-p settled from the top set and, alone with a min_p so small that its kept set exceeds
    the region, summed by the chunks."""
    g = torch.Generator().manual_seed(9)
    batch, vocab = 6, 300
    target = torch.randn(batch, 3, vocab, generator=g) * 2
    target[:, :, 1::37] = NEG_INF
    draft = (target[:, :2] + torch.randn(batch, 2, vocab, generator=g)).contiguous()
    drafts = torch.randint(0, vocab, (batch, 2), generator=g)
    drafts[4, 1] = -1
    kw = dict(
        temperature=torch.tensor([0.0, 1.0, 0.7, 1.0, 1.3, 1.0]),
        top_k=torch.tensor([0, 0, 12, 0, 30, 0], dtype=torch.int32),
        top_p=torch.tensor([1.0, 1.0, 0.8, 0.9, 0.95, 1.0]),
        min_p=torch.tensor([0.0, 0.0, 0.05, 0.0, 0.1, 1e-4]),
    )
    paths = _verify(target, draft, drafts, kw, device=device, cap=64, seed=4)
    assert _has(paths, TOP_SET, MIN_P) and _has(paths, GATHERED, MIN_P)


def test_sample_shares_the_machinery(device):
    """sample_triton (K = 0): the same selection kernels on [B, V] rows."""
    _, sample_triton = _triton()
    rows = _tie_rows(240, 3, 2) + [torch.randn(240, generator=torch.Generator().manual_seed(1)) * 4]
    logits, top_k, top_p, min_p, positions = _on(
        device, torch.stack(rows), torch.tensor([5, 0, 70, 3], dtype=torch.int32), torch.tensor([1.0, 0.7, 0.9, 0.5]),
        torch.tensor([0.1, 0.0, 0.0, 0.02]), torch.tensor([0, 3, 9, 2**31], dtype=torch.int64))
    params = make_sampling_tensors(4, device, seed=8, top_k=top_k, top_p=top_p, min_p=min_p)
    got = sample_triton(logits, params, positions, 1, cap=32, num_chunks=3, block_v=64)
    assert torch.equal(got, sample_reference(logits, params, positions, 1))


def test_batch_65_small_vocab_whole_rows(device):
    """B = 65 with a small vocabulary: the one-kernel path (whole rows in registers), mixed rows."""
    chain_verify_triton, _ = _triton()
    g = torch.Generator().manual_seed(65)
    batch, vocab = 65, 48
    target = torch.randint(-3, 3, (batch, 2, vocab), generator=g).float()
    draft = torch.randn(batch, 1, vocab, generator=g)
    drafts = torch.randint(0, vocab, (batch, 1), generator=g)
    rows = torch.arange(batch)
    kw = dict(temperature=(rows % 4).float() * 0.5, top_k=(rows % 7).to(torch.int32) * 3,
              top_p=1.0 - (rows % 5).float() * 0.2, min_p=(rows % 3).float() * 0.1, seed=3)
    target, draft, drafts = _on(device, target, draft, drafts)
    params = make_sampling_tensors(batch, device, **{key: _on(device, v)[0] if isinstance(v, torch.Tensor) else v
                                                     for key, v in kw.items()})
    got = chain_verify_triton(target, draft, drafts, params)
    expected = chain_verify_reference(target, draft, drafts, params)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_emission_skips_tiles_that_cannot_win(device):
    """The emission draws noise only in tiles whose values could still beat the best so far
    (greedy and truncated rows skip most tiles): many small tiles per chunk, every kind of row."""
    chain_verify_triton, _ = _triton()
    g = torch.Generator().manual_seed(21)
    batch, vocab = 5, 300
    target = torch.randn(batch, 3, vocab, generator=g) * 3
    draft = torch.randn(batch, 2, vocab, generator=g) * 3
    drafts = torch.randint(0, vocab, (batch, 2), generator=g)
    target, draft, drafts, temperature, top_k, top_p, min_p = _on(
        device, target, draft, drafts, torch.tensor([0.0, 1.0, 1.0, 0.8, 1.0]),
        torch.tensor([0, 0, 3, 0, 40], dtype=torch.int32), torch.tensor([1.0, 1.0, 1.0, 0.5, 0.9]),
        torch.tensor([0.0, 0.0, 0.0, 0.0, 0.2]))
    params = make_sampling_tensors(batch, device, seed=2, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    got = chain_verify_triton(target, draft, drafts, params, block_v=16, num_chunks=2)
    expected = chain_verify_reference(target, draft, drafts, params)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("k", [0, 2])
def test_lane_and_block_streaming_agree(device, k):
    """The streaming pass's two loops (per-lane statistics, the default; block reductions per
    step): same tokens as each other and as the reference, on rows that stream without rungs
    (greedy, plain, a top-k <= CAP / 16 gathered while streaming) with -inf runs, ties at the maximum
    across chunks, an all -inf chunk, and a -1 draft pad."""
    chain_verify_triton, sample_triton = _triton()
    g = torch.Generator().manual_seed(31)
    batch, vocab = 4, 300
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    target[:, :, 100:200] = NEG_INF  # one chunk of three is all -inf (block_v 16, 3 chunks)
    target[0, :, [7, 250]] = 9.0  # the maximum tied across chunks: the lowest index wins
    draft = torch.randn(batch, k, vocab, generator=g) * 2
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    if k:
        drafts[2, 1] = -1
    target, draft, drafts, temperature, top_k = _on(device, target, draft, drafts, torch.tensor([0.0, 1.0, 0.7, 1.0]),
                                                    torch.tensor([0, 0, 0, 4], dtype=torch.int32))
    params = make_sampling_tensors(batch, device, seed=6, temperature=temperature, top_k=top_k)
    ov = dict(block_v=16, num_chunks=3, cap=64)
    if k:
        lanes = chain_verify_triton(target, draft, drafts, params, **ov)
        block = chain_verify_triton(target, draft, drafts, params, stream_lanes=False, **ov)
        expected = chain_verify_reference(target, draft, drafts, params)
        for got in (lanes, block):
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    else:
        logits = target[:, 0].contiguous()
        positions = torch.arange(batch, dtype=torch.int64, device=device)
        expected = sample_reference(logits, params, positions, 1)
        for lanes_on in (True, False):
            got = sample_triton(logits, params, positions, 1, stream_lanes=lanes_on, **ov)
            assert torch.equal(got, expected)


@pytest.mark.parametrize("unroll", [2, 4])
@pytest.mark.parametrize("k", [0, 2])
def test_unrolled_lane_streaming_agrees(device, k, unroll):
    """The per-lane loop taking UNROLL blocks per step (one [UNROLL, BLOCK_V] tile): the
    reference's tokens on greedy, plain, tempered and gathered (top-k <= CAP / 16) rows, with a
    maximum tied inside one lane across the blocks of a step (indices 7 and 23: the lower wins),
    tied across chunks, an all -inf chunk, a -inf run inside a step, and a -1 draft pad."""
    from specdec_fast.kernels.verify._triton_plan import plan_launches

    chain_verify_triton, sample_triton = _triton()
    g = torch.Generator().manual_seed(37)
    batch, vocab = 4, 384  # 3 chunks of 128 = 8 blocks of 16
    ov = dict(block_v=16, num_chunks=3, cap=64, stream_unroll=unroll)
    plan = plan_launches(batch, k, vocab, k > 0, num_sms=4, interpreting=True, block_v=16, num_chunks=3, cap=64,
                         stream_unroll=unroll)
    assert plan.stream_lanes and plan.stream_unroll == unroll
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    target[:, :, 128:256] = NEG_INF  # the middle chunk all -inf
    target[:, :, 40:60] = NEG_INF  # a run inside a step
    target[0, :, [7, 23, 300]] = 9.0  # tied in lane 7 across a step's blocks, and across chunks
    target[1, :, [23, 7]] = torch.tensor([9.0, 8.5])  # a lane's later block holds its maximum
    draft = torch.randn(batch, k, vocab, generator=g) * 2
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    if k:
        drafts[2, 1] = -1
    target, draft, drafts, temperature, top_k = _on(device, target, draft, drafts, torch.tensor([0.0, 1.0, 0.7, 1.0]),
                                                    torch.tensor([0, 0, 0, 4], dtype=torch.int32))
    params = make_sampling_tensors(batch, device, seed=9, temperature=temperature, top_k=top_k)
    if k:
        expected = chain_verify_reference(target, draft, drafts, params)
        for selects in (None, True):  # True: the top-k / top-p / min-p code compiled in (a comparison variant)
            got = chain_verify_triton(target, draft, drafts, params, selects=selects, **ov)
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    else:
        logits = target[:, 0].contiguous()
        positions = torch.arange(batch, dtype=torch.int64, device=device)
        assert torch.equal(sample_triton(logits, params, positions, 1, **ov), sample_reference(logits, params, positions, 1))
        greedy = make_sampling_tensors(batch, device, seed=9, temperature=torch.zeros(batch, device=device))
        assert torch.equal(sample_triton(logits, greedy, positions, 1, **ov).long().cpu(), logits.argmax(-1).cpu())
        # the statistics themselves (the sampled tokens above do not read the sum): max and sum
        # exp of the tempered logits of the rows streamed without a top set
        from specdec_fast.kernels.verify.triton import select_stats

        stats_plan = plan_launches(batch, 0, vocab, False, num_sms=4, interpreting=True, block_v=16, num_chunks=3,
                                   cap=64, stream_unroll=unroll, emits=False)
        no_drafts = torch.empty((batch, 1), dtype=torch.int32, device=device)
        (m, s2, _, _, _), _, _ = select_stats(logits[:, None], logits[:, None], no_drafts, params, stats_plan)
        x = logits[:3].float() / torch.tensor([[1.0], [1.0], [0.7]], device=device)
        assert torch.allclose(m[:3].cpu(), x.max(-1).values.cpu())
        assert torch.allclose(s2[:3].cpu(), torch.exp(x - x.max(-1, keepdim=True).values).sum(-1).cpu(), rtol=1e-5)
