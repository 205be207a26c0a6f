"""Every tree_verify backend token for token (and node for node) against the torch reference.

Parameters are covered pairwise (every pair of values of any two axes in some case; the greedy
covering of test_verify_backends): batch, tree size N (awkward, up to 64), vocab, logits dtype,
sampling mode, sampled vs deterministic children, ragged trees (absent nodes). Exact equality is
asserted: the inputs are continuous random logits, so no decision sits within float rounding of
its boundary (as for chain_verify)."""
import itertools

import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors, standardise
from specdec_fast.kernels.tree_verify import tree_verify

from .backends import kernel_backends
from .test_verify_backends import DTYPES, _modes
from .tree_cases import random_parents

BACKENDS = [b for b in kernel_backends() if b != "torch"]

AXES = {
    "batch": [1, 3, 17],
    "n": [2, 7, 33, 64],
    "vocab": [111, 1000, 32000],
    "dtype": list(DTYPES),
    "mode": list(_modes(1)),
    "draft_logits": [True, False],
    "ragged": [True, False],
}


def _affordable(case: dict) -> bool:
    """Interpreter runs stay short: at most ~300k logits per call."""
    return case["batch"] * case["n"] * case["vocab"] <= 300_000


def _pairs(case: dict) -> set:
    return {(a, case[a], b, case[b]) for a, b in itertools.combinations(AXES, 2)}


def _pairwise_cases() -> list[dict]:
    candidates = [dict(zip(AXES, values)) for values in itertools.product(*AXES.values())]
    candidates = [c for c in candidates if _affordable(c)]
    bit = {}
    masks = [sum(1 << bit.setdefault(pair, len(bit)) for pair in _pairs(c)) for c in candidates]
    uncovered = (1 << len(bit)) - 1
    chosen = []
    while uncovered:
        best = max(range(len(candidates)), key=lambda i: (masks[i] & uncovered).bit_count())
        chosen.append(candidates[best])
        uncovered &= ~masks[best]
    return chosen


CASES = _pairwise_cases()
# The interpreter pays per operation and the walk is a scan over the N nodes (~10 s at N = 64 on
# the shared 2-core box): Triton runs N = 64 in one sampled and one top-b case (N is only a
# compile-time size there; the C++ column runs every case).
_TRITON_N64 = [next(c for c in CASES if c["n"] == 64 and c["draft_logits"] is d) for d in (True, False)]
TRITON_CASES = [c for c in CASES if c["n"] < 64] + _TRITON_N64


def _backend_cases():
    slow = dict(marks=pytest.mark.slow)  # N = 64 through the interpreter: ~10 s each
    return [pytest.param(case, backend, id=f"{_case_id(case)}-{backend}", **(slow if backend == "triton" and case["n"] == 64 else {}))
            for backend in BACKENDS for case in (TRITON_CASES if backend == "triton" else CASES)]


def _case_id(c: dict) -> str:
    return (f"B{c['batch']}-N{c['n']}-V{c['vocab']}-{c['dtype']}-{c['mode']}-{'sampled' if c['draft_logits'] else 'top'}"
            f"{'-ragged' if c['ragged'] else ''}")


def tree_problem(batch, n, vocab, dtype, with_draft, ragged, seed, kw):
    """Random logits per node (target with a few -inf), trees of random shape, each child's token
    drawn from its parent's standardised draft (or target) distribution, 20% random instead."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, n, vocab, generator=g) * 2.5
    target[:, :, 1::37] = float("-inf")
    draft = target + torch.randn(batch, n, vocab, generator=g)
    target, draft = target.to(dtype), draft.to(dtype)
    parents = random_parents(g, batch, n, absent=0.25 if ragged else 0.0)
    params = make_sampling_tensors(batch, "cpu", seed=seed, **kw)
    probs = torch.softmax(standardise(draft if with_draft else target, params), -1)  # [B, N, V]
    tokens = torch.zeros(batch, n, dtype=torch.int64)
    for i in range(1, n):
        at_parent = probs[torch.arange(batch), parents[:, i].clamp(min=0)]
        tokens[:, i] = torch.multinomial(at_parent, 1, generator=g)[:, 0]
    wrong = torch.randint(0, vocab, (batch, n), generator=g)
    tokens = torch.where(torch.rand(batch, n, generator=g) < 0.2, wrong, tokens)
    tokens[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return target, (draft if with_draft else None), tokens, parents, offsets


@pytest.mark.parametrize("case,backend", _backend_cases())
def test_tree_verify_matches_the_reference(case, backend, device):
    batch, n, vocab = case["batch"], case["n"], case["vocab"]
    kw = _modes(batch)[case["mode"]]
    seed = 2000 + CASES.index(case)
    target, draft, tokens, parents, offsets = tree_problem(batch, n, vocab, DTYPES[case["dtype"]], case["draft_logits"],
                                                           case["ragged"], seed, kw)
    common = dict(seed=seed, offset=offsets, **kw)
    expected = tree_verify(target, draft, tokens, parents, backend="torch", **common)
    dev = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in common.items()}
    got = tree_verify(target.to(device), None if draft is None else draft.to(device), tokens.to(device),
                      parents.to(device), backend=backend, **dev)
    assert all(t.dtype == torch.int32 for t in got)
    assert torch.equal(got.num_accepted.cpu(), expected.num_accepted), (got.num_accepted, expected.num_accepted)
    assert torch.equal(got.path.cpu(), expected.path), (got.path, expected.path)
    assert torch.equal(got.tokens.cpu(), expected.tokens), (got.tokens, expected.tokens)


def test_the_covering_table_is_pairwise_and_small():
    everything = [dict(zip(AXES, v)) for v in itertools.product(*AXES.values())]
    wanted = set().union(*(_pairs(c) for c in everything if _affordable(c)))
    assert wanted <= set().union(*(_pairs(c) for c in CASES))
    assert len(CASES) <= 40


@pytest.mark.slow
@pytest.mark.skipif("triton" not in BACKENDS, reason="no triton")
@pytest.mark.parametrize("with_draft", [True, False])
def test_triton_vocab_chunks_and_blocks_match_the_reference(with_draft, device):
    """Small vocab blocks and several chunks per row: the multi-block and chunk-merge paths."""
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton

    kw = dict(temperature=0.9, min_p=0.05)  # top-k / top-p would bisect over 8 blocks: slow in the interpreter
    target, draft, tokens, parents, offsets = tree_problem(5, 12, 1000, torch.float32, with_draft, True, 77, kw)
    params = make_sampling_tensors(5, "cpu", seed=77, offset=offsets, **kw)
    expected = tree_verify(target, draft, tokens, parents, backend="torch", seed=77, offset=offsets, **kw)
    dev_params = make_sampling_tensors(5, device, seed=77, offset=offsets.to(device), **kw)
    assert torch.equal(params.seed.to(device), dev_params.seed)
    got = tree_verify_triton(target.to(device), None if draft is None else draft.to(device), tokens.to(device),
                             parents.to(device), dev_params, block_v=128, num_chunks=3)
    assert torch.equal(got[0].cpu(), expected.tokens) and torch.equal(got[1].cpu(), expected.path)
