"""TokenTree: shapes, validation, the best-first tree is the optimal one under its model, masks."""
import itertools

import pytest

from specdec_fast.drafters.token_tree import MAX_NODES, TokenTree, as_token_tree


def test_shapes():
    assert TokenTree.chain(3).parents == (-1, 0, 1, 2)
    tree = TokenTree.from_branching([2, 3])
    assert tree.parents == (-1, 0, 0, 1, 1, 1, 2, 2, 2)
    assert tree.depths == (0, 1, 1, 2, 2, 2, 2, 2, 2) and tree.depth == 2
    assert tree.ranks == (0, 0, 1, 0, 1, 2, 0, 1, 2)
    assert tree.num_children[:3] == (2, 3, 3)
    assert tree.level(1) == [1, 2]


def test_max_children_bounds_every_row():
    tree = TokenTree.from_branching([3, 2])  # 3 children at the root, 2 under each: 6 nodes at depth 2
    assert tree.max_children == 3 and tree.as_dynamic().max_children == 6
    assert TokenTree.chain(4).max_children == 1


def test_ancestor_masks():
    tree = TokenTree.from_branching([2, 2])  # nodes 3, 4 under 1; 5, 6 under 2
    assert tree.ancestor_masks(list(range(7))) == [1, 3, 5, 11, 19, 37, 69]
    assert tree.ancestor_masks([1, 2, 3, 4, 5, 6]) == [1, 2, 5, 9, 18, 34]  # the root not fed: context
    big = TokenTree.chain(63)
    assert big.ancestor_masks(list(range(64)))[-1] == -1  # all 64 bits: int64 two's complement


@pytest.mark.parametrize("parents,message", [
    ((-1,), "2 to 64 nodes"),
    (tuple(range(-1, MAX_NODES)), "2 to 64 nodes"),
    ((0, 0), r"parents\[0\] must be -1"),
    ((-1, 0, 2), r"parents\[2\] = 2: a parent must be a node before its child"),
    ((-1, 0, 1, 0), "not BFS order"),
])
def test_bad_trees_are_refused(parents, message):
    with pytest.raises(ValueError, match=message):
        TokenTree(parents)


def test_bad_children_and_as_token_tree():
    with pytest.raises(ValueError, match="children must be one of"):
        TokenTree((-1, 0), children="beam")
    assert as_token_tree(True) == TokenTree.default()
    assert as_token_tree(True, greedy=True) == TokenTree.recommended(greedy=True)
    assert as_token_tree(12).size == 12
    for bad in ("x", 1.5, False, 1, 65):
        with pytest.raises(ValueError, match="tree must be|2 to 64 nodes"):
            as_token_tree(bad)


def _all_trees(n):
    """Every BFS-ordered tree of n nodes (parents nondecreasing: BFS with ranks in order)."""
    for parents in itertools.product(*[range(i) for i in range(1, n)]):
        if list(parents) == sorted(parents):
            try:
                yield TokenTree((-1,) + parents)
            except ValueError:
                pass


@pytest.mark.parametrize("acceptance", [(0.7, 0.15, 0.05), (0.5, 0.3), (0.9, 0.05, 0.03, 0.01),
                                        [(0.6, 0.3, 0.05), (0.9, 0.05)]])  # per depth: depth 1, then deeper
@pytest.mark.parametrize("n", [4, 6, 7])
def test_best_first_is_optimal_under_its_model(acceptance, n):
    best = TokenTree.best_first(n, acceptance)
    assert best.size == n
    value = best.expected_length(acceptance)
    assert value >= max(t.expected_length(acceptance) for t in _all_trees(n)) - 1e-12


def test_best_first_limits_depth_and_default_sizes():
    capped = TokenTree.best_first(10, (0.9,), max_depth=3)  # one rank, depth <= 3: only a 3-chain exists
    assert capped.parents == (-1, 0, 1, 2)
    assert TokenTree.best_first(10, (0.9, 0.05), max_depth=2).depth == 2
    with pytest.raises(ValueError, match="probabilities"):
        TokenTree.best_first(5, (1.5,))
    with pytest.raises(ValueError, match="probabilities"):
        TokenTree.best_first(5, [(0.5,), (0.0, 0.3)])
    assert TokenTree.best_first(6, (0.8, 0.0, 0.5)).num_children[0] == 1  # ranks stop at the first zero
    for n in (5, 16, 32, 64):
        for greedy in (True, False):
            tree = TokenTree.default(n, greedy=greedy)
            assert tree.size == n and tree.children == "sample" and tree.depth <= 8
    assert TokenTree.default(64, max_depth=None).depth > 8
