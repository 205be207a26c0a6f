"""The cost model behind the demo's "why not the predicted speedup" line (specdec_fast/engine/phase_costs.py)."""
import pytest

from specdec_fast.engine.phase_costs import merge_stats, phase_costs
from specdec_fast.engine.stats import GenerationStats


def _stats(k, iterations, draft_s, target_s, wall_s, hist, new_tokens):
    return GenerationStats(k=k, batch=1, new_tokens=new_tokens, tokens_per_row=[new_tokens], first_tokens=1,
                           loop_tokens=new_tokens - 1, iterations=iterations, wall_s=wall_s, accepted_hist=hist,
                           draft_s=draft_s, target_s=target_s)


def test_merge_stats_pools_counters_and_phase_times():
    a = _stats(4, 10, 0.1, 0.3, 0.5, [1, 1, 2, 2, 4], 40)
    b = _stats(4, 20, 0.2, 0.5, 0.9, [2, 2, 4, 4, 8], 80)
    merged = merge_stats([a, b])
    assert (merged.iterations, merged.new_tokens, merged.batch, merged.accepted_hist) == (30, 120, 2, [3, 3, 6, 6, 12])
    assert merged.draft_s == pytest.approx(0.3) and merged.target_s == pytest.approx(0.8) and merged.wall_s == pytest.approx(1.4)
    assert merged.tokens_per_row == [40, 80]


def test_phase_costs_price_every_phase_at_its_measured_cost():
    # plain: 100 steps of 5 ms; speculative: 30 iterations, verify 12 ms, draft 6 ms each, 3.3 tokens each
    plain = _stats(0, 100, 0.0, 0.5, 0.52, [100], 100)
    spec = _stats(4, 30, 0.18, 0.36, 0.6, [0, 3, 6, 6, 15], 100)
    costs = phase_costs(spec, plain)
    assert costs.plain_step_s == pytest.approx(0.005)
    assert costs.verify_step_s == pytest.approx(0.012) and costs.verify_over_plain == pytest.approx(2.4)
    assert costs.draft_per_iter_s == pytest.approx(0.006)
    mean_len = spec.mean_accepted_length
    assert costs.with_phase_costs == pytest.approx(mean_len * 0.005 / 0.018)
    assert costs.measured == pytest.approx((100 / 0.6) / (100 / 0.52))
    assert costs.theorem == pytest.approx(spec.predicted_speedup)
    assert costs.gap_is_large()  # the theorem (c = 0.125) predicts ~2x, 0.87x measured
    line = costs.explain()
    assert "\n" not in line
    for text in (f"{costs.measured:.2f}x", f"{costs.theorem:.2f}x", "2.40x one", "12.0 vs 5.0 ms", "6.0 ms of draft steps",
                 f"predict {costs.with_phase_costs:.2f}x"):
        assert text in line, (text, line)


def test_no_cost_model_without_timed_phases():
    plain = _stats(0, 0, 0.0, 0.0, 0.1, [0], 1)
    spec = _stats(4, 3, 0.01, 0.02, 0.05, [0, 0, 1, 1, 1], 10)
    assert phase_costs(spec, plain) is None
    assert phase_costs(plain, spec) is None  # k = 0 is not a speculative run
