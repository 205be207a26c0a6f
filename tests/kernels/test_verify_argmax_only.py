"""The streaming pass without its sums where every row is greedy (select_stream's SUMS = False; the
plan's stream_sums, _triton_plan.STREAM_GREEDY_ARGMAX_ONLY): the greedy tokens need only each
distribution's lowest argmax (_triton_greedy.py), so the stream keeps the max and the argmax alone.
Token for token against the torch reference and against the stream with its sums, on logits full of
exact ties (small integers: a distribution's maximum sits in several lanes and chunks), over the
per-lane loop (1, 2 and 4 blocks a step, the plan's own lanes rounded up to whole steps) and the block loop, with and without draft logits and
penalties, for the verify and the greedy sampler. Control: the tie data decides tokens -- the
reference with the highest index of the maximum instead of the lowest gives other tokens, so a
stream that lost the lowest-index rule would fail here (checked by hand: ">=" for ">" in the
argmax-only per-lane loop, its 2-block step, or the block loop fails its case(s) here). tree_verify
takes the same stream where every row is greedy (its walk standardises a greedy row by its argmax):
the same check on greedy trees (the per-lane loop's mutation fails them too)."""
import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.verify import _triton_plan
from specdec_fast.kernels.verify.reference import chain_verify_reference, sample_reference
from specdec_fast.kernels.tree_verify._triton_plan import tree_plan
from specdec_fast.kernels.tree_verify.reference import tree_verify_reference
from specdec_fast.kernels.tree_verify.triton import tree_verify_triton
from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

from .test_verify_emit_lanes import random_penalties
from .tree_cases import random_parents

V, CAP = 600, 128  # the large-vocabulary path under the interpreter (V > cap)
CASES = [  # (batch, k, draft logits, penalties, plan overrides)
    (3, 3, False, False, dict(num_chunks=3, block_v=64, stream_lanes=True)),
    (2, 2, True, False, dict(num_chunks=2, block_v=32, stream_lanes=True, stream_unroll=2)),
    (3, 1, False, True, dict(num_chunks=4, block_v=64, stream_lanes=False)),
    (1, 4, True, True, dict(num_chunks=2, block_v=64, stream_lanes=True)),
    # the plan's own unroll (STREAM_ARGMAX_UNROLL, lanes of at least two steps, the cheapest rounding by
    # STREAM_ARGMAX_STEP_COST) and its chunks rounded up to whole steps (test_the_plan_rounds_lanes_to_whole_steps):
    # the first verify's one lane of 20 blocks past V = 600 (19 blocks), 4 a step; lanes of 10 blocks, 2 a step (the
    # second verify, both samplers of the first case); the B = 1 sampler's lanes of 5 blocks, one a step
    (2, 2, True, True, dict(block_v=32, stream_lanes=True)),
    (1, 1, False, False, dict(block_v=32, stream_lanes=True)),
]


def _tied_problem(batch, k, with_draft, seed):
    """Integer logits in [-2, 1] (each distribution's maximum repeated across lanes and chunks), a
    few -inf columns, and drafts that are often the target's first argmax (so rows accept a few)."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(-2, 2, (batch, k + 1, V), generator=g).float()
    target[:, :, 5::41] = float("-inf")
    draft = torch.randint(-2, 2, (batch, k, V), generator=g).float() if with_draft else None
    if draft is not None:  # the draft's argmax is the target's at most positions: greedy accepts there
        draft[:, :, :] = torch.where(torch.rand(batch, k, 1, generator=g) < 0.7, target[:, :k], draft)
    first = target[:, :k].argmax(-1)  # torch: the lowest index of the maximum
    drafts = torch.where(torch.rand(batch, k, generator=g) < 0.6, first, torch.randint(0, V, (batch, k), generator=g))
    return target, draft, drafts


def _plan_of(batch, k, with_draft, overrides, stream_sums):
    from specdec_fast.kernels.verify._triton_plan import plan_launches

    return plan_launches(batch, k, V, with_draft, num_sms=1, interpreting=True, modes=frozenset({"greedy"}), cap=CAP,
                         stream_sums=stream_sums, **{key: value for key, value in overrides.items()
                                                     if key in ("num_chunks", "block_v", "stream_lanes", "stream_unroll")})


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-K{c[1]}-{'draft' if c[2] else 'nodraft'}"
                         f"-{'pen' if c[3] else 'nopen'}-{'lanes' if c[4]['stream_lanes'] else 'blocks'}")
def test_argmax_only_gives_the_reference_tokens(case, device):
    batch, k, with_draft, with_pen, overrides = case
    target, draft, drafts = _tied_problem(batch, k, with_draft, seed=batch * 10 + k)
    target, drafts = target.to(device), drafts.to(device)
    draft = None if draft is None else draft.to(device)
    params = make_sampling_tensors(batch, device, seed=3, temperature=0.0)
    assert params.modes == {"greedy"}
    pen = random_penalties(batch, V, 17 + k, device) if with_pen else None
    assert not _plan_of(batch, k, with_draft, overrides, False).stream_sums  # the argmax-only kernel runs
    assert _plan_of(batch, k, with_draft, overrides, None).stream_sums is not _triton_plan.STREAM_GREEDY_ARGMAX_ONLY
    expected = chain_verify_reference(target, draft, drafts, params, pen)
    kw = dict(cap=CAP, **overrides)
    without_sums = chain_verify_triton(target, draft, drafts, params, pen, stream_sums=False, **kw)
    with_sums = chain_verify_triton(target, draft, drafts, params, pen, stream_sums=True, **kw)
    for got in (without_sums, with_sums):
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (got, expected)
    assert bool((expected[1] > 0).any()), "no row accepted a draft: the tokens are the first argmax only"
    positions = torch.arange(batch, dtype=torch.int64, device=device) * 3
    sampled = sample_reference(target[:, 0], params, positions, 2)
    assert torch.equal(sample_triton(target[:, 0], params, positions, 2, stream_sums=False, **kw), sampled)


@pytest.mark.parametrize("with_draft", [False, True])
def test_greedy_trees_without_the_sums(with_draft, device):
    """tree_verify with every row greedy over tie-heavy logits (V > CAP: the streaming statistics),
    children mostly the parent's first argmax so that paths run deep: the reference's tokens and
    path with the stream's sums and without."""
    batch, n, vocab = 2, 9, 4200
    g = torch.Generator().manual_seed(5 + with_draft)
    target = torch.randint(-2, 2, (batch, n, vocab), generator=g).float()
    target[:, :, 5::41] = float("-inf")
    draft = torch.randint(-2, 2, (batch, n, vocab), generator=g).float() if with_draft else None
    parents = random_parents(g, batch, n)
    first = target.argmax(-1)
    at_parent = first.gather(1, parents.clamp(min=0).long())
    tokens = torch.where(torch.rand(batch, n, generator=g) < 0.75, at_parent, torch.randint(0, vocab, (batch, n), generator=g))
    if draft is not None:  # the draft's argmax is the target's where the child follows it: greedy accepts there
        draft = torch.where(torch.rand(batch, n, 1, generator=g) < 0.8, target, draft)
    params = make_sampling_tensors(batch, device, seed=1, temperature=0.0)
    target, tokens, parents = target.to(device), tokens.to(device), parents.to(device)
    draft = None if draft is None else draft.to(device)
    plan = tree_plan(batch, n, vocab, with_draft, modes=params.modes, max_children=None, num_sms=1, interpreting=True,
                     block_v=512, num_chunks=3, stream_sums=False)
    assert plan.stats.large_vocab and not plan.stats.stream_sums
    expected = tree_verify_reference(target, draft, tokens, parents, params)
    assert bool((expected[2] > 1).any()), "no row accepted two nodes: the walk hardly ran"
    for sums in (False, True):
        got = tree_verify_triton(target, draft, tokens, parents, params, block_v=512, num_chunks=3, stream_sums=sums)
        for a, b in zip(got, expected):
            assert torch.equal(a.long(), b.long()), (sums, got, expected)


def test_the_tie_data_decides_tokens():
    """Control: the same problems' tokens with the HIGHEST index of each maximum differ from the
    reference's (lowest) in every case, so a stream that broke the tie rule would fail the test
    above (greedy tokens are the target's argmaxes: _triton_greedy.py)."""
    for batch, k, with_draft, _, _ in CASES:
        target, _, _ = _tied_problem(batch, k, with_draft, seed=batch * 10 + k)
        lowest = target.argmax(-1)
        highest = V - 1 - target.flip(-1).argmax(-1)
        assert bool((lowest != highest).all()), "every distribution's maximum must be tied"


def test_sums_stay_where_a_row_samples():
    """stream_sums=False is taken only where every row is greedy: a sampling row needs the sums (its
    emission standardises with them), the selection code forbids it too."""
    from specdec_fast.kernels.verify._triton_plan import plan_launches

    def plan(modes, **kw):
        return plan_launches(2, 3, 128256, True, num_sms=132, interpreting=False, modes=frozenset(modes),
                             stream_sums=False, **kw)

    assert not plan({"greedy"}).stream_sums
    assert plan({"plain"}).stream_sums and plan({"greedy", "plain"}).stream_sums and plan({"top_k"}).stream_sums
    assert plan({"greedy"}, selects=True).stream_sums  # the bench's kernel with the selection code
    assert plan_launches(2, 3, 1000, True, num_sms=132, interpreting=False, modes=frozenset({"greedy"}),
                         stream_sums=False).stream_sums  # small vocabularies: their own kernel, unchanged
    assert not plan({"greedy"}, emits=False).stream_sums  # tree_verify's statistics of greedy rows


def test_the_plan_rounds_lanes_to_whole_steps():
    """The argmax-only stream's unroll (_triton_plan.STREAM_ARGMAX_UNROLL, STREAM_ARGMAX_MIN_STEPS,
    STREAM_ARGMAX_STEP_COST): at most what gives a lane two steps, the one whose lane rounded up to whole steps
    costs least, and the lanes rounded; the CASES above run the interpreter plans asserted here. At the H200's shapes (K = 4, V = 128256): the B = 64
    verify 4 blocks a step (timed: 62.0 against 77.2 us), the B = 64 sampler 2 (17.9 against 18.6; 4 in one step
    19.1), B = 128's one lane of 63 blocks rounded to 64."""
    from specdec_fast.kernels.verify._triton_plan import plan_launches

    def plan(batch, k, vocab, with_draft, interpreting=True, **kw):
        return plan_launches(batch, k, vocab, with_draft, num_sms=1 if interpreting else 132, interpreting=interpreting,
                             modes=frozenset({"greedy"}), cap=CAP if interpreting else None, **kw)

    def lanes(p):
        assert p.stream_lanes and not p.stream_sums
        return p.stream_unroll, p.select_chunk, p.select_chunks

    assert lanes(plan(2, 2, V, True, block_v=32)) == (4, 640, 1)  # 19 blocks: one lane of 20, past V (16 by the costs)
    assert lanes(plan(1, 1, V, False, block_v=32)) == (2, 320, 2)  # 10 blocks: 2 a step (8.7) over 12 at 4 (9.6)
    assert lanes(plan(1, 0, V, False, block_v=32)) == (1, 160, 4)  # the sampler's 5 blocks: 6 at 2 a step cost 5.2
    assert lanes(plan(2, 0, V, False, block_v=32)) == (2, 320, 2)

    def gpu(batch, k, with_draft):
        p = plan(batch, k, 128256, with_draft, interpreting=False)
        return p.stream_unroll, p.select_chunk // p.select_block_v, p.select_chunks

    assert gpu(64, 4, True) == (4, 32, 2) and gpu(64, 0, False) == (2, 4, 16) and gpu(128, 4, True) == (4, 64, 1)
    assert gpu(8, 4, True) == (1, 5, 13) and gpu(4, 4, True) == (1, 3, 21) and gpu(1, 4, True)[0] == 1
    assert gpu(128, 0, False) == (2, 8, 8) and gpu(256, 0, False) == (2, 14, 5)  # 7 -> 8 blocks; 13 -> 14, not 16
    p = plan(64, 4, 50257, True, interpreting=False)  # lanes of 13 blocks: 14 at 2 a step, not 16 at 4
    assert (p.stream_unroll, p.select_chunk // p.select_block_v, p.select_chunks) == (2, 14, 2)
    # the sums keep STREAM_UNROLL; a pinned unroll or chunk count is taken as given (lowered to divide a lane)
    assert plan(64, 4, 128256, True, interpreting=False, stream_sums=True).stream_unroll == _triton_plan.STREAM_UNROLL
    assert plan(64, 0, 128256, False, interpreting=False, stream_unroll=4).stream_unroll == 4
    assert (plan(2, 2, V, True, block_v=32, num_chunks=1).select_chunk, plan(2, 2, V, True, block_v=32, num_chunks=1)
            .stream_unroll) == (608, 1)  # 19 blocks: 4 a step halved to the one that divides them
    assert plan(2, 2, V, True, block_v=32, num_chunks=2).stream_unroll == 2  # lanes of 10 blocks: 2 divides them
    assert plan(2, 2, V, True, block_v=64, num_chunks=2).stream_unroll == 1  # lanes of 5: under two steps of 4, 2 odd
