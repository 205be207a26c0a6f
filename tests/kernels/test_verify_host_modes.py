"""Sampling modes known on the host (SamplingTensors.modes) and the launches the Triton verify /
sample leave out for them (kernels/verify/_triton_plan.py): the same tokens, bit for bit, as
the reference and as the full launch sequence (modes=None), over a mode table; the modes
themselves, from scalars and tensors, and through dataclasses.replace.

Launch counts per mode: tests/kernels/test_verify_plan.py (verify_plan and the launcher)."""
import dataclasses

import pytest
import torch

from specdec_fast.kernels import SamplingTensors, make_sampling_tensors
from specdec_fast.kernels.sampling_params import MODES
from specdec_fast.kernels.verify import chain_verify_reference, sample_reference

from .test_verify_backends import _modes, _problem


# ---- the modes --------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,expected", [
    (dict(temperature=0.0), {"greedy"}),
    (dict(temperature=0.0, top_k=5, top_p=0.5, min_p=0.1), {"greedy"}),  # greedy rows ignore the rest
    ({}, {"plain"}),
    (dict(temperature=0.7), {"plain"}),
    (dict(top_k=5), {"top_k"}),
    (dict(top_p=0.9, min_p=0.1), {"top_p", "min_p"}),
    (dict(top_k=20, top_p=0.9, min_p=0.02), {"top_k", "top_p", "min_p"}),
])
def test_modes_of_scalars_are_exact(kw, expected):
    assert make_sampling_tensors(3, "cpu", **kw).modes == frozenset(expected)
    assert make_sampling_tensors(3, "cpu", check=False, **kw).modes == frozenset(expected)


def test_modes_of_tensors_exact_when_read_else_every_state_possible():
    t = torch.tensor([0.0, 1.0, 0.5])
    k = torch.tensor([0, 0, 7], dtype=torch.int32)
    # check=True reads the values anyway: the modes of the rows themselves
    assert make_sampling_tensors(3, "cpu", temperature=t).modes == {"greedy", "plain"}
    assert make_sampling_tensors(3, "cpu", temperature=t, top_k=k).modes == {"greedy", "plain", "top_k"}
    assert make_sampling_tensors(3, "cpu", temperature=t[1:2].expand(3), top_k=k).modes == {"plain", "top_k"}
    assert make_sampling_tensors(3, "cpu", temperature=torch.zeros(3), top_k=k).modes == {"greedy"}
    # check=False reads nothing: a tensor may hold any state; scalars stay exact
    assert make_sampling_tensors(3, "cpu", temperature=t, check=False).modes == {"greedy", "plain"}
    assert make_sampling_tensors(3, "cpu", temperature=t, top_k=k, check=False).modes == {"greedy", "plain", "top_k"}
    assert make_sampling_tensors(3, "cpu", top_p=torch.full((3,), 0.9), check=False).modes == {"plain", "top_p"}
    assert make_sampling_tensors(3, "cpu", temperature=0.0, top_p=torch.full((3,), 0.9), check=False).modes == {"greedy"}


def test_modes_survive_replace_of_other_fields_and_never_go_stale():
    params = make_sampling_tensors(2, "cpu", temperature=0.0, seed=3)
    moved = dataclasses.replace(params, offset=torch.tensor([5, 6]))
    assert moved.modes == {"greedy"}
    assert dataclasses.replace(moved, seed=torch.tensor([1, 2])).modes == {"greedy"}
    # a new temperature without new modes: the claim no longer holds, so it is dropped
    assert dataclasses.replace(params, temperature=torch.ones(2)).modes is None
    assert dataclasses.replace(params, temperature=torch.ones(2), modes={"plain"}).modes == {"plain"}
    assert dataclasses.replace(params, modes=None).modes is None
    p = params
    fresh = SamplingTensors(p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.offset)  # built by hand: unknown
    assert fresh.modes is None
    rows = torch.tensor([1, 1, 0])  # a subset of the rows (the tree drafter's per-level params)
    picked = (p.temperature[rows], p.top_k[rows], p.top_p[rows], p.min_p[rows], p.seed[rows], p.offset[rows])
    subset = SamplingTensors(*picked, modes=set(p.modes))  # a claim about these tensors
    assert subset.modes == {"greedy"} and dataclasses.replace(subset, offset=p.offset[rows]).modes == {"greedy"}
    assert SamplingTensors(*picked, modes=p.modes).modes is None  # another object's modes: not a claim about these
    with pytest.raises(ValueError, match="unknown sampling modes"):
        SamplingTensors(p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.offset, modes={"T=2"})
    assert set(MODES) == {"greedy", "plain", "top_k", "top_p", "min_p"}


def test_select_rows_gathers_every_field_and_keeps_the_modes():
    params = make_sampling_tensors(3, "cpu", temperature=torch.tensor([0.0, 0.7, 1.0]), top_k=torch.tensor([0, 5, 0]),
                                   top_p=0.9, seed=11, offset=torch.tensor([4, 5, 6]), check=True)
    rows = torch.tensor([2, 2, 0, 1])
    picked = params.select_rows(rows)
    for name in ("temperature", "top_k", "top_p", "min_p", "seed", "offset"):
        assert torch.equal(getattr(picked, name), getattr(params, name)[rows]), name
    assert picked.modes == params.modes == {"greedy", "top_k", "top_p"}
    assert dataclasses.replace(picked, offset=picked.offset + 1).modes == params.modes
    unknown = dataclasses.replace(params, modes=None)
    assert unknown.select_rows(rows).modes is None


# ---- the same tokens with and without the flags -----------------------------------------------
# (batch, K, vocab, cap, num_chunks): the one-kernel small-vocab path, and the streaming launch
# (+ finish) forced on 600 values by a candidate region of 128, one or three chunks per row.
SMALL, LARGE, LARGE_CHUNKED = (3, 3, 111, None, None), (4, 2, 600, 128, None), (2, 3, 600, 128, 3)
# name -> (the problem's draft sampling mode in test_verify_backends._modes, the params), and the
# cases: the modes whose launches change (greedy, plain, their mix) on every path; modes with a
# truncation keep every launch (the full sequence: once each, cheap shapes).
GREEDY_PLAIN = torch.tensor([0.0, 0.7, 0.0, 1.3])
TOKEN_MODES = {"greedy": ("greedy", dict(temperature=0.0)), "plain": ("temperature", dict(temperature=0.7)),
               "greedy+plain": ("temperature", dict(temperature=GREEDY_PLAIN)), "top_k": ("top_k", dict(top_k=5)),
               "mixed": ("mixed", None)}
TOKEN_CASES = [(mode, shape, draft) for mode in ("greedy", "plain") for shape in (SMALL, LARGE, LARGE_CHUNKED)
               for draft in (True, False)]
TOKEN_CASES += [("greedy+plain", LARGE, True), ("top_k", SMALL, True), ("mixed", SMALL, False)]


def _token_case_id(case) -> str:
    mode, (batch, k, vocab, cap, chunks), draft = case
    return f"{mode}-B{batch}-K{k}-V{vocab}" + (f"-cap{cap}" if cap else "") + (f"-{chunks}chunks" if chunks else "") \
        + ("-draft" if draft else "-nodraft")


@pytest.mark.parametrize("mode,shape,with_draft", TOKEN_CASES, ids=[_token_case_id(c) for c in TOKEN_CASES])
def test_tokens_identical_with_and_without_the_host_modes(mode, shape, with_draft, device):
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    batch, k, vocab, cap, num_chunks = shape
    seed = 17 * batch + vocab + k
    problem_mode, kw = TOKEN_MODES[mode]
    kw = _modes(batch, device)[problem_mode] if kw is None else \
        {name: v[:batch].to(device) if isinstance(v, torch.Tensor) else v for name, v in kw.items()}
    target, draft, drafts, offsets = _problem(batch, k, vocab, torch.float32, with_draft, True, seed, problem_mode,
                                              device)
    params = make_sampling_tensors(batch, device, seed=seed, offset=offsets, **kw)
    unknown = dataclasses.replace(params, modes=None)
    assert params.modes == ({"greedy", "plain"} if mode == "greedy+plain" else params.modes) and unknown.modes is None
    ov = dict(cap=cap, num_chunks=num_chunks)
    expected = chain_verify_reference(target, draft, drafts, params)
    for p in (params, unknown):
        tokens, accepted = chain_verify_triton(target, draft, drafts, p, **ov)
        assert torch.equal(accepted, expected[1]) and torch.equal(tokens, expected[0]), (p.modes, tokens, expected[0])
    positions = torch.arange(batch, dtype=torch.int64, device=device) * 7
    logits = target[:, 1].contiguous()
    drawn = sample_reference(logits, params, positions, 2)
    for p in (params, unknown):
        assert torch.equal(sample_triton(logits, p, positions, 2, **ov), drawn)


def test_greedy_tokens_when_batch_rows_straddle_selection_programs(monkeypatch, device):
    """Small vocabularies hold several distributions per program; with 2 per program a batch row's
    2K+1 distributions span several programs, so the row's tokens are written by whichever
    program takes its last ticket (as on a GPU, where a program holds 32 rows of 128 values).
    Every accepted count from 0 to K occurs."""
    from specdec_fast.kernels.verify import _triton_plan as plans
    from specdec_fast.kernels.verify.triton import chain_verify_triton

    if torch.device(device).type == "cpu":
        monkeypatch.setitem(plans.INTERPRETER, "small_tile", 256)
    batch, k, vocab = 9, 3, 100
    plan = plans.plan_launches(batch, k, vocab, True, num_sms=1, interpreting=torch.device(device).type == "cpu",
                               modes=frozenset({"greedy"}))
    assert plan.greedy_tokens and plan.select_block_r % plan.npos and plan.rows > plan.select_block_r
    g = torch.Generator().manual_seed(4)
    target = torch.randn(batch, k + 1, vocab, generator=g)
    draft = target[:, :k] + 0.3 * torch.randn(batch, k, vocab, generator=g)
    drafts = draft.argmax(-1)
    for row in range(batch):  # row r: the first r % (k + 1) drafts are the target's argmax, then a miss
        drafts[row] = target[row, :k].argmax(-1)
        miss = row % (k + 1)
        if miss < k:
            drafts[row, miss] = (drafts[row, miss] + 1) % vocab
    target, draft, drafts = target.to(device), draft.to(device), drafts.to(device)
    params = make_sampling_tensors(batch, device, temperature=0.0)
    for with_draft in (None, draft):
        expected = chain_verify_reference(target, with_draft, drafts, params)
        got = chain_verify_triton(target, with_draft, drafts, params)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    no_draft_accepted = chain_verify_reference(target, None, drafts, params)[1]
    assert set(no_draft_accepted.tolist()) == set(range(k + 1))


@pytest.mark.parametrize("mode,finishes", [("greedy", False), ("plain", False), ("top_k", True)])
def test_tree_verify_leaves_out_the_finish_for_its_modes(mode, finishes, monkeypatch, device):
    """tree_verify's Triton statistics (select_stats, no emission of its own) skip the finishing
    launch when no row truncates; tokens and paths equal the reference and the full sequence."""
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton
    from specdec_fast.kernels.verify import triton as launcher

    from .test_tree_verify_backends import tree_problem

    finish = launcher.select_finish_kernel
    launched = []

    class Counting:
        def __getitem__(self, grid):
            launched.append(grid)
            return finish[grid]

    monkeypatch.setattr(launcher, "select_finish_kernel", Counting())
    kw = TOKEN_MODES[mode][1]
    batch, n, vocab = 2, 4, 5000  # V > CAP: the streaming launch (+ finish)
    target, draft, tokens, parents, offsets = tree_problem(batch, n, vocab, torch.float32, True, False, 5, kw)
    params = make_sampling_tensors(batch, device, seed=5, offset=offsets.to(device), **kw)
    args = (target.to(device), draft.to(device), tokens.to(device), parents.to(device))
    got = tree_verify_triton(*args, params)
    assert len(launched) == (1 if finishes else 0)
    if not finishes:  # the full sequence (modes unknown) gives the same bits
        expected = tree_verify_triton(*args, dataclasses.replace(params, modes=None))
        assert len(launched) == 1 and all(torch.equal(a, b) for a, b in zip(got, expected))
    from specdec_fast.kernels.tree_verify import tree_verify

    reference = tree_verify(target, draft, tokens, parents, backend="torch", seed=5, offset=offsets, **kw)
    assert torch.equal(got[0].cpu(), reference.tokens) and torch.equal(got[1].cpu(), reference.path)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("mode", ["greedy", "plain", "greedy+plain"])
def test_gpu_llama3_vocab_host_modes_launch_less_and_replay_in_a_graph(batch, mode):
    """V = 128256, K = 4, bf16 on a GPU: with the host modes the verify and the draft sample
    launch what verify_plan says (fewer Triton kernels than with modes unknown), give the
    reference's tokens and the full sequence's, and a CUDA graph of both calls replays on new
    inputs like eager calls (the greedy row tickets are zeroed inside the graph)."""
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton, verify_plan
    from specdec_fast.engine.triton_launches import TritonLaunches

    k, vocab = 4, 128256
    temperature = {"greedy": 0.0, "plain": 0.8, "greedy+plain": torch.tensor([0.0, 0.8] * (batch // 2) + [0.0] * (batch % 2),
                                                                           device="cuda")}[mode]
    params = make_sampling_tensors(batch, "cuda", temperature=temperature, seed=3)
    unknown = dataclasses.replace(params, modes=None)
    positions = torch.arange(batch, device="cuda", dtype=torch.int64)

    def inputs(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        target = (torch.randn(batch, k + 1, vocab, device="cuda", generator=g) * 3).to(torch.bfloat16)
        draft = (target[:, :k].float() + torch.randn(batch, k, vocab, device="cuda", generator=g)).to(torch.bfloat16)
        drafts = draft.float().argmax(-1)  # the greedy drafter's tokens: some accepted, some not
        return target, draft, drafts

    target, draft, drafts = inputs(0)
    calls = lambda p: (chain_verify_triton(target, draft, drafts, p), sample_triton(target[:, 0], p, positions, 2))  # noqa: E731
    calls(params), calls(unknown)  # compile
    launched = {}
    for name, p in (("known", params), ("unknown", unknown)):
        with TritonLaunches() as rec:
            out = calls(p)
        launched[name] = len(rec.launches)
        if name == "known":
            eager = out
        else:
            assert all(torch.equal(a, b) for a, b in zip(eager[0], out[0])) and torch.equal(eager[1], out[1])
    modes = tuple(params.modes)
    plan_launches = verify_plan(batch, k, vocab, True, modes)["launches"] + verify_plan(batch, 0, vocab, False, modes)["launches"]
    assert launched["known"] == plan_launches - 2  # the zero fills are torch ops, not Triton launches
    assert launched["unknown"] == verify_plan(batch, k, vocab, True, None)["launches"] + \
        verify_plan(batch, 0, vocab, False, None)["launches"] - 2 > launched["known"]
    expected = chain_verify_reference(target, draft, drafts, params)
    assert torch.equal(eager[0][0], expected[0]) and torch.equal(eager[0][1], expected[1])
    assert torch.equal(eager[1], sample_reference(target[:, 0], params, positions, 2))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls(params)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = calls(params)
    for replay_seed in (1, 2):  # twice: the tickets start from zero at every replay
        for static, new in zip((target, draft, drafts), inputs(replay_seed)):
            static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        again = calls(params)
        assert torch.equal(captured[0][0], again[0][0]) and torch.equal(captured[0][1], again[0][1])
        assert torch.equal(captured[1], again[1])
