"""tree_verify's parallel walk (kernels/tree_verify/_triton_walk.py: every node's test at once,
then the accepted path) against the scan it may replace and the torch reference: the same
tokens, path and acceptances bit for bit, over modes, sampled / top-b children, ragged trees,
bounded children and awkward sizes. The table must reach what the parallel form reconstructs
instead of walking: children accepted after rejected siblings (lam and the mass of a sibling
test by rank), final nodes whose children were all rejected, repeated tokens among top-b children.
Controls (run by hand, each caught only by the wide-tree rows below): lam summed as 1 + 1 + ...
instead of 1 + W_1 + ... (11 of 64 rows differ from the scan), a repeated top-b token subtracted
from the mass (5 of 64)."""
import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.tree_verify import tree_verify
from specdec_fast.kernels.tree_verify._triton_plan import WALK_PARALLEL, tree_plan
from specdec_fast.kernels.tree_verify.triton import tree_verify_triton

from .test_tree_verify_backends import tree_problem
from .tree_cases import shape_parents

MIXED = "mixed"  # greedy and sampled rows in one batch (modes read from the tensor)
CASES = [  # (batch, n, vocab, sampling, draft logits, ragged, max_children)
    (3, 9, 300, dict(temperature=1.0), True, False, None),
    (4, 17, 500, dict(temperature=1.0), True, True, 4),
    (2, 33, 300, dict(temperature=0.7, top_k=40), True, False, None),
    (3, 12, 400, dict(temperature=1.0), False, False, None),
    (3, 33, 300, dict(temperature=0.9, top_p=0.9), False, True, 6),  # a node has 6 children here
    (3, 13, 300, dict(temperature=0.0), True, False, None),
    (2, 21, 300, dict(temperature=0.0), False, True, None),
    (4, 10, 300, MIXED, True, True, None),
    (1, 64, 1000, dict(temperature=1.0), True, False, 6),
    (1, 64, 1000, dict(temperature=0.0), False, False, 6),
    (2, 2, 300, dict(temperature=1.0), True, False, None),
    (2, 1, 300, dict(temperature=1.0), False, False, None),
]


def _sampling(batch, sampling):
    if sampling == MIXED:
        return dict(temperature=torch.tensor([0.0, 0.8] * (batch // 2) + [0.0] * (batch % 2)))
    return sampling


def _problem(case):
    """(target, draft, tokens, parents, offsets, sampling kwargs, seed) of a CASES row, on the CPU."""
    batch, n, vocab, sampling, with_draft, ragged, _ = case
    kw = _sampling(batch, sampling)
    seed = 31 * n + batch
    return (*tree_problem(batch, n, vocab, torch.float32, with_draft, ragged, seed, kw), kw, seed)


def _run(case, walk_parallel, device) -> list:
    """tree_verify_triton's (tokens, path, num_accepted) of a CASES row, on the CPU."""
    target, draft, tokens, parents, offsets, kw, seed = _problem(case)
    params = make_sampling_tensors(case[0], device, seed=seed, offset=offsets.to(device),
                                   **{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    args = (target.to(device), None if draft is None else draft.to(device), tokens.to(device), parents.to(device))
    return [g.cpu() for g in tree_verify_triton(*args, params, max_children=case[6], walk_parallel=walk_parallel)]


def _ranks(parents: torch.Tensor) -> torch.Tensor:
    """Each node's number of earlier siblings [B, N]."""
    par = parents.long()
    earlier = (par[:, :, None] == par[:, None, :]) & (par[:, :, None] >= 0)  # [B, s, c]
    earlier &= torch.ones(par.shape[1], par.shape[1], dtype=torch.bool).triu(1)  # s < c
    return earlier.sum(1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-N{c[1]}-V{c[2]}-{'mixed' if c[3] == MIXED else c[3]}-"
                         f"{'sampled' if c[4] else 'top'}{'-ragged' if c[5] else ''}-kmax{c[6]}")
def test_parallel_walk_equals_the_scan_and_the_reference(case, device):
    parallel, scan = _run(case, True, device), _run(case, False, device)
    target, draft, tokens, parents, offsets, kw, seed = _problem(case)
    reference = tree_verify(target, draft, tokens, parents, backend="torch", seed=seed, offset=offsets, **kw)
    assert all(torch.equal(a, b) for a, b in zip(parallel, scan))
    assert torch.equal(parallel[0], reference.tokens) and torch.equal(parallel[1], reference.path)
    assert torch.equal(parallel[2], reference.num_accepted)


def test_the_table_reaches_later_siblings_and_rejected_finals(device):
    """Sampled children accepted at rank >= 2 (lam_2 = 1 + W_1 and the mass W_2 in the test), top-b
    children accepted after a rejected sibling, and rows ending at a node with children (all
    rejected: the emission's lam); greedy rows on paths deeper than one level."""
    reached = {"sampled rank>=2": 0, "top rank>=1": 0, "final with children": 0, "greedy depth>=2": 0}
    for case in CASES:
        batch, n, _, sampling, with_draft, _, _ = case
        if n < 9:
            continue
        tokens, path, accepted = _run(case, True, device)
        parents = _problem(case)[3]
        ranks = _ranks(parents)
        on_path = path.clamp(min=0)
        path_ranks = torch.where(path > 0, ranks.gather(1, on_path.long()), 0)
        final = on_path.gather(1, accepted.long()[:, None])[:, 0]
        has_children = (parents.long() == final[:, None]).any(1)
        greedy = _sampling(batch, sampling)["temperature"]
        greedy = greedy == 0 if isinstance(greedy, torch.Tensor) else torch.full((batch,), greedy == 0)
        sampled = ~greedy
        if with_draft:
            reached["sampled rank>=2"] += int(((path_ranks >= 2).any(1) & sampled).sum())
        else:
            reached["top rank>=1"] += int(((path_ranks >= 1).any(1) & sampled).sum())
        reached["final with children"] += int((has_children & sampled).sum())
        reached["greedy depth>=2"] += int(((accepted >= 2) & greedy).sum())
    assert all(count > 0 for count in reached.values()), reached


@pytest.mark.parametrize("with_draft", [True, False], ids=["sampled", "top"])
def test_wide_trees_of_many_rows(with_draft, device):
    """Every row the full tree of branching 5, 3, 2 (51 nodes, up to 4 rejections before a test),
    32 rows, vocabularies of 24 (repeated tokens among siblings) and 300; tokens drawn at their
    parents: many sibling tests at every rank, bit for bit equal to the scan and the reference."""
    batch, parents_list = 32, shape_parents([5, 3, 2])
    n = len(parents_list)
    for vocab in (24, 300):
        target, draft, tokens, _, offsets = tree_problem(batch, n, vocab, torch.float32, with_draft, False, 5,
                                                         dict(temperature=1.0))
        parents = torch.tensor(parents_list).expand(batch, -1).contiguous()
        probs = torch.softmax((draft if with_draft else target).float(), -1)
        g = torch.Generator().manual_seed(9)
        for i in range(1, n):
            tokens[:, i] = torch.multinomial(probs[torch.arange(batch), parents[:, i]], 1, generator=g)[:, 0]
        params = make_sampling_tensors(batch, device, seed=5, offset=offsets.to(device), temperature=1.0)
        args = [None if a is None else a.to(device) for a in (target, draft, tokens, parents)]
        scan = tree_verify_triton(*args, params, max_children=5, walk_parallel=False)
        parallel = tree_verify_triton(*args, params, max_children=5, walk_parallel=True)
        assert all(torch.equal(a, b) for a, b in zip(parallel, scan)), vocab
        reference = tree_verify(target, draft, tokens, parents, backend="torch", seed=5, offset=offsets, temperature=1.0)
        assert torch.equal(parallel[0].cpu(), reference.tokens), vocab


def test_the_plan_names_the_walk():
    plan = tree_plan(2, 9, 300, True, modes=frozenset({"plain"}), max_children=None, num_sms=1, interpreting=True,
                     walk_parallel=True)
    assert plan.walk_parallel and plan.walk_block_r == 1
    assert not tree_plan(2, 9, 300, True, modes=None, max_children=None, num_sms=1, interpreting=True,
                         walk_parallel=False).walk_parallel
    # the default: the parallel walk on compiled kernels (WALK_PARALLEL, as an H200 timed it), the
    # scan under the interpreter
    default = {interpreting: tree_plan(2, 9, 300, True, modes=None, max_children=None, num_sms=132,
                                       interpreting=interpreting).walk_parallel for interpreting in (False, True)}
    assert default == {False: WALK_PARALLEL, True: False}
