"""Paged runners score a token tree in one pass: score(tokens, tree=(mask, depths)) gives each
node the logits of its own root-to-node path (scored as a plain chain), and commit_path keeps
exactly the accepted path's K/V (the next call continues as if only that path had been fed).
Llama and GPT-2 runners, and the recurrent families' (each node from its parent's states; commit_path keeps the
accepted path's last node's), batch 1 and 3, ragged prompts."""
import pytest
import torch

from specdec_fast.runners.registry import paged_runner_class
from specdec_fast.drafters.token_tree import TokenTree

from .conftest import model_pair
from .models import VOCAB, left_padded_prompts

TREE = TokenTree.from_branching([3, 2, 1])  # 1 + 3 + 6 + 6 = 16 nodes


def _runner(model, k):
    return paged_runner_class(model)(model, max_new_tokens=16, num_draft_tokens=k)


def _path(tree, node):
    out = []
    while node > 0:
        out.append(node)
        node = tree.parents[node]
    return out[::-1]


# The recurrent families (runners/paged_recurrent.py): each node continues its parent's states -- the Gated DeltaNet
# (Qwen3-Next), KDA with latent attention (Kimi Linear), lightning attention (MiniMax), Mamba2 (Nemotron-H), Mamba1 with
# attention (Jamba), LFM2's short convolutions, a pure Mamba1 LM
RECURRENT = ["qwen3_next", "kimi_linear", "minimax", "nemotron_h", "jamba", "lfm2", "mamba"]


@pytest.mark.parametrize("kind", ["llama", "gpt2"] + RECURRENT)
@pytest.mark.parametrize("lengths", [[6], [5, 9, 3]])
def test_tree_scoring_equals_scoring_each_path(kind, lengths):
    target, _ = model_pair(kind)
    ids, mask = left_padded_prompts(lengths, seed=len(lengths))
    batch, n = len(lengths), TREE.size
    tokens = torch.randint(3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(1))
    tensors = TREE.tensors("cpu")
    runner = _runner(target, n - 1)
    runner.prefill(ids, mask)
    tree_logits = runner.score(tokens, tree=(tensors["mask"], tensors["depths"]))
    for node in range(n):
        path = [0] + _path(TREE, node)  # node 0 is fed too: the root token
        chain = _runner(target, n - 1)
        chain.prefill(ids, mask)
        chain_logits = chain.score(tokens[:, path])
        torch.testing.assert_close(tree_logits[:, node], chain_logits[:, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_scoring_some_rows_gives_those_rows_and_feeds_every_token(kind):
    """score(..., rows=R): the logits of the R positions alone, equal to the same rows of a full
    call (the lm_head runs on R rows; TreeDrafter asks for each level's expanding nodes), and the
    cache as after the full call: the next token scores the same."""
    target, _ = model_pair(kind)
    ids, mask = left_padded_prompts([5, 9, 3], seed=11)
    batch, n = 3, TREE.size
    tokens = torch.randint(3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(4))
    tensors = TREE.tensors("cpu")
    rows = torch.tensor([n - 1, 2, 7, 0])  # any order, any subset
    full_runner, some_runner = _runner(target, n), _runner(target, n)
    for runner in (full_runner, some_runner):
        runner.prefill(ids, mask)
    full = full_runner.score(tokens, tree=(tensors["mask"], tensors["depths"]))
    some = some_runner.score(tokens, tree=(tensors["mask"], tensors["depths"]), rows=rows)
    assert some.shape == (batch, len(rows), full.shape[-1])
    torch.testing.assert_close(some, full[:, rows], rtol=1e-5, atol=1e-5)
    keep = torch.full((batch,), 2, dtype=torch.int32)
    path = torch.full((batch, n), -1, dtype=torch.int32)
    path[:, :2] = torch.tensor([0, 1], dtype=torch.int32)
    nxt = torch.randint(3, VOCAB, (batch, 1), generator=torch.Generator().manual_seed(5))
    after = []
    for runner in (full_runner, some_runner):
        runner.commit_path(path, keep)
        after.append(runner.score(nxt)[:, -1])
    torch.testing.assert_close(after[0], after[1], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["llama", "gpt2"] + RECURRENT)
def test_commit_path_keeps_exactly_the_accepted_path(kind):
    """After a tree call and commit_path of a different path per row, one more token scores like
    a runner that was fed prompt + that path as a chain."""
    target, _ = model_pair(kind)
    ids, mask = left_padded_prompts([5, 9, 3], seed=7)
    batch, n = 3, TREE.size
    tokens = torch.randint(3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(2))
    tensors = TREE.tensors("cpu")
    runner = _runner(target, n - 1)
    runner.prefill(ids, mask)
    runner.score(tokens, tree=(tensors["mask"], tensors["depths"]))
    leaves = [n - 1, 5, 0]  # a depth-3 path, a depth-2 path, the root alone
    paths = [[0] + _path(TREE, leaf) for leaf in leaves]
    path = torch.full((batch, n), -1, dtype=torch.int32)
    for b, p in enumerate(paths):
        path[b, : len(p)] = torch.tensor(p)
    keep = torch.tensor([len(p) for p in paths])
    runner.commit_path(path, keep)
    nxt = torch.randint(3, VOCAB, (batch, 1), generator=torch.Generator().manual_seed(3))
    after = runner.score(nxt)[:, -1]
    for b, p in enumerate(paths):
        chain = _runner(target, n - 1)
        chain.prefill(ids[b : b + 1], mask[b : b + 1])
        expected = chain.score(torch.cat([tokens[b : b + 1, p], nxt[b : b + 1]], 1))[:, -1]
        torch.testing.assert_close(after[b : b + 1], expected, rtol=1e-4, atol=1e-4)
    assert runner.cache.seq_lens.tolist() == (mask.sum(1) + keep).tolist()


def _random_tree_like(tree, gen) -> TokenTree:
    """A tree with ``tree``'s nodes per depth, each node hung on a random node of the depth above (BFS order)."""
    parents = [-1]
    for d in range(1, tree.depth + 1):
        above = tree.level(d - 1)
        picks = sorted(above[int(i)] for i in torch.randint(0, len(above), (len(tree.level(d)),), generator=gen))
        parents += picks
    return TokenTree(tuple(parents))


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen3_next", "nemotron_h"])
def test_per_row_tree_masks(kind):
    """score(tree=(mask [B, N], depths [N])): each row its own tree (a dynamic tree's shapes)."""
    target, _ = model_pair(kind)
    ids, mask = left_padded_prompts([5, 9, 3], seed=4)
    gen = torch.Generator().manual_seed(5)
    trees = [_random_tree_like(TREE, gen) for _ in range(3)]
    assert len({t.parents for t in trees}) == 3
    n = TREE.size
    tokens = torch.randint(3, VOCAB, (3, n), generator=gen)
    masks = torch.stack([t.tensors("cpu")["mask"] for t in trees])
    runner = _runner(target, n - 1)
    runner.prefill(ids, mask)
    tree_logits = runner.score(tokens, tree=(masks, TREE.tensors("cpu")["depths"]))
    for b, tree in enumerate(trees):
        for node in range(n):
            path = [0] + _path(tree, node)
            chain = _runner(target, n - 1)
            chain.prefill(ids[b : b + 1], mask[b : b + 1])
            torch.testing.assert_close(tree_logits[b, node], chain.score(tokens[b : b + 1, path])[0, -1], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"the mask must have shape \[N\] or \[B, N\]"):
        runner.score(tokens, tree=(masks[:2], TREE.tensors("cpu")["depths"]))


def test_controls_the_recurrent_tree_needs_its_parents_and_its_path(monkeypatch):
    """Spoiled on Qwen3-Next: (1) every node continues the node before it (a chain's rule, not its parent's state);
    (2) commit_path keeps the snapshot of tentative slot keep - 1 (a chain's), not the path's last node's. Each fails
    the check above it."""
    from specdec_fast.runners import paged_recurrent

    with monkeypatch.context() as patch:
        patch.setattr(paged_recurrent, "tree_parents", lambda mask: torch.arange(mask.shape[1]).expand_as(mask) - 1)
        with pytest.raises(AssertionError):
            test_tree_scoring_equals_scoring_each_path("qwen3_next", [5, 9, 3])
    keep_states = paged_recurrent.PagedRecurrentRunner._keep_states
    with monkeypatch.context() as patch:
        patch.setattr(paged_recurrent.PagedRecurrentRunner, "_keep_states", lambda self, keep, path=None: keep_states(self, keep))
        with pytest.raises(AssertionError):
            test_commit_path_keeps_exactly_the_accepted_path("qwen3_next")
