"""tree_verify's residual masses on the nodes with siblings only (kernels/tree_verify/_triton_residual.py):
the list of those nodes per row, and the masses over programs shared among them, in every regime
of the launch's split (more programs than nodes: a node's vocabulary over many programs; fewer:
programs looping over nodes), with greedy rows (no nodes) among sampled ones; and the same in one
launch with a grid barrier between the steps (residual_fused)."""
import pytest
import torch
import triton

from specdec_fast.kernels import make_sampling_tensors, standardise
from specdec_fast.kernels.tree_verify import tree_verify
from specdec_fast.engine.triton_launches import TritonLaunches
from specdec_fast.kernels.tree_verify._triton_plan import tree_kernel_sequence, tree_plan

from .tree_cases import random_parents

triton_kernels = pytest.importorskip("specdec_fast.kernels.tree_verify._triton_residual")


def _children(parents: torch.Tensor) -> torch.Tensor:
    """int64 [B, N]: m[b, n] = #{i > n : parents[b, i] = n}."""
    batch, n = parents.shape
    later = torch.arange(n)[None, :] > torch.arange(n)[:, None]  # [n, i]
    return ((parents[:, None, :] == torch.arange(n)[None, :, None]) & later[None]).sum(-1)


def test_rows_kernel_lists_each_rows_nodes_by_their_children(device):
    """order [B, N]: each row's nodes, most children first, ties by index; count [KMAX, B]: how
    many have more than k children, 0 for greedy rows (no residual is read there)."""
    gen = torch.Generator().manual_seed(3)
    batch, n, kmax = 9, 13, 7
    parents = random_parents(gen, batch, n, absent=0.2)
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.0, 0.0, 1.3, 1.0, 1.0, 0.5])
    order = torch.full((batch, n), -1, dtype=torch.int32, device=device)
    count = torch.full((kmax, batch), -1, dtype=torch.int32, device=device)
    triton_kernels.residual_rows_kernel[(batch,)](
        parents.to(device), temperature.to(device), order, count, batch, kmax, parents.stride(0),
        N=n, BLOCK_N=triton.next_power_of_2(n), BLOCK_K=triton.next_power_of_2(kmax))
    m = _children(parents)
    for b in range(batch):
        expected = sorted(range(n), key=lambda i: (-int(m[b, i]), i))
        assert order[b].tolist() == expected, b
        for k in range(kmax):
            assert int(count[k, b]) == (int((m[b] > k).sum()) if temperature[b] > 0 else 0), (b, k)
    assert int(m.max()) >= 3, "the trees should have nodes with several children (else the test proves little)"


# (batch, n, vocab, num_chunks): num_chunks * batch programs (tree_plan); None: the default
# (INTERPRETER_PROGRAMS under the interpreter, 4 per SM on a GPU)
SPLITS = [
    pytest.param(6, 12, 700, 8, id="programs-over-nodes"),  # more programs than nodes: chunks per node
    pytest.param(6, 12, 700, 1, id="nodes-over-programs"),  # fewer: programs loop over nodes
    pytest.param(5, 16, 1000, None, id="default"),
    pytest.param(1, 24, 3000, 16, id="one-row-many-chunks"),
]


def _bushy_problem(batch: int, n: int, vocab: int, seed: int, temperature: torch.Tensor):
    """Trees whose nodes hang under the first three (several siblings each; the last row ragged),
    each child's token drawn from its parent's draft distribution except the first two children's
    (tokens the draft overrates: rejected, so that later siblings are tested). Also returns
    each node's ordinal among its siblings [B, N]."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, n, vocab, generator=g) * 2
    draft = target + torch.randn(batch, n, vocab, generator=g) * 0.7
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    for i in range(1, n):
        parents[:, i] = (torch.rand(batch, generator=g) * min(i, 3)).long()
    parents[-1, 3::3] = -1  # absent (no node hangs under them: parents are 0, 1 or 2)
    probs = torch.softmax(draft / temperature.clamp(min=1e-3)[:, None, None], -1)
    tokens = torch.zeros(batch, n, dtype=torch.int64)
    for i in range(1, n):
        tokens[:, i] = torch.multinomial(probs[torch.arange(batch), parents[:, i].clamp(min=0)], 1, generator=g)[:, 0]
    # a node's first two children: the tokens its draft most overrates (p / q largest: rejected
    # nearly always), so that its third child is tested against W_2 (lam_2 = 1 + W_1)
    ordinal = torch.stack([(parents[:, 1:i] == parents[:, i:i + 1]).sum(1) for i in range(n)], 1)
    overrated = (draft - target).topk(2, dim=-1).indices  # [B, N, 2]
    at_parent = overrated[torch.arange(batch)[:, None], parents.clamp(min=0)]  # [B, N, 2]
    first_two = at_parent.gather(-1, ordinal.clamp(max=1)[..., None])[..., 0]
    tokens = torch.where(ordinal < 2, first_two, tokens)
    return target, draft, tokens, parents, ordinal


@pytest.mark.parametrize("batch,n,vocab,num_chunks", SPLITS)
def test_masses_over_shared_programs_give_the_reference_tokens(batch, n, vocab, num_chunks, device):
    """Bushy trees with sampled children, one greedy row among sampled ones where there are
    several rows: the tokens and paths of the torch reference, with later siblings accepted (their
    tests read W_1, W_2, ...)."""
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton

    seed = 40 + n
    temperature = torch.ones(batch)
    if batch > 1:
        temperature[1] = 0.0
    kw = dict(temperature=temperature)
    target, draft, tokens, parents, ordinal = _bushy_problem(batch, n, vocab, seed, temperature)
    offsets = torch.arange(batch) * 1000
    expected = tree_verify(target, draft, tokens, parents, backend="torch", seed=seed, offset=offsets, **kw)
    params = make_sampling_tensors(batch, device, seed=seed, offset=offsets.to(device),
                                   temperature=temperature.to(device))
    got = tree_verify_triton(target.to(device), draft.to(device), tokens.to(device), parents.to(device), params,
                             num_chunks=num_chunks)
    assert torch.equal(got[0].cpu(), expected.tokens) and torch.equal(got[1].cpu(), expected.path)
    plan = tree_plan(batch, n, vocab, True, modes=params.modes, max_children=None, num_sms=132,
                     interpreting=device == "cpu", num_chunks=num_chunks)
    assert plan.residual_launches == n - 2
    # a node's third or later child on the path: its test read W_2 (lam_2 = 1 + W_1)
    third = sum(int(ordinal[b, node] >= 2) for b in range(batch) for node in expected.path[b].tolist() if node > 0)
    assert third >= 1, "a third or later sibling should be accepted somewhere (else the test proves little)"


@pytest.mark.parametrize("batch,n,vocab,num_chunks", SPLITS)
@pytest.mark.parametrize("mode", ["T=1", "truncated"])
def test_masses_equal_a_torch_sum(batch, n, vocab, num_chunks, mode, device):
    """W_k of every node with more than k children of every sampled row, from the launches
    themselves (triton._residual_masses), against lam_1 = 1, W_k = sum_v max(q - lam_k p, 0),
    lam_{k+1} = lam_k + W_k over the standardised distributions in float64."""
    from specdec_fast.kernels.tree_verify import triton as launcher

    seed = 70 + n
    temperature = torch.full((batch,), 0.8)
    if batch > 1:
        temperature[1] = 0.0
    kw = dict(temperature=temperature) if mode == "T=1" else dict(temperature=temperature, top_k=vocab // 3,
                                                                    top_p=0.9, min_p=0.01)
    target, draft, _, parents, _ = _bushy_problem(batch, n, vocab, seed, temperature)
    params = make_sampling_tensors(batch, device, **{name: v.to(device) if torch.is_tensor(v) else v
                                                     for name, v in kw.items()})
    plan = tree_plan(batch, n, vocab, True, modes=params.modes, max_children=None,
                     num_sms=launcher._num_sms(torch.device(device)), interpreting=device == "cpu",
                     num_chunks=num_chunks)
    dev_target, dev_draft, dev_parents = target.to(device), draft.to(device), parents.to(device)
    stats, tickets = launcher._node_stats(dev_target, dev_draft, params, plan)
    tickets = tickets[:plan.residual_tickets]
    mass = launcher._residual_masses(dev_target, dev_draft, dev_parents, params, plan, stats, tickets,
                                     fence=device != "cpu").cpu().view(batch, n, n)
    assert not tickets.any(), "the tickets end at zero (a workspace's next call needs no fill)"

    cpu_params = make_sampling_tensors(batch, "cpu", **kw)
    q = torch.softmax(standardise(target, cpu_params).double(), -1)
    p = torch.softmax(standardise(draft, cpu_params).double(), -1)
    m = _children(parents)
    checked = 0
    for b in range(batch):
        if temperature[b] == 0:
            continue
        for node in range(n - 1):  # the last node has no children
            lam = 1.0
            for k in range(1, int(m[b, node])):
                w = float((q[b, node] - lam * p[b, node]).clamp(min=0).sum())
                assert float(mass[b, node, k]) == pytest.approx(w, rel=1e-4, abs=1e-6), (b, node, k)
                lam += w
                checked += 1
    assert checked >= 3 * batch - 3, checked


@pytest.mark.parametrize("mode", ["T=1", "T=0.8", "min_p"])
def test_identity_skips_leave_the_masses_and_tokens_as_they_are(mode, device):
    """The residual launches' identity skips (tree_verify_triton(skip_identities=True),
    _triton_plan.RESIDUAL_SKIP_IDENTITIES): items of T = 1 nodes skip the division by T, items
    without min-p skip min-p's test. Every mass the walk reads, bit for bit, and the tokens."""
    from specdec_fast.kernels.tree_verify import triton as launcher
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton

    batch, n, vocab = 3, 9, 300
    temperature = torch.full((batch,), 0.8 if mode == "T=0.8" else 1.0)
    kw = dict(temperature=temperature, min_p=0.02) if mode == "min_p" else dict(temperature=temperature)
    target, draft, tokens, parents, _ = _bushy_problem(batch, n, vocab, 90, temperature)
    params = make_sampling_tensors(batch, device, seed=4, **{name: v.to(device) if torch.is_tensor(v) else v
                                                             for name, v in kw.items()})
    dev = [t.to(device) for t in (target, draft, tokens, parents)]
    masses, outputs = {}, {}
    for skip in (False, True):
        plan = tree_plan(batch, n, vocab, True, modes=params.modes, max_children=None,
                         num_sms=launcher._num_sms(torch.device(device)), interpreting=device == "cpu",
                         skip_identities=skip)
        assert plan.skip_identities is skip and plan.residual_launches == n - 2
        stats, tickets = launcher._node_stats(dev[0], dev[1], params, plan)
        masses[skip] = launcher._residual_masses(dev[0], dev[1], dev[3], params, plan, stats,
                                                 tickets[:plan.residual_tickets], fence=device != "cpu").cpu()
        outputs[skip] = tree_verify_triton(*dev, params, skip_identities=skip)
    m = _children(parents)
    read = [(b * n + node, k) for b in range(batch) for node in range(n - 1) for k in range(1, int(m[b, node]))]
    assert len(read) >= 3 * batch
    for row, k in read:
        assert torch.equal(masses[True][row, k], masses[False][row, k]), (row, k)
    for a, b in zip(outputs[True], outputs[False]):
        assert torch.equal(a, b)


FUSED_SPLITS = [
    pytest.param(5, 16, 1000, None, id="default"),  # GPU: FUSED_PROGRAMS_PER_SM per SM; the interpreter: one
    pytest.param(1, 24, 3000, 16, id="one-row-16-programs"),
    pytest.param(6, 12, 700, 1, id="nodes-over-programs"),
]


@pytest.mark.parametrize("batch,n,vocab,num_chunks", FUSED_SPLITS)
def test_the_fused_launch_gives_the_masses_and_the_tokens(batch, n, vocab, num_chunks, device):
    """residual_masses_fused_kernel (tree_verify_triton(residual_fused=True)): the rows' order and
    every W_k in one launch, a grid barrier between the steps. W_k of every node the walk reads
    against the float64 torch sum (as test_masses_equal_a_torch_sum), its tickets and sync words
    back at zero with no program given up at a barrier (the failure count is the last word), and
    the tokens and paths of the torch reference and of the per-k launches. Under the interpreter
    the launch is one program (the barriers pass at once): the GPU runs the barrier itself."""
    from specdec_fast.kernels.tree_verify import triton as launcher
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton

    seed = 110 + n
    temperature = torch.full((batch,), 0.9)
    if batch > 1:
        temperature[1] = 0.0
    target, draft, tokens, parents, ordinal = _bushy_problem(batch, n, vocab, seed, temperature)
    offsets = torch.arange(batch) * 1000
    params = make_sampling_tensors(batch, device, seed=seed, offset=offsets.to(device),
                                   temperature=temperature.to(device))
    plan = tree_plan(batch, n, vocab, True, modes=params.modes, max_children=None,
                     num_sms=launcher._num_sms(torch.device(device)), interpreting=device == "cpu",
                     num_chunks=num_chunks, residual_fused=True)
    assert plan.residual_fused and (plan.residual.programs == 1) == (device == "cpu")
    dev = [t.to(device) for t in (target, draft, tokens, parents)]
    stats, tickets = launcher._node_stats(dev[0], dev[1], params, plan)
    tickets = tickets[:plan.residual_tickets]
    mass = launcher._residual_masses(dev[0], dev[1], dev[3], params, plan, stats, tickets,
                                     fence=device != "cpu").cpu().view(batch, n, n)
    assert tickets.tolist() == [0] * plan.residual_tickets, "tickets and sync words at zero, no program gave up"

    q = torch.softmax(standardise(target, make_sampling_tensors(batch, "cpu", temperature=temperature)).double(), -1)
    p = torch.softmax(standardise(draft, make_sampling_tensors(batch, "cpu", temperature=temperature)).double(), -1)
    m = _children(parents)
    checked = 0
    for b in range(batch):
        for node in range(n - 1):
            lam = 1.0
            for k in range(1, int(m[b, node]) if temperature[b] > 0 else 1):
                w = float((q[b, node] - lam * p[b, node]).clamp(min=0).sum())
                assert float(mass[b, node, k]) == pytest.approx(w, rel=1e-4, abs=1e-6), (b, node, k)
                lam += w
                checked += 1
    assert checked >= 3 * (batch - (batch > 1)), checked

    expected = tree_verify(target, draft, tokens, parents, backend="torch", seed=seed, offset=offsets,
                           temperature=temperature)
    with TritonLaunches() as launches:
        got = tree_verify_triton(*dev, params, num_chunks=num_chunks, residual_fused=True)
    names = [launch.kernel.rsplit(".", 1)[1].removesuffix("_kernel") for launch in launches.launches]
    assert names == [name for name in tree_kernel_sequence(plan) if not name.startswith("zero fill")]
    assert names.count("residual_masses_fused") == 1 and "residual_mass" not in names
    per_k = tree_verify_triton(*dev, params, num_chunks=num_chunks, residual_fused=False)
    assert torch.equal(got[0].cpu(), expected.tokens) and torch.equal(got[1].cpu(), expected.path)
    assert all(torch.equal(a, b) for a, b in zip(got, per_k))
    third = sum(int(ordinal[b, node] >= 2) for b in range(batch) for node in expected.path[b].tolist() if node > 0)
    assert third >= 1, "a third or later sibling should be accepted somewhere (else the test proves little)"


@pytest.mark.gpu
def test_the_fused_launch_is_deterministic_under_load(device):
    """The grid barrier on a GPU, where every program runs at once: 96 rows whose three first nodes
    have ~10 children each (288 nodes with siblings at k = 1: more than the 264 programs of an H100 /
    H200, which then loop over nodes; fewer at later k, whose vocabularies are split over
    programs), launched 32 times. The sums
    depend only on the programs and the tiles, so every launch must give the same bits (a read of
    lam or of the rows' order before its writer's barrier would show as a difference), no program
    may give up at a barrier, and the masses equal the per-k launches' within float rounding."""
    from specdec_fast.kernels.tree_verify import triton as launcher

    batch, n, vocab = 96, 33, 8000
    temperature = torch.full((batch,), 1.0)
    target, draft, _, parents, _ = _bushy_problem(batch, n, vocab, 7, temperature)
    params = make_sampling_tensors(batch, device, temperature=temperature.to(device))
    dev = [t.to(device) for t in (target, draft, parents)]
    masses = {}
    for fused in (True, False):
        plan = tree_plan(batch, n, vocab, True, modes=params.modes, max_children=None,
                         num_sms=launcher._num_sms(torch.device(device)), interpreting=device == "cpu",
                         residual_fused=fused)
        stats, tickets = launcher._node_stats(dev[0], dev[1], params, plan)
        tickets = tickets[:plan.residual_tickets]
        runs = [launcher._residual_masses(dev[0], dev[1], dev[2], params, plan, stats, tickets, fence=device != "cpu").clone()
                for _ in range(32 if fused else 1)]
        assert not tickets.any(), (fused, tickets[-3:].tolist())
        masses[fused] = runs
    m = _children(parents)
    read = torch.zeros(batch * n, n, dtype=torch.bool)
    for b in range(batch):
        for node in range(n - 1):
            read[b * n + node, 1:int(m[b, node])] = True
    assert int(read.sum()) >= 3 * batch
    first = masses[True][0].cpu()[read]
    for run in masses[True][1:]:
        assert torch.equal(run.cpu()[read], first), "the fused launch gave other bits on another launch"
    torch.testing.assert_close(first, masses[False][0].cpu()[read], rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
def test_the_fused_launch_replays_in_a_cuda_graph(device):
    """The fused launch (cooperative: FUSED_COOPERATIVE) captured in a CUDA graph with a caller's
    KernelWorkspace, as the engine captures tree_verify: replays on new inputs give the tokens and
    paths of eager calls and of the torch reference, three times (the barrier counter, the exit
    ticket and the tiles' tickets start every replay at zero), and the workspace's counters are
    zero after them (no program gave up at a barrier)."""
    from specdec_fast.kernels._workspace import KernelWorkspace
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton

    batch, n, vocab = 8, 33, 32000
    temperature = torch.full((batch,), 0.9)
    temperature[1] = 0.0
    params = make_sampling_tensors(batch, device, seed=11, temperature=temperature.to(device))
    problems = [_bushy_problem(batch, n, vocab, seed, temperature) for seed in (21, 22, 23, 24)]
    static = [t.to(device) for t in (problems[0][0], problems[0][1], problems[0][2], problems[0][3])]
    workspace = KernelWorkspace()
    call = lambda: tree_verify_triton(*static, params, workspace=workspace, residual_fused=True)  # noqa: E731
    call()  # compile and allocate the workspace before capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    for target, draft, tokens, parents, _ in problems[1:]:
        for buffer, new in zip(static, (target, draft, tokens, parents)):
            buffer.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        replayed = [t.clone() for t in captured]
        eager = tree_verify_triton(*static, params, residual_fused=True)
        assert all(torch.equal(a, b) for a, b in zip(replayed, eager))
        expected = tree_verify(target, draft, tokens, parents, backend="torch", seed=11, temperature=temperature)
        assert torch.equal(replayed[0].cpu(), expected.tokens) and torch.equal(replayed[1].cpu(), expected.path)
    assert all(not buf.any() for buf in workspace._counters.values()), "counters left nonzero after the replays"
