"""Attention's in-kernel split merge (kernels/attention/triton.py MERGE_LAST: the split that takes
its group's last ticket merges the partials; no _merge_splits launch). Over the split table of
test_paged_attention (ragged rows, empty splits, trees, GQA groups, three dtypes) it matches the
float64 oracle and the two-launch merge; on ONE KernelWorkspace, shapes interleaved and each
twice, the tickets are zero after every call (no zero fill needed); the split call is one
launch. Every output element is written: torch.empty hands out NaN-filled memory in these
tests (tests/conftest.py poisoned_empty). Controls: tickets left at their count (a kernel that
stopped resetting them) and a ticket one short (a merge before the last split's partials exist;
interpreter only: a race on a GPU) give wrong outputs."""
import sys
from pathlib import Path

import pytest
import torch

from tests.kernels.attention_cases import make_case, sdpa_oracle
from tests.kernels.test_paged_attention import SPLIT_CASES, TOL

attention_triton = pytest.importorskip("specdec_fast.kernels.attention.triton")
from specdec_fast.kernels._workspace import KernelWorkspace  # noqa: E402


def _call(name, device, **kw):
    seq, ql, hq, hkv, d, bs, dtype, tree, split = SPLIT_CASES[name]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, seed=7, device=device)

    def run(merge_in_kernel, workspace=None):
        return attention_triton.paged_attention_triton(
            *case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask, scale=d ** -0.5,
            num_splits=split[0], min_split_tokens=split[1], merge_in_kernel=merge_in_kernel, workspace=workspace, **kw)
    return case, run


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_in_kernel_merge_matches_the_oracle_and_the_merge_launch(name, device, poisoned_empty):
    case, run = _call(name, device)
    dtype = case.args()[0].dtype
    fused, launched = run(True), run(False)
    torch.testing.assert_close(fused.cpu().double(), sdpa_oracle(case), atol=TOL[dtype], rtol=TOL[dtype])
    # the same fp32 partials, merged in the same split order: equal up to the normaliser's summation order
    torch.testing.assert_close(fused, launched, atol=1e-6 if dtype == torch.float32 else TOL[dtype] / 4, rtol=1e-5)


def test_shared_workspace_stays_zero_and_needs_no_fill(device, poisoned_empty):
    calls = [_call(name, device) for name in SPLIT_CASES]
    expected = [run(True) for _, run in calls]  # each with its own zero-filled tickets
    ws = KernelWorkspace()
    for _ in range(2):
        for (case, run), want in zip(calls, expected):
            assert torch.equal(run(True, ws), want)
            assert ws.all_zero()
    assert len(ws._counters) >= 2  # the table's groups (rows x KV heads x tiles) took their own buffers


# one short is a race on a GPU: the early merge reads the last split's partials, which that split has
# usually written by then (the outputs came out equal on an H200); the interpreter runs the programs
# in order, so there the merge always comes before the last split's partials
@pytest.mark.parametrize("stale", ["at_count", pytest.param("one_short", marks=pytest.mark.cpu_only)])
def test_stale_tickets_break_the_output(stale, device, poisoned_empty):
    """Control: tickets at their group's count (a kernel that never put them back): no split is
    last and nothing is merged (the NaN output stays); one short of it: a split merges before the
    last one wrote its partials. Either way the comparison above fails."""
    case, run = _call("split_tree_bf16_empty_splits", device)
    want = run(True)
    ws = KernelWorkspace()
    run(True, ws)
    tickets = next(iter(ws._counters.values()))
    splits = SPLIT_CASES["split_tree_bf16_empty_splits"][-1][0]
    tickets.fill_(splits if stale == "at_count" else 1)
    got = run(True, ws)
    assert not torch.equal(got, want)
    assert not torch.allclose(got.float(), want.float(), atol=0.1, equal_nan=False)


def test_one_launch_per_split_call(device):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from launch_count import LaunchCounter

    _, run = _call("split_boundary_fp32", device)
    ws = KernelWorkspace()
    run(True, ws)  # allocates the tickets (their one fill)
    with LaunchCounter(run_triton=True) as fused:
        run(True, ws)
    with LaunchCounter(run_triton=True) as launched:
        run(False)
    assert fused.triton_launches == 1 and "triton:_merge_splits" not in fused.by_name, fused.by_name
    assert launched.by_name["triton:_merge_splits"] == 1 and launched.triton_launches == 2
    assert fused.by_name.get("aten.zeros", 0) + fused.by_name.get("aten.zero_", 0) + \
        fused.by_name.get("aten.fill_", 0) == 0, fused.by_name


def test_split_policy_with_the_in_kernel_merge(monkeypatch):
    """Both merges take one split policy (choose_splits has no merge argument): on a 132-SM GPU the
    plan's split count is the same in-kernel, short tables split with either; an explicit split
    count keeps the in-kernel merge."""
    monkeypatch.setattr(attention_triton, "_num_sms", lambda device: 132)
    for batch, capacity, splits in ((1, 1024, 4), (8, 1024, 4), (64, 1024, 2), (1, 8192, 32), (8, 8192, 9)):
        plans = [attention_triton.plan_launch(torch.device("cuda"), batch, 8, 4, 128, 1, capacity, merge_in_kernel=m)
                 for m in (False, True)]
        assert [p.num_splits for p in plans] == [splits, splits] and not plans[0].merge_in_kernel
        assert plans[1].merge_in_kernel
    plan = attention_triton.plan_launch(torch.device("cpu"), 1, 8, 4, 128, 1, 4096, num_splits=4,
                                        merge_in_kernel=True)
    assert plan.merge_in_kernel and plan.num_splits == 4
    default = attention_triton.plan_launch(torch.device("cpu"), 1, 8, 4, 128, 1, 4096)
    assert default.merge_in_kernel == attention_triton.MERGE_IN_KERNEL
