"""The rungs launch (kernels/verify/_triton_select_rungs.py): each selecting row's rungs placed once,
before the streaming launch, instead of by every streaming program of the row. The rungs steer
which values are gathered, so the same rungs must give the same everything: the same tokens, the
same accepted counts, and the same threshold routes (``paths``), with the launch and without it,
on small vocabularies with several chunks a row (the interpreter; a GPU where the suite has one).
"""
import pytest
import torch

from specdec_fast.engine.triton_launches import TritonLaunches
from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.penalties import make_penalty_tensors
from specdec_fast.kernels.verify import chain_verify_reference

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# (B, K, V, sampling, candidate cap, vocab block, chunks): top sets, gathered intervals (top-p on
# flat rows), min-p, a greedy row beside sampled ones, rows whose drafts stop early (-1 pads).
CASES = [
    pytest.param(2, 3, 1000, dict(top_k=7), 128, 64, 4, id="top_k"),
    pytest.param(2, 2, 1000, dict(top_p=0.8), 128, 64, 5, id="top_p-flat"),
    pytest.param(3, 2, 777, dict(top_k=20, min_p=0.05, temperature=torch.tensor([0.0, 0.7, 1.3])), 128, 64, 3,
                 id="mixed"),
    pytest.param(2, 2, 600, dict(top_k=300, top_p=0.95), 64, 64, 3, id="deep"),
]


def _problem(batch, k, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g)
    drafts = torch.multinomial(torch.softmax(draft.reshape(-1, vocab), -1), 1, generator=g).reshape(batch, k)
    drafts[-1, k - 1:] = -1  # the last row stops a draft early
    return target, draft, drafts


# Where each launch takes the rungs buffer fp32 [R, 8] (its position among the arguments).
RUNGS_ARG = {"select_rungs_kernel": 7, "select_rungs_penalised_kernel": 7, "select_stream_kernel": 11,
             "select_stream_penalised_kernel": 11}


class _KeepRungs:
    """Stands in for a kernel of kernels/verify/triton.py: fills the rungs buffer with NaN before the
    launch (rows nobody writes stay NaN) and keeps a copy of it after the launch."""

    def __init__(self, kernel, name, kept):
        self.kernel, self.name, self.kept = kernel, name, kept

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            args[RUNGS_ARG[self.name]].fill_(float("nan"))
            self.kernel[grid](*args, **kwargs)
            self.kept[self.name] = args[RUNGS_ARG[self.name]].cpu().clone()
        return launch


def _run(target, draft, drafts, params, rungs_launch, penalties=None, **overrides):
    """(tokens, accepted, paths, launched kernel names, the rungs [R, 8] as the launch that placed
    them left them: NaN in rows that place none)."""
    from specdec_fast.kernels.verify import triton as launcher

    kept = {}
    patch = pytest.MonkeyPatch()
    # the streaming launch places the rungs without the rungs launch; with it, the rungs launch does
    name = "select_rungs" if rungs_launch else "select_stream"
    for suffix in ("_kernel", "_penalised_kernel"):
        patch.setattr(launcher, name + suffix, _KeepRungs(getattr(launcher, name + suffix), name + suffix, kept))
    try:
        with TritonLaunches() as rec:
            tokens, accepted, paths = launcher.chain_verify_triton(target, draft, drafts, params, penalties,
                                                                   rungs_launch=rungs_launch, return_paths=True,
                                                                   **overrides)
    finally:
        patch.undo()
    names = [launch.kernel.rsplit(".", 1)[1] for launch in rec.launches]
    (rungs,) = kept.values()
    return tokens.cpu(), accepted.cpu(), paths.cpu(), names, rungs


@pytest.mark.parametrize("batch,k,vocab,kw,cap,block_v,chunks", CASES)
def test_the_rungs_launch_changes_nothing_but_the_launches(device, batch, k, vocab, kw, cap, block_v, chunks):
    target, draft, drafts = (t.to(device) for t in _problem(batch, k, vocab, seed=vocab + k))
    kw = {name: v.to(device) if isinstance(v, torch.Tensor) else v for name, v in kw.items()}
    params = make_sampling_tensors(batch, device, seed=5, **kw)
    overrides = dict(cap=cap, block_v=block_v, num_chunks=chunks)
    once = _run(target, draft, drafts, params, True, **overrides)
    every = _run(target, draft, drafts, params, False, **overrides)
    assert once[3][0] == "select_rungs_kernel" and "select_rungs_kernel" not in every[3]
    assert once[3][1:] == every[3]
    for a, b in zip(once[:3], every[:3]):
        assert torch.equal(a, b), (a, b)
    # the same rungs, bit for bit, in the rows that place them (and only those)
    assert torch.allclose(once[4], every[4], rtol=0, atol=0, equal_nan=True), (once[4], every[4])
    placed = ~once[4].isnan().all(1)
    assert placed.any() and (placed == ~every[4].isnan().all(1)).all()
    assert (once[2] != 0).any()  # some distribution did settle a threshold (paths record the route)
    if "top_k" in kw and "min_p" not in kw and kw["top_k"] < 100:  # one case: the rungs launch comparing fewer
        # sample values at a time (rungs_sub) places the same rungs (exact counts)
        fine = _run(target, draft, drafts, params, True, rungs_sub=16, **overrides)
        assert torch.allclose(fine[4], once[4], rtol=0, atol=0, equal_nan=True) and torch.equal(fine[0], once[0])
    expected = chain_verify_reference(target, draft, drafts, params)
    assert torch.equal(once[0], expected[0].cpu()) and torch.equal(once[1], expected[1].cpu())


def penalised_problem(device, batch=2, k=3, vocab=1000):
    """(target, draft, drafts, penalties): a strong repetition penalty on the tokens that lead each
    row, so that the penalised top set differs from the raw one."""
    target, draft, drafts = (t.to(device) for t in _problem(batch, k, vocab, seed=11))
    g = torch.Generator().manual_seed(3)
    history = torch.cat([target[:, 0].topk(6).indices.cpu(), torch.randint(0, vocab, (batch, 4), generator=g)], 1)
    return target, draft, drafts, make_penalty_tensors(history.to(device), vocab, repetition_penalty=3.0,
                                                       presence_penalty=1.5)


def test_the_penalised_rungs_launch_changes_nothing_but_the_launches(device):
    """Penalties change the logits the sample reads: the rungs launch must read them penalised too."""
    batch = 2
    target, draft, drafts, pen = penalised_problem(device, batch)
    params = make_sampling_tensors(batch, device, seed=7, top_k=5)
    overrides = dict(cap=128, block_v=64, num_chunks=4)
    once = _run(target, draft, drafts, params, True, pen, **overrides)
    every = _run(target, draft, drafts, params, False, pen, **overrides)
    assert once[3][0] == "select_rungs_penalised_kernel" and once[3][1:] == every[3]
    for a, b in zip(once[:3], every[:3]):
        assert torch.equal(a, b), (a, b)
    assert torch.allclose(once[4], every[4], rtol=0, atol=0, equal_nan=True) and not once[4].isnan().all()
    expected = chain_verify_reference(target, draft, drafts, params, pen)
    assert torch.equal(once[0], expected[0].cpu()) and torch.equal(once[1], expected[1].cpu())
