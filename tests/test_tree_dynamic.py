"""Dynamic token trees (specdec_fast/drafters/tree_dynamic.py): per-row parents, ranks and masks are a
valid BFS tree with the skeleton's nodes per depth (64 nodes: the int64 sign bit), the top-b
choice is the EAGLE-2 best (parent, rank) set, and the number of sampled children of each parent
is fixed before (and whatever) they are sampled."""
import copy
import math
from types import SimpleNamespace

import pytest
import torch

from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.kernels.verify import prepared_impls
from specdec_fast.drafters.token_tree import TokenTree, as_token_tree
from specdec_fast.drafters.tree_dynamic import DynamicExpansion, log_rank_acceptance, rank_widths

VOCAB = 37


def _expansion(tree, temperatures, sample=None, seed=0):
    batch = len(temperatures)
    params = make_sampling_tensors(batch, "cpu", temperature=torch.tensor(temperatures), top_k=0, seed=seed)
    state = SimpleNamespace(seq=torch.zeros(batch, 1, dtype=torch.long), params=params)
    return DynamicExpansion(tree, state, sample or prepared_impls("torch", "cpu")[1]), params


def _run_levels(dyn, params, gen):
    """Expands every level from random logits [B, E, V]; returns the tokens [B, N]."""
    batch = params.temperature.shape[0]
    tokens = torch.zeros(batch, dyn.tree.size, dtype=torch.long)
    for d, level in enumerate(dyn.levels, 1):
        logits = torch.randn(batch, level.expanding.shape[0], VOCAB, generator=gen) * 3
        tokens[:, level.start:level.end] = dyn.expand(d, logits, params)
    return tokens


@pytest.mark.parametrize("children", ["sample", "top"])
@pytest.mark.parametrize("n", [16, 64])
def test_per_row_trees_are_valid_with_the_skeleton_depths(children, n):
    skeleton = TokenTree.from_branching([3, 2, 1]) if n == 16 else TokenTree.default(64, max_depth=None)
    tree = TokenTree(skeleton.parents, children, dynamic=True)
    dyn, params = _expansion(tree, [0.0, 0.8, 1.3])
    _run_levels(dyn, params, torch.Generator().manual_seed(n))
    shapes = set()
    for b in range(3):
        row = TokenTree(tuple(dyn.parents[b].tolist()), children)  # validates: parents before children, BFS order
        assert row.depths == tree.depths
        assert dyn.ranks[b].tolist() == list(row.ranks)  # siblings by rank 0, 1, ... (a prefix of the ranks)
        assert dyn.mask[b].tolist() == row.tensors("cpu")["mask"].tolist()
        assert max(row.num_children) <= tree.max_children  # the bound tree_verify's launches rely on
        for level in dyn.levels[:-1]:  # the draft's re-feed masks: nodes 1..end - 1 at positions node - 1
            assert dyn.feed_mask(level.end)[b].tolist() == row.ancestor_masks(list(range(1, level.end)))
        shapes.add(row.parents)
    assert len(shapes) > 1, "rows with different logits should get different shapes"
    if n == 64:
        assert (dyn.mask[:, 63] < 0).all()  # node 63's own bit is the sign bit
        assert (dyn.feed_mask(64)[:, 62] > 0).all()  # shifted logically: no sign extension


def test_top_children_are_the_best_parent_rank_pairs():
    """Greedy rows: depth d keeps the n_d (parent, rank) pairs of largest path log-probability
    (the sum of the draft's log-softmax along the path), brute force."""
    tree = TokenTree.from_branching([3, 2, 1]).as_dynamic()
    dyn, params = _expansion(tree, [0.0, 0.0])
    gen = torch.Generator().manual_seed(1)
    for d, level in enumerate(dyn.levels, 1):
        logits = torch.randn(2, level.expanding.shape[0], VOCAB, generator=gen)
        before = dyn.log_score.clone()
        tokens = dyn.expand(d, logits, params)
        logp = torch.log_softmax(logits, -1)
        for b in range(2):
            pairs = [(before[b, int(e)].item() + logp[b, s, v].item(), int(e), v)
                     for s, e in enumerate(level.expanding) for v in range(VOCAB)]
            best = sorted(pairs, key=lambda t: -t[0])[: level.end - level.start]
            got = sorted(zip(dyn.parents[b, level.start:level.end].tolist(), tokens[b].tolist()))
            assert got == sorted((e, v) for _, e, v in best)
            torch.testing.assert_close(dyn.log_score[b, level.start:level.end].sort().values,
                                       torch.tensor(sorted(s for s, _, _ in best)))


def test_sampled_children_counts_are_fixed_before_sampling():
    """Exactness needs i.i.d. children: which parent gets how many sampled children at depth d
    depends on depth d - 1 only, never on the values sampled at depth d."""
    tree = TokenTree.from_branching([3, 2, 2]).as_dynamic()
    gen = torch.Generator().manual_seed(2)
    real = prepared_impls("torch", "cpu")[1]
    dyn, params = _expansion(tree, [0.7, 1.0, 1.5], sample=real)
    for d, level in enumerate(dyn.levels, 1):
        logits = torch.randn(3, level.expanding.shape[0], VOCAB, generator=gen) * 2
        shapes = []
        for fake in (lambda rows, *a: torch.zeros(rows.shape[0], dtype=torch.int32),
                     lambda rows, *a: torch.full((rows.shape[0],), VOCAB - 1, dtype=torch.int32), real):
            other = copy.copy(dyn)
            other.parents, other.ranks, other.mask, other.log_score = (t.clone() for t in
                                                                       (dyn.parents, dyn.ranks, dyn.mask, dyn.log_score))
            other.sample = fake
            other.expand(d, logits, params)
            shapes.append((other.parents[:, level.start:level.end], other.ranks[:, level.start:level.end]))
        for parents, ranks in shapes[1:]:
            assert torch.equal(parents, shapes[0][0]) and torch.equal(ranks, shapes[0][1])
        dyn.expand(d, logits, params)


def test_rank_acceptance_is_made_non_increasing():
    tree = TokenTree.chain(2).as_dynamic(acceptance=[(0.5, 0.1, 0.0, 0.2)])
    assert log_rank_acceptance(tree, 1, 5) == [math.log(0.5), math.log(0.1)] + [float("-inf")] * 3
    assert rank_widths(TokenTree.from_branching([3, 4]).as_dynamic()) == [3, 8]
    assert rank_widths(TokenTree.from_branching([3, 4])) == [3, 4]


def test_dynamic_tree_arguments():
    tree = TokenTree.dynamic_tree(16, greedy=True)
    assert tree.dynamic and tree.parents == TokenTree.default(16, greedy=True).parents
    assert tree.score_temperature == 0.3 and TokenTree.dynamic_tree(16).score_temperature == 1.0
    assert "dynamic" in tree.describe()
    assert as_token_tree("dynamic", greedy=True) == TokenTree.dynamic_tree(greedy=True)
    assert as_token_tree("static") == TokenTree.default()
    with pytest.raises(ValueError, match="score_temperature"):
        TokenTree((-1, 0), score_temperature=0.0)
    with pytest.raises(ValueError, match="dynamic must be a bool"):
        TokenTree((-1, 0), dynamic=1)
    with pytest.raises(ValueError, match="acceptance"):
        TokenTree((-1, 0), dynamic=True, acceptance=[(1.5,)])
