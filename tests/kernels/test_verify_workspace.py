"""A caller's KernelWorkspace (kernels/_workspace.py): the Triton verify and sample
launches leave its counters at zero, so calls need no zero fill. Over the launch table of
penalty_off_launches (small and streaming vocabularies; greedy, plain sampling, top-k + top-p +
min-p with the finishing launch), with and without penalties, every call on ONE shared workspace
-- each twice, shapes and modes interleaved -- gives the tokens of a call without one, and the
counters are zero after every call. Controls: counters left as a kernel that did not reset them
would leave them (every ticket at its count) break the next call, which the token check sees;
the zero fill is gone from the launches (verify_plan, the launch counter)."""
import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.penalties import make_penalty_tensors

from .penalty_off_launches import CALLS, _inputs

triton_verify = pytest.importorskip("specdec_fast.kernels.verify.triton")
KernelWorkspace = triton_verify.KernelWorkspace


def _calls(device, penalised: bool):
    """[(name, run(workspace) -> tokens tuple)] over the table: chain_verify and sample per row."""
    out = []
    for name, batch, k, vocab, with_draft, kw, overrides in CALLS:
        target, draft, drafts = (None if t is None else t.to(device) for t in _inputs(batch, k, vocab, with_draft, vocab))
        params = make_sampling_tensors(batch, device, seed=3, **kw)
        positions = torch.arange(batch, dtype=torch.int64, device=device)
        pen = ()
        if penalised:
            history = torch.randint(0, vocab, (batch, 4), generator=torch.Generator().manual_seed(batch)).to(device)
            pen = (make_penalty_tensors(history, vocab, repetition_penalty=1.3, presence_penalty=0.4),)

        def verify(ws, target=target, draft=draft, drafts=drafts, params=params, pen=pen, overrides=overrides):
            return triton_verify.chain_verify_triton(target, draft, drafts, params, *pen, workspace=ws, **overrides)

        def sample(ws, target=target, params=params, positions=positions, pen=pen, overrides=overrides):
            return (triton_verify.sample_triton(target[:, 0].contiguous(), params, positions, 2, *pen, workspace=ws,
                                                **overrides),)
        out += [(f"{name}/verify", verify), (f"{name}/sample", sample)]
    return out


@pytest.mark.parametrize("penalised", [False, True], ids=["plain", "penalised"])
def test_shared_workspace_gives_the_same_tokens_and_stays_zero(penalised, device):
    calls = _calls(device, penalised)
    expected = {name: run(None) for name, run in calls}
    ws = KernelWorkspace()
    asked, counters = set(), ws.counters
    ws.counters = lambda n, device: asked.add(n) or counters(n, device)  # the sizes the plans ask for
    for _ in range(2):  # every shape and mode twice, interleaved, on one workspace
        for name, run in calls:
            got = run(ws)
            assert all(torch.equal(g, e) for g, e in zip(got, expected[name])), name
            assert ws.all_zero(), f"{name} left a counter nonzero"
    # one buffer per size the plans asked for, shared by the calls of that size; how many sizes
    # depends on the device's plans (6 here through the interpreter, 5 on an H200)
    assert len(ws._counters) == len(asked) > 1


def test_a_counter_left_nonzero_breaks_the_next_call(device, poisoned_empty):
    """Control: the tickets as a launch that never put them back would leave them (each at its
    group's count): no program is last, nothing merges, and the tokens come out wrong -- the
    check above would see a kernel that stopped resetting. poisoned_empty: the outputs nothing
    writes hold -7, not the block of the call before (which held the right tokens on an H200)."""
    name, run = next((n, r) for n, r in _calls(device, False) if n == "large-plain/verify")
    expected = run(None)
    ws = KernelWorkspace()
    assert all(torch.equal(g, e) for g, e in zip(run(ws), expected))
    (buf,) = ws._counters.values()
    rows = 2 * (2 * 2 + 1)  # the large-plain call: B = 2, K = 2 with draft logits
    buf[2 * rows:] = 64  # finishing, streaming and emission tickets: past any group's count
    got = run(ws)
    assert not all(torch.equal(g, e) for g, e in zip(got, expected)), "stale tickets went unnoticed"


def test_workspace_calls_launch_no_zero_fill(device):
    """verify_plan(workspace=True) drops the fill; the workspace call runs no torch op besides the
    output allocations and the kernels of the plan (the launch counter of bench/launch_count.py)."""
    import sys
    from pathlib import Path

    from specdec_fast.kernels.verify._triton_plan import verify_plan

    greedy = verify_plan(1, 4, 128256, True, ("greedy",), workspace=True)
    assert greedy["launches"] == 1 and greedy["kernels"] == ["select_stream"]
    assert verify_plan(1, 4, 128256, True, ("greedy",))["launches"] == 2  # a call without one: fill + stream
    assert verify_plan(1, 4, 128256, True, ("plain",), workspace=True)["kernels"] == ["select_stream", "emit"]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from launch_count import LaunchCounter

    name, run = next((n, r) for n, r in _calls(device, False) if n == "large-greedy/verify")
    ws = KernelWorkspace()
    run(ws)  # the first call of a shape allocates (fills) its buffer
    with LaunchCounter(run_triton=True) as counted:
        run(ws)
    with LaunchCounter(run_triton=True) as fresh:
        run(None)
    assert counted.by_name.get("aten.zeros", 0) + counted.by_name.get("aten.zero_", 0) + \
        counted.by_name.get("aten.fill_", 0) == 0, counted.by_name
    assert counted.total == fresh.total - 1, (counted.by_name, fresh.by_name)


def test_a_call_that_raises_between_launches_discards_the_buffers(device, monkeypatch):
    """The finishing launch failing (say, a compile error) after the streaming launch counted
    candidates: the workspace drops its buffers, and the next call is right and leaves zeros."""
    name, run = next((n, r) for n, r in _calls(device, False) if n == "large-combined/verify")
    expected = run(None)
    ws = KernelWorkspace()
    run(ws)

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("finishing kernel failed")
            return launch

    with monkeypatch.context() as patch:
        patch.setattr(triton_verify, "select_finish_kernel", Broken())
        with pytest.raises(RuntimeError, match="finishing kernel failed"):
            run(ws)
    assert not ws._counters  # discarded
    assert all(torch.equal(g, e) for g, e in zip(run(ws), expected)) and ws.all_zero()


@pytest.mark.parametrize("kw,vocab", [(dict(temperature=0.9, min_p=0.05), 600), (dict(temperature=0.0), 300),
                                      (dict(top_k=20, top_p=0.9), 600)])
def test_tree_verify_with_a_shared_workspace(kw, vocab, device):
    """tree_verify_triton on one workspace (the engine's tree loop, prepared_tree_verify): the
    statistics' counters, the dummy drafts, the residual-mass tickets (several sibling
    launches) and the emission's (its chunks merged by the last program of a row tile) stay zero; tokens, paths and acceptances equal a call without one, shapes interleaved."""
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton

    from .test_tree_verify_backends import tree_problem

    ws = KernelWorkspace()
    problems = []
    for batch, n, seed in ((3, 7, 5), (2, 12, 6)):
        target, draft, tokens, parents, offsets = tree_problem(batch, n, vocab, torch.float32, True, True, seed, kw)
        params = make_sampling_tensors(batch, device, seed=seed, offset=offsets.to(device), **kw)
        args = (target.to(device), draft.to(device), tokens.to(device), parents.to(device), params)
        problems.append((args, tree_verify_triton(*args, block_v=128, num_chunks=3)))
    for _ in range(2):
        for args, expected in problems:
            got = tree_verify_triton(*args, block_v=128, num_chunks=3, workspace=ws)
            assert all(torch.equal(g, e) for g, e in zip(got, expected))
            assert ws.all_zero()
    assert ws._zeros and ws._counters
