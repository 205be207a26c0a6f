"""The finishing launch's second pass in larger blocks (_triton_plan.FINISH_GATHER_BLOCK_V, the
plan's finish_block_v): a row's interval gathered and min-p's chunk masses summed in blocks of 2x
and 4x the streaming block give the same statistics, threshold routes and tokens as the streaming
block's. The gather's order is the atomics' (any order gives the same integer sums and the same
search); the finishing chunks become multiples of the larger block (fewer programs a row), so a
chunk boundary that a block straddled would count values twice: the cases below have several
chunks a row, and each takes the pass (its route asserted).

Control: a plan whose finishing chunk is NOT a multiple of its block (the chunk of the streaming
block with the larger block) gathers values of the next chunk too and settles other thresholds."""
import dataclasses

import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors
from tests.kernels.test_verify_finish_search import selection_stats
from tests.kernels.test_verify_rungs_launch import _problem

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

GATHERED = 1  # _triton_select_stream.GATHERED: bit 1 << GATHERED of a stage's four bits in paths
MIN_P_BY_CHUNKS = 2 << 8  # _triton_select_finish.MIN_P_BY_CHUNKS

# (B, K, V, sampling, candidate cap, streaming block, chunks, the route some distribution must take, the
# larger blocks as multiples of the streaming one; each interpreted call costs seconds)
CASES = [
    pytest.param(2, 2, 1000, dict(top_p=0.8), 128, 64, 5, "gathered", (2, 4), id="top_p-flat"),
    pytest.param(2, 3, 1000, dict(top_k=40), 128, 64, 4, "gathered", (4,), id="top_k-deep"),
    pytest.param(2, 2, 1000, dict(min_p=0.05, temperature=3.0), 64, 64, 5, "min_p-chunks", (4,), id="min_p-alone"),
]


def _stats(target, draft, drafts, params, **overrides):
    """(m, s2, s3, tkey, amax, paths) of the selection launches, and the plan (one that finishes)."""
    stats, plan = selection_stats(target, draft, drafts, params, **overrides)
    assert plan.finish
    return stats, plan


def _took(paths: torch.Tensor, route: str) -> bool:
    if route == "gathered":
        return bool(((paths & ((1 << GATHERED) | (1 << GATHERED << 4))) != 0).any())
    return bool(((paths & MIN_P_BY_CHUNKS) != 0).any())


@pytest.mark.parametrize("batch,k,vocab,kw,cap,block_v,chunks,route,factors", CASES)
def test_larger_gather_blocks_change_nothing(device, batch, k, vocab, kw, cap, block_v, chunks, route, factors):
    target, draft, drafts = (t.to(device) for t in _problem(batch, k, vocab, seed=vocab + k + 7))
    params = make_sampling_tensors(batch, device, seed=5, **kw)
    overrides = dict(cap=cap, block_v=block_v, num_chunks=chunks)
    base, plan = _stats(target, draft, drafts, params, **overrides)
    assert plan.finish_block_v == block_v and plan.finish_chunks > 1
    assert _took(base[5], route), f"no distribution took the {route} route: {base[5].tolist()}"
    for factor in factors:
        got, wide = _stats(target, draft, drafts, params, finish_block_v=factor * block_v, **overrides)
        assert wide.finish_block_v == factor * block_v and wide.finish_chunk % wide.finish_block_v == 0
        for a, b in zip(base, got):
            assert torch.equal(a, b), (factor, a, b)
    if "top_p" in kw:  # the whole call in the larger blocks gives the reference's tokens
        from specdec_fast.kernels.verify import chain_verify_reference
        from specdec_fast.kernels.verify.triton import chain_verify_triton

        tokens, accepted = chain_verify_triton(target, draft, drafts, params, finish_block_v=4 * block_v, **overrides)
        expected = chain_verify_reference(target, draft, drafts, params)
        assert torch.equal(tokens.cpu(), expected[0].cpu()) and torch.equal(accepted.cpu(), expected[1].cpu())


def test_control_a_chunk_that_is_not_a_multiple_of_the_block_gathers_twice(device):
    """The larger block with the streaming block's chunks (the plan's rounding taken away): blocks
    straddle chunk boundaries, values are gathered by two programs, the statistics change."""
    from specdec_fast.kernels.verify import triton as launcher

    batch, k, vocab, kw, cap, block_v, chunks = 2, 2, 1000, dict(top_p=0.8), 128, 64, 5
    target, draft, drafts = (t.to(device) for t in _problem(batch, k, vocab, seed=vocab + k + 7))
    params = make_sampling_tensors(batch, device, seed=5, **kw)
    base, plan = _stats(target, draft, drafts, params, cap=cap, block_v=block_v, num_chunks=chunks)
    broken = dataclasses.replace(plan, finish_block_v=8 * block_v)
    assert broken.finish_chunk % broken.finish_block_v  # chunks of 256 values, blocks of 512
    stats, paths, _ = launcher.select_stats(target, draft, drafts, params, broken)
    got = [t.cpu() for t in (*stats, paths)]
    assert any(not torch.equal(a, b) for a, b in zip(base, got)), "the control changed nothing"


def test_the_plan_takes_the_block_on_a_gpu_and_checks_it(monkeypatch):
    from specdec_fast.kernels.verify import _triton_plan

    def plan(**kw):
        return _triton_plan.plan_launches(64, 4, 128256, True, num_sms=132, modes=frozenset({"top_p"}), **kw)

    default = plan(interpreting=False)
    # on where an H200 timed it faster (B = 64 top_p: 0.958x, 2026-11-30); smaller batches keep the streaming block
    assert _triton_plan.FINISH_GATHER_BLOCK_V == 8192 and _triton_plan.FINISH_GATHER_MIN_BATCH == 64
    assert default.finish_block_v == 8192 and default.finish_chunks == 1
    for batch in (1, 8, 63):
        small = _triton_plan.plan_launches(batch, 4, 128256, True, num_sms=132, modes=frozenset({"top_p"}),
                                           interpreting=False)
        assert small.finish_block_v == small.select_block_v == 2048
    monkeypatch.setattr(_triton_plan, "FINISH_GATHER_BLOCK_V", None)
    off = plan(interpreting=False)
    assert off.finish_block_v == off.select_block_v == 2048 and off.finish_chunks == 1
    monkeypatch.setattr(_triton_plan, "FINISH_GATHER_BLOCK_V", 4096)
    on = plan(interpreting=False)
    assert on.finish_block_v == 4096 and on.finish_chunk == 131072 and on.finish_chunk % 4096 == 0
    assert plan(interpreting=True).finish_block_v == plan(interpreting=True).select_block_v  # the interpreter's tiles
    assert plan(interpreting=False, finish_block_v=8192).finish_block_v == 8192
    for bad in (3000, 8, True, 4096.0):
        with pytest.raises(ValueError, match="finish_block_v must be a power of 2 >= 16"):
            plan(interpreting=False, finish_block_v=bad)
