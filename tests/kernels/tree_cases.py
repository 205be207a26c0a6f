"""Token-tree problems for the tree_verify tests: random tree shapes (ragged), and a Markov
"model" whose next-token logits depend on the previous token, so that emitted sequences can be
checked against the target distribution token after token."""
import torch

from specdec_fast.kernels import make_sampling_tensors, standardise


def random_parents(gen: torch.Generator, batch: int, n: int, absent: float = 0.0) -> torch.Tensor:
    """int64 [B, N]: row b a random tree in topological order (parent of i uniform in [0, i)),
    with about a fraction ``absent`` of the nodes absent (parent -1, and so their subtrees)."""
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    for i in range(1, n):
        parents[:, i] = (torch.rand(batch, generator=gen) * i).long()
    if absent > 0:
        parents[:, 1:][torch.rand(batch, n - 1, generator=gen) < absent] = -1
        # a node under an absent parent is absent too (check_tree rejects orphans)
        for i in range(1, n):
            pi = parents[:, i]
            orphan = (pi > 0) & (parents.gather(1, pi.clamp(min=0)[:, None])[:, 0] < 0)
            parents[orphan, i] = -1
    return parents


def shape_parents(branching: list[int]) -> list[int]:
    """Parents of the full tree where every node at depth d has branching[d] children (BFS order)."""
    parents, level = [-1], [0]
    for b in branching:
        nxt = []
        for node in level:
            for _ in range(b):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


# A small irregular tree: the root has 3 children; the first child 2 children (one of them with
# 2 more), the second child 1: depths 1..3, branching 1..3, leaves at every depth.
IRREGULAR = [-1, 0, 0, 0, 1, 1, 2, 4, 4]


class MarkovPair:
    """Target and draft next-token logits as tables [V, V] over the previous token (the draft a
    noisy copy). ``expand`` turns a batch of token trees into the logits tree_verify takes."""

    def __init__(self, vocab: int, seed: int, sharp: float = 1.6, noise: float = 1.0):
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.target = torch.randn(vocab, vocab, generator=g) * sharp
        self.draft = self.target + torch.randn(vocab, vocab, generator=g) * noise
        self.target[:, 1] = float("-inf")  # a token the target never emits

    def probs(self, table: torch.Tensor, **mode) -> torch.Tensor:
        params = make_sampling_tensors(table.shape[0], "cpu", **mode)
        return torch.softmax(standardise(table[:, None], params)[:, 0], -1)

    def grow(self, gen, parents: list[int], rows: int, root: int, children: str, **mode) -> torch.Tensor:
        """tokens int64 [rows, N] of trees of shape ``parents``: children "sample" (i.i.d. from the
        draft's standardised distribution at the parent) or "top" (the draft's top-b by logit, in rank order)."""
        n = len(parents)
        p = self.probs(self.draft, **mode)
        ranked = self.draft.argsort(-1, descending=True)
        tokens = torch.full((rows, n), root, dtype=torch.int64)
        rank = [0] * n
        for i in range(1, n):
            rank[i] = sum(1 for c in range(1, i) if parents[c] == parents[i])
            prev = tokens[:, parents[i]]
            if children == "sample":
                tokens[:, i] = torch.multinomial(p[prev], 1, generator=gen)[:, 0]
            else:
                tokens[:, i] = ranked[prev, rank[i]]
        return tokens

    def expand(self, tokens: torch.Tensor, with_draft: bool):
        """(target_logits [B, N, V], draft_logits [B, N, V] or None) at each node of the trees."""
        return self.target[tokens], (self.draft[tokens] if with_draft else None)


def conditional_chi_square_pvalue(prev: torch.Tensor, nxt: torch.Tensor, cond_probs: torch.Tensor,
                                  min_expected: float = 5.0) -> float:
    """p-value of tokens nxt [M] given prev [M] against cond_probs [V, V] (row = prev): one
    chi-square over every (prev, nxt) bin, expected count(prev) * cond_probs[prev, nxt], bins
    with expected < min_expected pooled within their prev group; dof = sum over groups of
    (bins - 1). Tokens of zero probability must never appear (asserted)."""
    import numpy as np
    from scipy.stats import chi2

    vocab = cond_probs.shape[0]
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    counts.index_put_((prev.long(), nxt.long()), torch.ones(prev.shape[0], dtype=torch.float64), accumulate=True)
    probs = cond_probs.double()
    assert counts[probs == 0].sum() == 0, "sampled a token of zero probability"
    stat, dof = 0.0, 0
    for a in range(vocab):
        n = counts[a].sum().item()
        if n == 0:
            continue
        expected = (probs[a] * n).numpy()
        observed = counts[a].numpy()
        big = expected >= min_expected
        obs, exp = list(observed[big]), list(expected[big])
        if (~big).any() and expected[~big].sum() > 0:
            obs.append(observed[~big].sum())
            exp.append(expected[~big].sum())
        if len(obs) < 2:
            continue
        obs, exp = np.array(obs), np.array(exp)
        stat += float(((obs - exp) ** 2 / exp).sum())
        dof += len(obs) - 1
    return 1.0 if dof == 0 else float(chi2.sf(stat, dof))


def grow_dynamic(pair: "MarkovPair", gen, counts: list[int], rows: int, roots: torch.Tensor, children: str,
                 acceptance=(0.6, 0.25, 0.1, 0.05), **mode):
    """(tokens int64 [rows, N], parents int64 [rows, N]) of dynamic trees (specdec_fast/drafters/tree_dynamic.py's
    rule, written independently) under the root tokens roots [rows]: counts[d - 1] nodes at depth d; per row, depth d's nodes are the
    counts[d - 1] best (parent, rank) pairs of depth d - 1's nodes, ties to the lower pair, in pair
    order. children "top": score = the parent's path log-probability + log p(the parent's r-th most
    likely token) (EAGLE-2). children "sample": score = the parent's path score + log acceptance[r],
    chosen before the children are drawn i.i.d. from p at the parent; a node's path score adds log p
    of its token. p: the draft's standardised distribution."""
    p = pair.probs(pair.draft, **mode)
    logp = p.log()
    ranked = pair.draft.argsort(-1, descending=True)
    log_acc = torch.tensor(acceptance).log()
    n = 1 + sum(counts)
    tokens = roots[:, None].repeat(1, n)
    parents = torch.full((rows, n), -1, dtype=torch.int64)
    score = torch.zeros(rows, n)
    above, start = torch.tensor([0]), 1
    for count in counts:
        width = count if start == 1 else min(count, len(acceptance))
        prev = tokens[:, above]  # [rows, E]
        if children == "top":
            cand = score[:, above, None] + logp[prev[:, :, None], ranked[prev][:, :, :width]]
        else:
            cand = (score[:, above, None] + log_acc[:width]).expand(rows, -1, -1)
        keep = cand.reshape(rows, -1).sort(dim=-1, descending=True, stable=True).indices[:, :count].sort(dim=-1).values
        slot, rank = keep // width, keep % width
        parent = above[slot]
        ptok = tokens.gather(1, parent)
        if children == "top":
            tok = ranked[ptok, rank]
        else:
            tok = torch.multinomial(p[ptok.reshape(-1)], 1, generator=gen).view(rows, count)
        end = start + count
        tokens[:, start:end], parents[:, start:end] = tok, parent
        score[:, start:end] = score.gather(1, parent) + logp[ptok, tok]
        above, start = torch.arange(start, end), end
    return tokens, parents
