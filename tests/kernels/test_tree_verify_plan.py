"""tree_verify's Triton launch plan (kernels/tree_verify/_triton_plan.py): the graph nodes of a
call by the sampling modes known on the host, stated without a GPU, and the launches the
launcher really makes (recorded through the interpreter) equal to the plan, tokens unchanged."""
import dataclasses

import pytest
import torch

from specdec_fast.engine.triton_launches import TritonLaunches
from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.tree_verify import tree_verify
from specdec_fast.kernels.tree_verify._triton_plan import (WALK_PARALLEL, tree_kernel_sequence, tree_plan,
                                                           tree_verify_plan)
from specdec_fast.kernels.tree_verify.triton import tree_verify_triton
from specdec_fast.kernels._workspace import KernelWorkspace

from .test_tree_verify_backends import tree_problem

V_LLAMA3 = 128256

# B = 1, N = 64 nodes with at most 4 children, V = 128256, the engine's calls (a workspace: no
# fills). Greedy: the statistics and the walk (which writes the final node's argmax); sampled
# children add the list of nodes with siblings, a residual-mass launch per sibling after the first
# and the emission; truncation adds the finishing launch; deterministic (top-b) children need no
# residual masses; truncation also places each row's rungs once (its streaming programs share them).
WALK = "walk_parallel" if WALK_PARALLEL else "walk"  # the GPU plan's walk (_triton_plan.WALK_PARALLEL)
SAMPLED_TAIL = ["residual_rows"] + ["residual_mass"] * 3 + [WALK, "emit"]
LAUNCHES = [  # (modes, has_draft, kernels)
    pytest.param(("greedy",), True, ["select_stream", WALK], id="greedy-sampled"),
    pytest.param(("greedy",), False, ["select_stream", WALK], id="greedy-top"),
    pytest.param(("plain",), True, ["select_stream"] + SAMPLED_TAIL, id="plain-sampled"),
    pytest.param(("plain",), False, ["select_stream", WALK, "emit"], id="plain-top"),
    pytest.param(("greedy", "plain"), True, ["select_stream"] + SAMPLED_TAIL, id="mixed-sampled"),
    pytest.param(("top_k",), True, ["select_rungs", "select_stream", "select_finish"] + SAMPLED_TAIL, id="top_k-sampled"),
    pytest.param(None, True, ["select_rungs", "select_stream", "select_finish"] + SAMPLED_TAIL, id="unknown-sampled"),
]


@pytest.mark.parametrize("modes,has_draft,kernels", LAUNCHES)
def test_launches_by_host_modes(modes, has_draft, kernels):
    plan = tree_verify_plan(1, 64, V_LLAMA3, has_draft, modes, max_children=4, workspace=True)
    assert plan["kernels"] == kernels and plan["launches"] == len(kernels)
    assert (plan["grids"]["emit"] is None) == ("emit" not in kernels)
    assert (plan["grids"]["residual_mass"] is None) == ("residual_mass" not in kernels)
    without = tree_verify_plan(1, 64, V_LLAMA3, has_draft, modes, max_children=4, workspace=False)
    assert without["kernels"] == ["zero fill: counters", "zero fill: dummy drafts"] + kernels


def test_unbounded_children_cost_a_launch_per_possible_sibling():
    """Without max_children every node may have N - 1 children: N - 2 residual launches when some
    row samples, none when every row is greedy."""
    assert tree_verify_plan(1, 64, V_LLAMA3, True, ("plain",), workspace=True)["residual_launches"] == 62
    assert tree_verify_plan(1, 64, V_LLAMA3, True, ("greedy",), workspace=True)["launches"] == 2


def test_the_fused_residual_plan_is_one_launch_of_resident_programs():
    """residual_fused (_triton_plan.RESIDUAL_FUSED): residual_rows and the per-k launches become one
    launch, of at most FUSED_PROGRAMS_PER_SM programs per SM (all resident at once: its barrier
    waits for every one), one under the interpreter; its tickets gain the three sync words."""
    from specdec_fast.kernels.tree_verify._triton_plan import FUSED_PROGRAMS_PER_SM, NUM_WARPS

    fused = tree_verify_plan(1, 64, V_LLAMA3, True, ("plain",), max_children=4, workspace=True, residual_fused=True)
    assert fused["kernels"] == ["select_stream", "residual_masses_fused", WALK, "emit"]
    assert fused["grids"]["residual_masses_fused"] == (FUSED_PROGRAMS_PER_SM * 132,)
    assert fused["grids"]["residual_rows"] is None and fused["grids"]["residual_mass"] is None
    assert FUSED_PROGRAMS_PER_SM * NUM_WARPS * 32 * 255 <= 65536, "resident whatever the kernel's registers"
    greedy = tree_verify_plan(1, 64, V_LLAMA3, True, ("greedy",), max_children=4, workspace=True, residual_fused=True)
    assert greedy["kernels"] == ["select_stream", WALK]  # no sampled children: no residual launch
    for batch, num_chunks, interpreting, programs in ((8, None, False, FUSED_PROGRAMS_PER_SM * 132),
                                                      (8, 100, False, FUSED_PROGRAMS_PER_SM * 132),  # capped
                                                      (2, 3, False, 6), (8, None, True, 1), (2, 3, True, 1)):
        plan = tree_plan(batch, 16, 5000, True, modes=frozenset({"plain"}), max_children=None, num_sms=132,
                         interpreting=interpreting, num_chunks=num_chunks, residual_fused=True)
        assert plan.residual_fused and plan.residual.programs == programs, (batch, num_chunks, interpreting)
        assert plan.residual_tickets == plan.residual.tiles(batch, 16) + 3
        unfused = dataclasses.replace(plan, residual=dataclasses.replace(plan.residual, fused=False))
        assert unfused.residual_tickets == plan.residual_tickets - 3


def _kernel_names(launches) -> list[str]:
    return [launch.kernel.rsplit(".", 1)[1].removesuffix("_kernel") for launch in launches]


CASES = [  # (sampling kwargs, draft logits, vocab)
    pytest.param(dict(temperature=0.0), True, 5000, id="greedy-sampled"),
    pytest.param(dict(temperature=0.0), False, 600, id="greedy-top"),
    pytest.param(dict(temperature=0.9), True, 5000, id="plain-sampled"),
    pytest.param(dict(temperature=0.9), False, 5000, id="plain-top"),
    pytest.param(dict(temperature=0.8, top_k=30), True, 5000, id="top_k-sampled"),
    pytest.param(dict(temperature=torch.tensor([0.0, 0.7, 0.0])), True, 600, id="mixed-sampled"),  # modes read
]


@pytest.mark.parametrize("kw,with_draft,vocab", CASES)
def test_the_launcher_launches_the_plan_and_gives_the_reference_tokens(kw, with_draft, vocab, device):
    """Recorded Triton launches (the interpreter, or a GPU) = tree_kernel_sequence of the plan the
    launcher sizes them from; tokens, path and acceptances equal the torch reference, and equal
    the every-launch sequence (modes unknown) bit for bit, with and without a workspace."""
    batch, n, max_children = 3, 9, 3
    if isinstance(kw.get("temperature"), torch.Tensor):
        kw = dict(kw, temperature=kw["temperature"].to(device))
    target, draft, tokens, parents, offsets = tree_problem(batch, n, vocab, torch.float32, with_draft, False, 7,
                                                           {k: (v.cpu() if isinstance(v, torch.Tensor) else v)
                                                            for k, v in kw.items()})
    params = make_sampling_tensors(batch, device, seed=7, offset=offsets.to(device), **kw)
    args = (target.to(device), None if draft is None else draft.to(device), tokens.to(device), parents.to(device))
    ws = KernelWorkspace()
    with TritonLaunches() as rec:
        got = tree_verify_triton(*args, params, max_children=max_children, workspace=ws)
    plan = tree_plan(batch, n, vocab, with_draft, modes=params.modes, max_children=max_children,
                     num_sms=torch.cuda.get_device_properties(device).multi_processor_count if device == "cuda" else 1,
                     interpreting=device != "cuda")
    assert _kernel_names(rec.launches) == tree_kernel_sequence(plan, workspace=True)
    assert ws.all_zero()

    reference = tree_verify(*[a.cpu() if a is not None else None for a in args], backend="torch", seed=7,
                            offset=offsets, **{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    assert torch.equal(got[0].cpu(), reference.tokens) and torch.equal(got[1].cpu(), reference.path)
    assert torch.equal(got[2].cpu(), reference.num_accepted)
    every_launch = tree_verify_triton(*args, dataclasses.replace(params, modes=None), max_children=max_children)
    assert all(torch.equal(a, b) for a, b in zip(got, every_launch))


def test_stats_chunks_split_only_the_statistics_and_keep_the_tokens(device):
    """stats_chunks (bench_tree.py's sweep of the statistics pass's waves): the statistics' grid takes
    that many vocab chunks a row, the residual and emission grids stay the default's, and the
    tokens, path and acceptances are the default call's bit for bit (the launches' block forced small
    so that the interpreter also splits each row)."""
    default = tree_plan(1, 64, V_LLAMA3, True, modes=frozenset({"plain"}), max_children=6, num_sms=132,
                        interpreting=False)
    for chunks in (4, 8):
        plan = tree_plan(1, 64, V_LLAMA3, True, modes=frozenset({"plain"}), max_children=6, num_sms=132,
                         interpreting=False, stats_chunks=chunks)
        assert plan.stats.select_grid == (127, chunks) != default.stats.select_grid
        assert plan.residual == default.residual and plan.emit == default.emit
    batch, n, vocab = 2, 9, 5000
    target, draft, tokens, parents, offsets = tree_problem(batch, n, vocab, torch.float32, True, False, 8,
                                                           dict(temperature=0.9))
    params = make_sampling_tensors(batch, device, seed=8, offset=offsets.to(device), temperature=0.9)
    args = [t.to(device) for t in (target, draft, tokens, parents)]
    expected = tree_verify_triton(*args, params, max_children=3, block_v=512)
    for chunks in (1, 3):
        split = tree_plan(batch, n, vocab, True, modes=params.modes, max_children=3, num_sms=132,
                          interpreting=device != "cuda", block_v=512, stats_chunks=chunks)
        assert split.stats.select_grid == (batch * (2 * n - 1), chunks)
        got = tree_verify_triton(*args, params, max_children=3, block_v=512, stats_chunks=chunks)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), chunks
