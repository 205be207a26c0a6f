"""The Triton verify step's launch plan, checked on CPU against the issue-12 budget: launches
in sequence, programs per row, passes over the logits (kernels/verify/_triton_plan.py; the
same code sizes the grids the launcher uses, which the last test checks)."""
import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.verify import _triton_plan as plans
from specdec_fast.kernels.verify._triton_plan import verify_plan

V_LLAMA3 = 128256


@pytest.mark.parametrize("modes", [("top_k",), ("top_p",), ("min_p",), ("top_k", "top_p", "min_p"), ("T=1",), ("plain",),
                                   ("greedy",), None])
def test_batch_one_spreads_each_row_over_many_programs_in_few_launches(modes):
    """B = 1, V = 128256, K = 4 with draft logits: <= 6 dependent launches in every mode, the
    streaming pass over >= 32 programs per distribution, and one pass over the logits plus the
    emitted position (greedy: the argmaxes alone decide the tokens, no emission pass)."""
    plan = verify_plan(1, 4, V_LLAMA3, True, modes)
    assert plan["launches"] <= 6
    assert plan["large_vocab_path"] and plan["programs_per_row"]["select_stream"] >= 32
    if modes == ("greedy",):
        assert "emit" not in plan["programs_per_row"] and plan["passes_over_logits"] == 1.0
    else:
        assert plan["programs_per_row"]["emit"] >= 32
        assert plan["passes_over_logits"] == pytest.approx(1 + 2 / 9)


def test_batch_64_reads_the_logits_once_plus_the_emitted_position():
    """B = 64, T = 1: one pass over all 9 x 128256 logits per row, plus the emitted position's
    target and draft rows (2 of 9); nothing else that scales with V."""
    plan = verify_plan(64, 4, V_LLAMA3, True, ("T=1",))
    assert plan["passes_over_logits"] == pytest.approx(1 + 2 / 9)
    assert plan["sample_reads_per_row_from_l2"] == 0 and plan["finish_reads_per_row"] == 0
    selecting = verify_plan(64, 4, V_LLAMA3, True, ("top_k", "top_p"))
    assert selecting["passes_over_logits"] == plan["passes_over_logits"]
    assert selecting["sample_reads_per_row_from_l2"] < 0.05  # 2 chunks per row read the sample


def test_draft_sampler_and_small_vocabularies():
    sample = verify_plan(1, 0, V_LLAMA3, False, ("top_k", "top_p"))
    assert sample["launches"] <= 6 and sample["programs_per_row"]["select_stream"] >= 32
    small = verify_plan(8, 4, 1000, True, ("top_k",))
    assert not small["large_vocab_path"] and small["launches"] == 3
    assert verify_plan(8, 4, 1000, True, ("greedy",))["launches"] == 2


# Graph nodes per call by the modes known on the host (SamplingTensors.modes; None: unknown).
# Verify: B = 1, K = 4 with draft logits; draft sample: K = 0 (the draft step samples K times).
# Where a row may select (top-k / top-p / min-p), the large-vocabulary path places the rungs in a
# launch of their own when the streaming grid is more than a wave (B = 1 verify: 9 rows x 63
# programs; B = 64: 576 x 2; the draft sampler at B = 64: 64 x 17), not for the draft sampler at
# B = 1 (63 programs: the rungs are placed in parallel).
LAUNCHES = [  # (modes, large-vocab verify, large-vocab draft sample at B = 1 / B = 64, small-vocab verify)
    (None, 5, 4, 5, 3),
    (("greedy",), 2, 2, 2, 2),
    (("plain",), 3, 3, 3, 3),
    (("greedy", "plain"), 3, 3, 3, 3),
    (("top_k",), 5, 4, 5, 3),
    (("top_p",), 5, 4, 5, 3),
    (("min_p",), 5, 4, 5, 3),
    (("greedy", "top_k"), 5, 4, 5, 3),
    (("plain", "top_k", "top_p", "min_p"), 5, 4, 5, 3),
]


@pytest.mark.parametrize("modes,verify,draft_sample_1,draft_sample_64,small", LAUNCHES)
def test_launches_left_out_for_the_host_modes(modes, verify, draft_sample_1, draft_sample_64, small):
    """The finishing launch only when some row may use top-k / top-p / min-p; no emission launch
    when every row is greedy (the selection launch writes the argmax chain); unknown modes and
    mixes with a truncating mode: every launch."""
    for batch, draft_sample in ((1, draft_sample_1), (64, draft_sample_64)):
        assert verify_plan(batch, 4, V_LLAMA3, True, modes)["launches"] == verify
        assert verify_plan(batch, 0, V_LLAMA3, False, modes)["launches"] == draft_sample
        assert verify_plan(batch, 4, 1000, True, modes)["launches"] == small
    plan = verify_plan(1, 4, V_LLAMA3, True, modes)
    assert ("select_finish" in plan["kernels"]) == (plan["grids"]["finish"] is not None)
    assert ("emit" in plan["kernels"]) == (plan["grids"]["emit"] is not None)
    assert ("select_rungs" in plan["kernels"]) == plan["rungs_launch"] == (plan["grids"]["finish"] is not None)


def test_the_rungs_launch_where_a_row_has_several_streaming_programs():
    """The rungs launch comes before the streaming launch, only with the selection code compiled
    in, at least RUNGS_LAUNCH_MIN_CHUNKS programs a row and more than a wave of streaming programs;
    it reads each row's sample once."""
    def plan(batch, k=4, **kw):
        return plans.plan_launches(batch, k, V_LLAMA3, k > 0, num_sms=132, interpreting=False,
                                   modes=frozenset({"top_k"}), **kw)

    assert plan(1).rungs_launch and plan(1).select_chunks == 63  # 567 programs
    assert not plan(200).rungs_launch and plan(200).select_chunks == 1  # one program a row: nothing to share
    assert not plan(1, k=0).rungs_launch and plan(1, k=0).select_chunks == 63  # one wave: placed in parallel
    assert plan(8, k=0).rungs_launch  # 8 rows x 63 programs
    assert not plan(1, rungs_launch=False).rungs_launch and plan(200, rungs_launch=True).rungs_launch
    assert not plans.plan_launches(1, 4, V_LLAMA3, True, num_sms=132, interpreting=False, modes=frozenset({"plain"}),
                                   rungs_launch=True).rungs_launch  # no selection code: no rungs
    kernels = plans.kernel_sequence(plan(1))
    assert kernels.index("select_rungs") + 1 == kernels.index("select_stream")
    once, every = verify_plan(1, 4, V_LLAMA3, True, ("top_k",)), verify_plan(200, 4, V_LLAMA3, True, ("top_k",))
    assert once["sample_reads_per_row_from_l2"] == pytest.approx(2 * 1024 / V_LLAMA3)
    assert every["sample_reads_per_row_from_l2"] == pytest.approx(2 * 1024 / V_LLAMA3)  # one chunk: read once too
    assert once["programs_per_row"]["select_rungs"] == 1 and "select_rungs" not in every["programs_per_row"]


def test_the_emission_block_by_batch():
    """A batch of one row emits in blocks of EMIT_ONE_ROW_BLOCK_V (256: 501 programs at V = 128256,
    faster on an H200), every other batch in EMIT_MAX_BLOCK_V (1024: B = 8 and 64 were slower with
    256); an override wins; the interpreter keeps its whole-row tiles. The defaults of 2026-11-28:
    the fused finishing search (1024) and the emission's identity skips are on."""
    def plan(batch, k=4, interpreting=False, **kw):
        return plans.plan_launches(batch, k, V_LLAMA3, k > 0, num_sms=132, interpreting=interpreting,
                                   modes=frozenset({"plain"}), **kw)

    assert plan(1).emit_block_v == 256 and plan(1).emit_grid == (1, 501)
    assert plan(1, k=0).emit_block_v == 256  # the draft sampler at B = 1 too
    assert plan(2).emit_block_v == plan(8).emit_block_v == plan(64).emit_block_v == 1024
    assert plan(1, emit_block_v=1024).emit_grid == (1, 126) and plan(1, block_v=512).emit_block_v == 512
    assert plan(1, interpreting=True).emit_block_v == plan(2, interpreting=True).emit_block_v
    assert plan(1).finish_search_tile == 1024 and plan(1).emit_skip_identities
    assert plan(1, finish_search_tile=0).finish_search_tile == 0
    assert not plan(1, emit_skip_identities=False).emit_skip_identities


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="unknown modes"):
        verify_plan(1, 4, 1000, True, ("top_q",))
    assert verify_plan(1, 4, 1000, True, "T=1") == verify_plan(1, 4, 1000, True, ("plain",))  # the earlier name


MODE_PARAMS = {"unknown": dict(top_k=5), "greedy": dict(temperature=0.0), "plain": dict(temperature=0.7),
               "top_k": dict(top_k=5), "greedy+plain": dict(temperature=torch.tensor([0.0, 1.0]).repeat(33))}


@pytest.mark.parametrize("mode", list(MODE_PARAMS))
def test_the_launcher_launches_what_the_plan_says(mode, monkeypatch):
    """Record the kernels and grids triton._launch launches (without running them) and compare
    them with plan_launches / kernel_sequence for the same shape and the params' host modes."""
    import dataclasses

    from specdec_fast.kernels.verify import triton as launcher

    launched = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((self.name, tuple(grid)))

    for name in ("select_rungs_kernel", "select_stream_kernel", "select_finish_kernel", "select_small_vocab_kernel",
                 "emit_kernel"):
        monkeypatch.setattr(launcher, name, Recorder(name.removesuffix("_kernel")))
    for batch, k, vocab, has_draft in ((3, 2, 5000, True), (2, 0, 300, False), (65, 1, 48, False), (2, 0, 5000, False)):
        launched.clear()
        target = torch.zeros(batch, k + 1, vocab)
        draft = torch.zeros(batch, k, vocab) if has_draft else None
        kw = {name: v[:batch] if isinstance(v, torch.Tensor) else v for name, v in MODE_PARAMS[mode].items()}
        params = make_sampling_tensors(batch, "cpu", **kw)
        if mode == "unknown":
            params = dataclasses.replace(params, modes=None)
        positions = torch.zeros(batch, dtype=torch.int64) if k == 0 else None
        launcher._launch(target, draft, torch.zeros(batch, k, dtype=torch.int64), params, positions, 0, {})
        plan = plans.plan_launches(batch, k, vocab, has_draft, num_sms=1, interpreting=launcher.triton_interpreting(),
                                   modes=params.modes)
        assert [name for name, _ in launched] == plans.kernel_sequence(plan)[1:]
        grids = dict(launched)
        assert grids["select_small_vocab" if not plan.large_vocab else "select_stream"] == plan.select_grid
        assert plan.greedy_tokens == (mode == "greedy")
        if not plan.greedy_tokens:
            assert launched[-1][1] == plan.emit_grid
        if plan.large_vocab and plan.finish:
            assert grids["select_finish"] == plan.finish_grid
        if plan.rungs_launch:
            assert grids["select_rungs"] == (plan.rows,)
        # the plan verify_plan reports for these modes lists the same kernels (the rungs launch
        # apart: it follows the chunks a row gets, and verify_plan sizes them for 132 SMs)
        named = None if params.modes is None else tuple(params.modes)
        reported = plans.verify_plan(batch, k, vocab, has_draft, named)["kernels"]
        assert [n for n in reported if n != "select_rungs"] == [n for n in plans.kernel_sequence(plan)
                                                                 if n != "select_rungs"]


def test_the_streaming_kernel_compiles_the_select_code_only_where_a_row_may_use_it():
    assert verify_plan(64, 4, 128256, True, ("greedy",))["stream_select_code"] is False
    assert verify_plan(64, 4, 128256, True, ("plain",))["stream_select_code"] is False
    assert verify_plan(64, 4, 128256, True, ("plain", "top_p"))["stream_select_code"] is True
    assert verify_plan(64, 4, 128256, True, None)["stream_select_code"] is True
    assert verify_plan(8, 3, 1000, True, ("greedy",))["stream_select_code"] is None  # small vocabulary: no stream
    assert verify_plan(64, 4, 128256, True, ("plain",))["stream_unroll"] == 1  # STREAM_UNROLL until a GPU decides


def test_the_launchers_take_every_plan_override_and_refuse_other_names():
    """PLAN_OVERRIDES (what chain_verify_triton / sample_triton pass on) is exactly plan_launches'
    overridable choices: its keyword-only arguments that default to None, the host's modes aside;
    another keyword is a TypeError naming it, as for any Python function."""
    import inspect

    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    keywords = inspect.signature(plans.plan_launches).parameters.values()
    overridable = {p.name for p in keywords if p.kind is p.KEYWORD_ONLY and p.default is None} - {"modes"}
    assert set(plans.PLAN_OVERRIDES) == overridable and len(plans.PLAN_OVERRIDES) == len(overridable)
    target, drafts = torch.randn(1, 2, 40), torch.zeros(1, 1, dtype=torch.int32)
    params = make_sampling_tensors(1, "cpu", temperature=0.0)
    for call in (lambda **kw: chain_verify_triton(target, None, drafts, params, **kw),
                 lambda **kw: sample_triton(target[:, 0], params, torch.zeros(1, dtype=torch.int64), 2, **kw)):
        with pytest.raises(TypeError, match="'stream_unrol'.*the plan overrides are block_v"):
            call(stream_unrol=2)
