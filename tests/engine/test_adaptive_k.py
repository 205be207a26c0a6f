"""The adaptive K schedule (specdec_fast/engine/schedule.py): what it chooses from what it measured,
and that no choice changes the output (greedy: token for token; sampling: the distribution).

The exactness tests drive the loop with a "chaos" schedule (a K drawn per iteration from a fixed
sequence, whatever was measured): Chen et al.'s Theorem 1 holds for any number of drafts per
iteration chosen before the drafts are made, so every such sequence must give the target's
tokens. What they would catch: a verify that reads another K's drafts or draft probabilities, a
draft cache left at the wrong length when K changes, a K larger than the state holds.
"""
import numpy as np
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.engine import SpeculativeEngine
from specdec_fast.engine.schedule import HYSTERESIS, AdaptiveK

from ..fake_cuda import fake_cuda  # noqa: F401 (fixture)
from ..kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue
from .conftest import model_pair
from .models import left_padded_prompts, make_draft, make_model
from .test_loop_host_work import KeepUpEvent, host_work_per_iteration
from .test_sampling_exact import PROMPT, ROWS, VOCAB, joint_and_third

KS = (1, 2, 3, 4, 5, 6, 8)


def observed(schedule: AdaptiveK, *, alpha: float, draft_s: float, verify_s, rows: int = 400,
             eager: bool = True) -> AdaptiveK:
    """Feeds the schedule counters of `rows` row-iterations at K_max with acceptance alpha per
    position, and 8 timed iterations per K (verify_s: seconds, or K -> seconds); eager: every K
    runs without a set-up (no graphs to capture)."""
    schedule.all_ready = eager
    reached = rows * alpha ** np.arange(schedule.k_max)
    schedule.observe_counters(np.stack([reached, reached * alpha]))
    for k in schedule.ks:
        verify = verify_s(k) if callable(verify_s) else verify_s
        schedule.observe_phases([("draft", k, draft_s * k), ("target", k, verify)] * 8)
    return schedule


# -- the choice ---------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha, draft_s, expected", [
    (0.95, 0.02, 8),  # drafts nearly always accepted and cheap: the most drafts
    (0.2, 0.1, 1),  # drafts mostly rejected: one
    (0.8, 0.3, 3),  # a draft step a third of a verify's cost: few
    (0.8, 0.8, 1),  # nearly a verify's cost: one
])
def test_it_chooses_what_maximises_tokens_per_second(alpha, draft_s, expected):
    schedule = observed(AdaptiveK(KS, start=1), alpha=alpha, draft_s=draft_s, verify_s=1.0)
    assert schedule.choose() == expected
    # the value it maximises, by hand: E[tokens | K] / (K t_draft + t_verify)
    value = {k: sum(alpha**n for n in range(k + 1)) / (k * draft_s + 1.0) for k in KS}
    assert expected == max(value, key=value.get)


def test_a_verify_that_grows_with_k_moves_the_choice_down():
    flat = observed(AdaptiveK(KS, start=4), alpha=0.8, draft_s=0.05, verify_s=1.0).choose()
    steep = observed(AdaptiveK(KS, start=4), alpha=0.8, draft_s=0.05, verify_s=lambda k: 1.0 + 0.3 * k).choose()
    assert steep < flat


def test_unmeasured_ks_are_priced_on_the_measured_line():
    schedule = AdaptiveK(KS, start=2)
    schedule.observe_phases([("draft", 2, 0.2), ("target", 2, 1.2), ("draft", 4, 0.4), ("target", 4, 1.4)])
    costs = schedule.costs()
    assert costs[2] == pytest.approx(0.2 + 1.2) and costs[4] == pytest.approx(0.4 + 1.4)
    assert costs[8] == pytest.approx(8 * 0.1 + 1.8)  # verify 1.0 + 0.1 K, draft 0.1 per step
    assert schedule.observe_phases([("capture", None, 9.0)]) is None and schedule.costs() == costs  # untagged: ignored


BLOCK_KS = (1, 2, 3, 4, 6, 8, 12, 15)


def test_a_block_drafter_pays_its_draft_once_per_iteration():
    """draft_cost="per_iteration" (a DFlash block): K * t_draft becomes a line through the measured
    draft phases; with one K measured the draft is flat and the verify proportional to K + 1."""
    schedule = AdaptiveK(BLOCK_KS, start=15, draft_cost="per_iteration")
    schedule.observe_phases([("draft", 15, 2.0), ("target", 15, 3.2)])
    costs = schedule.costs()
    assert costs[15] == pytest.approx(5.2)
    assert costs[3] == pytest.approx(2.0 + 3.2 * 4 / 16)  # draft flat, verify by the rows it scores
    schedule.observe_phases([("draft", 3, 1.9), ("target", 3, 1.4)])
    costs = schedule.costs()  # two Ks: lines (draft 1.9 + K / 120, verify 1.4 + 0.15 (K - 3))
    assert costs[3] == pytest.approx(3.3) and costs[15] == pytest.approx(5.2)
    assert costs[8] == pytest.approx(1.9 + 5 / 120 + 1.4 + 0.15 * 5)
    per_step = AdaptiveK(BLOCK_KS, start=15)  # the same phases priced per draft step
    per_step.observe_phases([("draft", 15, 2.0), ("target", 15, 3.2)])
    assert per_step.costs()[3] == pytest.approx(3 * 2.0 / 15 + 3.2)
    with pytest.raises(ValueError, match="draft_cost"):
        AdaptiveK(BLOCK_KS, start=4, draft_cost="per_token")


@pytest.mark.parametrize("alpha, verify_per_row, expected", [
    (0.9, 0.0, 15),  # a flat verify (a GPU's memory-bound pass): the whole block
    (0.6, 0.25, 3),  # a verify that grows with its rows (a CPU's): few, though the draft cost is fixed
])
def test_a_block_drafter_weighs_the_verify_rows_against_acceptance(alpha, verify_per_row, expected):
    schedule = AdaptiveK(BLOCK_KS, start=15, draft_cost="per_iteration")
    schedule.all_ready = True
    reached = 400 * alpha ** np.arange(schedule.k_max)
    schedule.observe_counters(np.stack([reached, reached * alpha]))
    for k in BLOCK_KS:
        schedule.observe_phases([("draft", k, 1.0), ("target", k, 1.0 + verify_per_row * (k + 1))] * 8)
    value = {k: sum(alpha**n for n in range(k + 1)) / (2.0 + verify_per_row * (k + 1)) for k in BLOCK_KS}
    assert schedule.choose() == expected == max(value, key=value.get)


def test_costs_are_refitted_after_refit_every_observations_or_a_new_k():
    """The medians and line fits are host time a CPU decoder pays per iteration: they are reused
    until REFIT_EVERY new step observations arrive, or a K is measured for the first time."""
    from specdec_fast.engine.schedule import REFIT_EVERY

    schedule = AdaptiveK(KS, start=2)
    schedule.observe_phases([("draft", 2, 0.2), ("target", 2, 1.2)])
    first = schedule.costs()
    schedule.observe_phases([("target", 2, 9.0)] * (REFIT_EVERY - 2))  # the same K: the last fit stands
    assert schedule.costs() is first
    schedule.observe_phases([("target", 2, 9.0)] * 2)  # REFIT_EVERY observations since: refitted
    assert schedule.costs()[2] == pytest.approx(0.2 + 9.0)
    fitted = schedule.costs()
    schedule.observe_phases([("draft", 4, 0.4), ("target", 4, 9.5)])  # a K measured for the first time
    assert schedule.costs() is not fitted and schedule.costs()[4] == pytest.approx(0.4 + 9.5)


def test_hysteresis_keeps_k_for_a_gain_under_its_margin():
    schedule = observed(AdaptiveK((2, 3), start=2), alpha=0.6, draft_s=0.1, verify_s=1.0)
    a = schedule.acceptance()
    value = {k: schedule.expected_tokens(k, a) / schedule.costs()[k] for k in (2, 3)}
    assert 1.0 < value[3] / value[2] < HYSTERESIS  # K=3 is better, by less than the margin
    assert schedule.choose() == 2
    schedule.k = 1  # from a K the margin does not protect, it moves
    assert observed(AdaptiveK((1, 2, 3), start=1), alpha=0.6, draft_s=0.1, verify_s=1.0).choose() == 3


def test_k_shrinks_to_the_tokens_left_and_the_report_counts_choices():
    schedule = observed(AdaptiveK(KS, start=4), alpha=0.95, draft_s=0.02, verify_s=1.0)
    assert [schedule.choose(remaining) for remaining in (None, 6, 4, 2, 1)] == [8, 5, 3, 1, 1]
    report = schedule.report()
    assert report["chosen"] == {1: 2, 3: 1, 5: 1, 8: 1} and report["drafted_steps"] == 8 + 5 + 3 + 1 + 1
    schedule.begin_call()
    assert schedule.report()["chosen"] == {} and schedule.costs() is not None  # costs outlive a call


def test_an_uncaptured_k_is_bought_once_its_regret_pays_the_capture():
    """Under graphs, K=4 ready and K=8 better but not captured: the schedule stays at 4 while the
    time it loses adds up, and captures 8 once that reaches the measured set-up (ski rental)."""
    schedule = observed(AdaptiveK(KS, start=4), alpha=0.95, draft_s=0.02, verify_s=1.0, eager=False)
    schedule.mark_ready(4, graphs=True)
    schedule.observe_phases([("draft", None, 0.5), ("capture", None, 2.5)])  # 3 s to set up K = 4
    assert schedule.setup_cost() == pytest.approx(3.0)
    a = schedule.acceptance()
    value = {k: schedule.expected_tokens(k, a) / schedule.costs()[k] for k in (4, 8)}
    loss = schedule.costs()[4] * (1 - value[4] / value[8])  # seconds lost per iteration at 4
    runs = [schedule.choose() for _ in range(int(3.0 / loss) + 2)]
    assert runs[0] == 4 and runs[-1] == 8 and runs.index(8) == int(np.ceil(3.0 / loss)) - 1
    schedule.begin_call()
    assert schedule.k == 4, "a call starts at the K the previous call ran most"
    schedule.mark_ready(8, graphs=True)
    assert schedule.choose(remaining=3) == 4, "shrinking stays among the ready Ks"
    assert schedule.report()["ready"] == [4, 8]


def test_the_prior_rules_until_counts_arrive():
    schedule = AdaptiveK(KS, start=4)
    assert schedule.costs() is None and schedule.choose() == 4  # nothing measured: the start K
    assert np.allclose(schedule.acceptance(), 0.7)


def test_bad_ks_raise():
    with pytest.raises(ValueError, match="ks must hold ints >= 1"):
        AdaptiveK((0, 2), start=2)


# -- exactness -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_greedy_adaptive_equals_generate(kind, chaos):
    target, draft = model_pair(kind)
    ids, mask = left_padded_prompts([5, 11, 2], seed=3)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, pad_token_id=0)
    kw = dict(assistant_model=draft, num_assistant_tokens_schedule="adaptive", do_sample=False, max_new_tokens=24,
              pad_token_id=0, return_stats=True)
    out, stats = api.generate(target, ids, mask, **kw)
    assert torch.equal(out, expected) and stats.schedule is not None
    chosen = chaos([1, 8, 3, 5, 2, 6, 4])
    out, stats = api.generate(target, ids, mask, **kw)
    assert torch.equal(out, expected)
    assert len(set(chosen)) >= 4 and stats.schedule["chosen"] == dict(sorted(
        {k: chosen.count(k) for k in set(chosen)}.items()))


def test_sampling_with_k_changing_every_iteration_follows_the_target(chaos):
    """As test_sampling_exact.py, with K cycling 1, 3, 2 per iteration (T = 1): the joint of the
    first two new tokens and the marginal of the third. Control: the same samples against the
    draft's distribution fail, so the test has the power to tell the two apart."""
    target = make_model("llama", vocab=VOCAB, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    draft = make_draft(target, noise=0.4, seed=6)
    chosen = chaos([1, 3, 2])
    ids = PROMPT.expand(ROWS, -1)
    out, stats = api.generate(target, ids, assistant_model=draft, num_assistant_tokens_schedule="adaptive",
                              do_sample=True, temperature=1.0, max_new_tokens=4, seed=11, return_stats=True)
    new = out[:, PROMPT.shape[1]:]
    assert set(chosen) == {1, 2, 3} and 0.2 < stats.alpha < 0.95
    settings = dict(temperature=1.0)
    joint12, p3 = joint_and_third(target, PROMPT, VOCAB, settings)
    assert chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], joint12) > P_VALUE_THRESHOLD
    assert chi_square_pvalue(new[:, 2], p3) > P_VALUE_THRESHOLD
    draft_joint12, _ = joint_and_third(draft, PROMPT, VOCAB, settings)
    assert chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], draft_joint12) < P_VALUE_THRESHOLD


@pytest.mark.parametrize("do_sample", [False, True])
def test_without_a_schedule_named_k_is_constant_and_seeds_reproduce(do_sample):
    """No K and no schedule named: the constant default K (the same seed, the same tokens; an
    adaptive choice follows measured times, so it could not promise that)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([4, 9], seed=5)
    kw = dict(assistant_model=draft, do_sample=do_sample, max_new_tokens=10, pad_token_id=0, seed=3, return_stats=True)
    (a, sa), (b, _) = api.generate(target, ids, mask, **kw), api.generate(target, ids, mask, **kw)
    assert torch.equal(a, b) and sa.schedule is None and sa.k == 4
    with pytest.raises(ValueError, match="num_assistant_tokens_schedule must be one of"):
        api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens_schedule="fast", max_new_tokens=4)


# -- the engine ----------------------------------------------------------------------------------
def test_warmup_captures_every_k_and_measures_each():
    target, draft = model_pair("llama")
    engine = SpeculativeEngine(target, assistant_model=draft, max_batch_size=2, max_seq_len=64, cuda_graphs="static")
    engine.warmup([2], do_sample=False, num_assistant_tokens_schedule="adaptive")
    ids, mask = left_padded_prompts([6, 3], seed=7)
    out, stats = engine.generate(ids, mask, do_sample=False, max_new_tokens=20, pad_token_id=0, return_stats=True,
                                 num_assistant_tokens_schedule="adaptive")
    assert stats.schedule is not None and stats.graphs_captured == 0  # every K's graphs exist already
    assert sorted(int(k) for k in stats.schedule["step_ms"]) == list(KS)
    (decoder,) = [d for d in engine._decoders.values() if d.schedule is not None]
    assert all(len(decoder.schedule.verify[k]) > 0 for k in KS), "the warm-up timed every K"
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    assert torch.equal(out, expected)


def test_the_schedule_reads_nothing_from_the_device_beyond_the_polls(fake_cuda):  # noqa: F811 (fixture)
    """Under (fake) CUDA graphs, an adaptive decoder's iterations run the same torch ops as a
    constant K's plus one: the poll's copy of the status and one of the position counters [2, K_max]
    (both async on CUDA, into pinned buffers), no allocation, no scalar read (.item() would show as
    aten._local_scalar_dense)."""
    from specdec_fast.drafters import ModelDrafter
    from specdec_fast.engine import SpeculativeDecoder
    from specdec_fast.kernels.sampling_params import make_sampling_tensors
    from specdec_fast.runners import PagedLlamaRunner

    def make(new):
        target, draft = model_pair("llama")
        runner = PagedLlamaRunner(target, max_new_tokens=new, num_draft_tokens=8)
        drafter = ModelDrafter(PagedLlamaRunner(draft, max_new_tokens=new, num_draft_tokens=8))
        decoder = SpeculativeDecoder(runner, drafter, k=3, ks=(1, 3, 8), max_new_tokens=new,
                                     params=make_sampling_tensors(1, "cpu", temperature=0.0, seed=0))
        decoder.graph_mode = "cuda_graphs"
        decoder.use_events(KeepUpEvent)
        return decoder

    work = host_work_per_iteration(make)
    assert work["op_names"] == ["aten.copy_.default"] and work["torch_ops"] == 2 and work["allocating"] == 0
