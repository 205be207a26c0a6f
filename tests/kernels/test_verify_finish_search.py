"""The finishing launch's fused threshold search (kernels/verify/_triton_search.py largest_key_fused,
_triton_plan.FINISH_SEARCH_TILE): the same answers as largest_key_reaching and as a direct
reference, on tiles with ties, empty slots, count and probability weights, goals that no key
reaches and bounds that break the search's assumptions; and, inside the verify step, the same
statistics, threshold routes and tokens with the fused search (its small tile and its full one)
as with the earlier search.
"""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.verify._triton_common import KEY_NONE
from specdec_fast.kernels.verify._triton_search import largest_key_fused, largest_key_reaching
from tests.kernels.test_verify_rungs_launch import _problem, penalised_problem

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

KEY_NONE_VALUE = int(KEY_NONE.value if hasattr(KEY_NONE, "value") else KEY_NONE)


@triton.jit
def _fused_counting_slot_zero(keys, weights, goal, lo, hi, WAYS: tl.constexpr):
    """A wrong largest_key_fused (the control): slot 0, the probe at lo, counted as a probe."""
    LOG: tl.constexpr = WAYS.bit_length() - 1
    present = keys > KEY_NONE
    lo = tl.maximum(lo, tl.min(tl.where(present, keys, lo)))
    hi = tl.minimum(hi, tl.maximum(tl.max(tl.where(present, keys, lo)), lo) + 1)
    keys32 = keys.to(tl.int32)
    j = tl.arange(0, WAYS)[:, None].to(tl.int64)
    while hi - lo > 1:
        width = hi - lo
        probes = (lo + ((j * width) >> LOG)).to(tl.int32)
        sums = tl.sum(tl.where(keys32 >= probes, weights, 0), axis=1)
        n = tl.sum((sums >= goal).to(tl.int64), axis=0)
        new_lo = lo + ((n * width) >> LOG)
        hi = tl.minimum(lo + (((n + 1) * width) >> LOG), hi)
        lo = tl.minimum(new_lo, hi - 1)
    return lo


@triton.jit
def _search_kernel(keys_ptr, weights_ptr, args_ptr, out_ptr, C: tl.constexpr, WAYS: tl.constexpr,
                   INT32_WEIGHTS: tl.constexpr, CONTROL: tl.constexpr):
    """Program p: the search over row p of keys / weights int64 [P, C] with (goal, lo, hi) = args[p]."""
    p = tl.program_id(0)
    i = tl.arange(0, C)[None, :]
    keys = tl.load(keys_ptr + p * C + i)
    weights = tl.load(weights_ptr + p * C + i)
    goal = tl.load(args_ptr + p * 3)
    lo = tl.load(args_ptr + p * 3 + 1)
    hi = tl.load(args_ptr + p * 3 + 2)
    if INT32_WEIGHTS:
        weights = weights.to(tl.int32)
    if CONTROL:
        t = _fused_counting_slot_zero(keys, weights, goal, lo, hi, WAYS)
    elif WAYS == 0:
        one = tl.zeros([1], tl.int64)
        t = tl.sum(largest_key_reaching(keys, weights, one + goal, one + lo, one + hi), axis=0)
    else:
        t = largest_key_fused(keys, weights, goal, lo, hi, WAYS)
    tl.store(out_ptr + p, t)


def _reference(keys, weights, goal, lo, hi):
    """The largest integer t in [lo, hi) with sum(weights[keys >= t]) >= goal, else lo: t is lo,
    hi - 1 or a key (the sum only drops just above a key)."""
    def reaches(t):
        return int(weights[keys >= t].sum()) >= goal
    candidates = [c for c in {lo, hi - 1, *keys[(keys >= lo) & (keys < hi)].tolist()} if lo <= c < hi and reaches(c)]
    return max(candidates) if candidates else lo


def _order_key(x: np.ndarray) -> np.ndarray:
    bits = np.where(x == 0, np.float32(0), x).astype(np.float32).view(np.int32).astype(np.int64)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _table(probabilities: bool, size: int = 256, rows: int = 24, seed: int = 0):
    """(keys, weights [rows, size] int64, args [rows, 3] int64 (goal, lo, hi)): order keys of fp32
    values (narrow and wide ranges, heavy ties, both signs), empty slots (KEY_NONE, weight 0),
    goals from 1 to past the total, bounds inside the keys and beyond them."""
    rng = np.random.default_rng(seed)
    keys = np.empty((rows, size), np.int64)
    weights = np.empty((rows, size), np.int64)
    args = np.empty((rows, 3), np.int64)
    for r in range(rows):
        scale = [1e-3, 1.0, 30.0, 1e4][r % 4]
        x = (rng.standard_normal(size) * scale + [0.0, 5.0, -5.0][r % 3]).astype(np.float32)
        if r % 5 == 0:  # ties: a few distinct values
            x = rng.choice(x[:6], size)
        k = _order_key(x)
        filled = rng.random(size) < [1.0, 0.7, 0.2, 0.05][r % 4]
        filled[0] = True
        k = np.where(filled, k, KEY_NONE_VALUE)
        w = np.where(filled, rng.integers(1, 2**50, size) if probabilities else 1, 0)
        total = int(w.sum())
        present = k[filled]
        choice = r % 6
        if choice == 0:  # the call sites' bounds: the gathered interval's ends
            lo, hi = int(present.min()), int(present.max()) + 1
        elif choice == 1:  # bounds far beyond the keys
            lo, hi = -2139095041, 2139095041
        elif choice == 2:  # bounds cutting into the keys
            lo, hi = int(np.quantile(present, 0.2)), int(np.quantile(present, 0.9)) + 1
        else:
            lo, hi = int(present.min()) - 7, int(present.max()) + 100
        goal = [1, max(1, total // 3), total, total + 1, max(1, total // 100), int(w.max())][r % 6]
        keys[r], weights[r], args[r] = k, w, (goal, lo, max(hi, lo + 1))
    return keys, weights, args


def _run(keys, weights, args, ways, int32_weights=False, control=False):
    out = torch.empty(keys.shape[0], dtype=torch.int64)
    _search_kernel[(keys.shape[0],)](torch.from_numpy(keys), torch.from_numpy(weights), torch.from_numpy(args), out,
                                     C=keys.shape[1], WAYS=ways, INT32_WEIGHTS=int32_weights, CONTROL=control)
    return out.numpy()


@pytest.mark.cpu_only  # a table of tiny launches through the interpreter; the verify tests below run on a GPU too
@pytest.mark.parametrize("probabilities", [False, True], ids=["counts", "probabilities"])
def test_the_fused_search_finds_the_reference_threshold(probabilities):
    keys, weights, args = _table(probabilities)
    expected = np.array([_reference(k, w, *a) for k, w, a in zip(keys, weights, args)])
    assert len(set(expected.tolist())) > len(expected) // 2  # the table's answers differ from row to row
    assert (expected == args[:, 1]).any() and (expected != args[:, 1]).any()  # some rows reach no key past lo
    assert np.array_equal(_run(keys, weights, args, 0), expected)  # the earlier search
    for ways in (4, 8):
        assert np.array_equal(_run(keys, weights, args, ways, int32_weights=not probabilities), expected), ways
    # the control: a search that counts the probe at lo as a probe gives other answers
    assert not np.array_equal(_run(keys, weights, args, 8, int32_weights=not probabilities, control=True), expected)


# (B, K, V, sampling, candidate cap, vocab block, chunks, the fused search's small tile): a top set
# (counts), a gathered interval of a flat row (probabilities), a deep top-k with top-p. A small tile
# of 32 sends some stages' intervals to it (8-way) and the rest to the full tile (4-way).
CASES = [
    pytest.param(2, 3, 1000, dict(top_k=7), 128, 64, 4, 32, id="top_k"),
    pytest.param(2, 2, 1000, dict(top_p=0.8), 128, 64, 5, 32, id="top_p-flat"),
    pytest.param(2, 2, 600, dict(top_k=300, top_p=0.95), 64, 64, 3, 32, id="deep"),
]


def selection_stats(target, draft, drafts, params, penalties=None, **overrides):
    """([m, s2, s3, tkey, amax, paths] on the CPU, the plan) of the selection launches alone, under
    these plan overrides (PLAN_OVERRIDES) and penalties (PenaltyTensors or None)."""
    from specdec_fast.kernels.verify import triton as launcher

    b, k, v = draft.shape
    plan = launcher.plan_for(b, k, v, True, target.device, overrides, params.modes, penalties=penalties is not None)
    pen = launcher.penalty_args(penalties, drafts, k, 0) if penalties is not None else None
    stats, paths, _ = launcher.select_stats(target, draft, drafts, params, plan, pen=pen)
    return [t.cpu() for t in (*stats, paths)], plan


def _stats(target, draft, drafts, params, penalties, search_tile, **overrides):
    """selection_stats with this finishing search (0: the earlier one)."""
    stats, plan = selection_stats(target, draft, drafts, params, penalties, finish_search_tile=search_tile, **overrides)
    assert plan.finish and plan.finish_search_tile == min(search_tile, plan.cap)
    return stats


@pytest.mark.parametrize("batch,k,vocab,kw,cap,block_v,chunks,tile", CASES)
def test_the_fused_search_changes_nothing_in_the_verify_step(device, batch, k, vocab, kw, cap, block_v, chunks, tile):
    target, draft, drafts = (t.to(device) for t in _problem(batch, k, vocab, seed=vocab + k))
    params = make_sampling_tensors(batch, device, seed=5, **kw)
    overrides = dict(cap=cap, block_v=block_v, num_chunks=chunks)
    earlier = _stats(target, draft, drafts, params, None, 0, **overrides)
    assert (earlier[5] != 0).any()  # some distribution settled a threshold
    fused = _stats(target, draft, drafts, params, None, tile, **overrides)
    for a, b in zip(earlier, fused):
        assert torch.equal(a, b), (a, b)
    if "top_p" not in kw:  # one case: the whole call with the fused search gives the reference's tokens
        from specdec_fast.kernels.verify import chain_verify_reference
        from specdec_fast.kernels.verify.triton import chain_verify_triton

        tokens, accepted = chain_verify_triton(target, draft, drafts, params, finish_search_tile=tile, **overrides)
        expected = chain_verify_reference(target, draft, drafts, params)
        assert torch.equal(tokens.cpu(), expected[0].cpu()) and torch.equal(accepted.cpu(), expected[1].cpu())


def test_the_fused_form_when_the_sample_misses_the_top_set(device):
    """A top set smaller than the top-k (the row sample saw every high value of the row: tau0 sits
    above the k-th value), so the top-k threshold is swept below tau0 and the top set's mass (read
    over the small tile, _known_points) is the interval's upper end: the same statistics."""
    from specdec_fast.kernels.verify import triton as launcher
    from specdec_fast.kernels.verify._triton_plan import SAMPLE, SAMPLE_RUN

    batch, k, vocab = 1, 2, 16384
    g = torch.Generator().manual_seed(4)
    target = torch.randn(batch, k + 1, vocab, generator=g)
    i = torch.arange(SAMPLE)
    sampled = (i // SAMPLE_RUN) * (vocab // (SAMPLE // SAMPLE_RUN)) + i % SAMPLE_RUN  # _triton_sample.py's positions
    target[..., sampled] += 5.0
    draft = target[:, :k] + 0.1 * torch.randn(batch, k, vocab, generator=g)
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    target, draft, drafts = target.to(device), draft.to(device), drafts.to(device)
    params = make_sampling_tensors(batch, device, seed=3, top_k=8, top_p=0.95)
    overrides = dict(cap=128)
    earlier = _stats(target, draft, drafts, params, None, 0, **overrides)
    assert ((earlier[5] & 0xF) == 1 << 2).all()  # every top-k threshold was swept (SWEPT, below tau0)
    fused = _stats(target, draft, drafts, params, None, 32, **overrides)
    for a, b in zip(earlier, fused):
        assert torch.equal(a, b), (a, b)
    assert launcher.plan_for(batch, k, vocab, True, target.device, overrides, params.modes).sample == SAMPLE


def test_the_penalised_fused_search_changes_nothing(device):
    batch = 2
    target, draft, drafts, pen = penalised_problem(device, batch)
    params = make_sampling_tensors(batch, device, seed=7, top_k=5, top_p=0.9)
    overrides = dict(cap=128, block_v=64, num_chunks=4)
    earlier = _stats(target, draft, drafts, params, pen, 0, **overrides)
    fused = _stats(target, draft, drafts, params, pen, 32, **overrides)
    for a, b in zip(earlier, fused):
        assert torch.equal(a, b), (a, b)


@pytest.mark.parametrize("sampling", [dict(top_k=50), dict(top_p=0.9)], ids=["top_k=50", "top_p=0.9"])
def test_the_fused_search_at_the_benchmarks_shape(device, sampling):
    """Issue 25's B = 1 row (K = 4, V = 128256, bf16, the bench's logits: top sets of ~100-950
    values, top-p intervals of ~1.4-2.9 k on these flat rows): the same statistics and routes with
    the fused search's 1024- and 2048-value tiles (the benchmark's ways) as with the earlier search."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from verify_gpu_table import make_logits

    target, draft, drafts = make_logits(1, 4, 128256, "random", device, torch.bfloat16)
    params = make_sampling_tensors(1, device, seed=1, **sampling)
    earlier = _stats(target, draft, drafts, params, None, 0)
    assert (earlier[5] != 0).all()  # every distribution settled its threshold
    for tile in (1024, 2048):
        fused = _stats(target, draft, drafts, params, None, tile)
        for a, b in zip(earlier, fused):
            assert torch.equal(a, b), (tile, a, b)
