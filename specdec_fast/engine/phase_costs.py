"""Why a measured speedup departs from Leviathan's Theorem 3.8, from the measured phase costs.

The theorem prices an iteration as K draft steps plus ONE plain target step: it assumes that
scoring K+1 tokens (plus the verify) costs what decoding one token costs. On a CPU in fp32 it
does not (the target's pass over 5 tokens measured 1.6-2.2x a plain step on the demo pair),
so the theorem's prediction (stats.predicted_speedup) overshoots. Pricing every phase at its
measured cost:

    plain_step      = plain run's target phase / its iterations      (one token, one step)
    verify_step     = speculative run's target phase / its iterations (score K+1 + verify + commit)
    draft_per_iter  = speculative run's draft phase / its iterations  (K draft steps)
    with_phase_costs = mean accepted length * plain_step / (draft_per_iter + verify_step)

What remains between with_phase_costs and the measured speedup is time outside the two phases
(prefill, host glue). bench/bench_e2e.py records the same model per configuration.
"""
from dataclasses import dataclass

from .stats import GenerationStats


def merge_stats(all_stats: list[GenerationStats]) -> GenerationStats:
    """One GenerationStats pooling runs made one after another (e.g. one per prompt): summed
    counters and phase times, so alpha and c are pooled estimates."""
    first = all_stats[0]
    return GenerationStats(
        k=first.k, batch=sum(s.batch for s in all_stats), new_tokens=sum(s.new_tokens for s in all_stats),
        tokens_per_row=[n for s in all_stats for n in s.tokens_per_row], first_tokens=sum(s.first_tokens for s in all_stats),
        loop_tokens=sum(s.loop_tokens for s in all_stats), iterations=sum(s.iterations for s in all_stats),
        wall_s=sum(s.wall_s for s in all_stats), accepted_hist=[sum(h) for h in zip(*(s.accepted_hist for s in all_stats))],
        draft_s=sum(s.draft_s for s in all_stats), target_s=sum(s.target_s for s in all_stats),
        capture_s=sum(s.capture_s for s in all_stats), graph_mode=first.graph_mode, graph_note=first.graph_note,
        graph_replays={name: sum(s.graph_replays.get(name, 0) for s in all_stats) for name in first.graph_replays},
    )


@dataclass
class PhaseCosts:
    k: int
    plain_step_s: float  # one plain decoding step (target phase per iteration, K = 0)
    verify_step_s: float  # the target's pass over K+1 tokens + verify + commit, per iteration
    draft_per_iter_s: float  # the K draft steps of one iteration
    mean_accepted_length: float
    theorem: float  # Theorem 3.8 from alpha and c (stats.predicted_speedup)
    measured: float  # speculative tokens/s over plain tokens/s

    @property
    def verify_over_plain(self) -> float:
        return self.verify_step_s / self.plain_step_s

    @property
    def with_phase_costs(self) -> float:
        """Theorem 3.8 with every phase at its measured cost."""
        return self.mean_accepted_length * self.plain_step_s / (self.draft_per_iter_s + self.verify_step_s)

    def gap_is_large(self, ratio: float = 1.25) -> bool:
        return self.theorem > ratio * self.measured

    def explain(self) -> str:
        """One line: which phase cost what, and what the theorem predicts with those costs."""
        ms = 1e3
        return (f"why {self.measured:.2f}x and not the predicted {self.theorem:.2f}x: Theorem 3.8 prices scoring "
                f"K+1 = {self.k + 1} tokens as one plain step, but here it cost {self.verify_over_plain:.2f}x one "
                f"({self.verify_step_s * ms:.1f} vs {self.plain_step_s * ms:.1f} ms), plus {self.draft_per_iter_s * ms:.1f} ms "
                f"of draft steps; at these measured costs {self.mean_accepted_length:.2f} tokens per iteration predict "
                f"{self.with_phase_costs:.2f}x (the rest is prefill and glue outside the phases)")


def phase_costs(speculative: GenerationStats, plain: GenerationStats) -> PhaseCosts | None:
    """The cost model of a speculative run against a plain run of the same work; None when a
    phase was not timed (no iterations)."""
    if not speculative.k or not speculative.iterations or not plain.iterations or plain.target_s <= 0:
        return None
    return PhaseCosts(
        k=speculative.k, plain_step_s=plain.target_s / plain.iterations,
        verify_step_s=speculative.target_s / speculative.iterations,
        draft_per_iter_s=speculative.draft_s / speculative.iterations,
        mean_accepted_length=speculative.mean_accepted_length, theorem=speculative.predicted_speedup,
        measured=speculative.tokens_per_s / plain.tokens_per_s,
    )
