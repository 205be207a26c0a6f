"""AdaptiveK: the number of drafts per iteration chosen by the host before each iteration, from
what the loop has already measured (generate(num_assistant_tokens_schedule="adaptive"); opt-in,
see engine.SpeculativeEngine._ks_for for what the H100 measured).

The choice maximises the expected tokens per unit of time (Leviathan et al. §3.5):

    value(K) = E[tokens | K] / (K * t_draft + t_verify(K)),   E[tokens | K] = sum_{n=0..K} prod_{i<n} a_i

(a drafter whose cost is per iteration, draft_cost="per_iteration": a DFlash block, one forward
whatever K: K * t_draft becomes t_draft(K), a line through the measured Ks like the verify's)

  a_i        the acceptance of draft position i given the drafts before it were accepted: the
             device's per-position counters (StatsRecorder.positions: reached, accepted), read
             from the polls the loop already makes (RunAheadPoller counters=): no new sync. A
             position with few observations leans on the call's pooled alpha (pseudo-counts).
  t_draft    one draft step's time, t_verify(K) the verify step's at K: the phase timer's own
             measurements (CUDA events between the graph replays, read with event.query() when
             the device has passed them: no wait; perf_counter on CPU), kept per engine decoder
             across calls (they are properties of the models, the device and the batch size).
             A K not measured yet takes a line fitted through the measured ones (one point: the
             same verify time, the draft time per step): trying it corrects it. Per-iteration
             drafters, one point: the same draft time, and a verify time proportional to the K + 1
             tokens it scores (with a flat verify too, nothing would make a block drafter try a
             K below its first: on a CPU the verify nearly is proportional, on a GPU the second K
             measured corrects the line).

The choice is among the Ks the decoder can run (its graphs, one pair per K, captured the first time
a K is chosen). Under CUDA graphs a K not captured yet costs its set-up (an eager warm-up
iteration and the capture: 45-100 ms on the H100 for the 8B-shaped pair, more than a 128-token
call's whole gain from a slightly better K), so it is bought as in ski rental: each iteration that
runs a ready K while an unready one looks better adds the time the better one would have saved
(regret, kept across calls); once that reaches the measured set-up cost, the better K is
captured. A call starts at the K the previous call ran most. Near the end of a call K shrinks to
the tokens left (the longest row's as of the newest poll, less what the iterations issued since
may have added), among the ready Ks only. Exactness does not
depend on K: a choice made from the past only changes how many drafts are proposed, never how
they are verified (tests/engine/test_adaptive_k.py). Under tensor parallelism every rank runs rank 0's
choice (distributed/k_leader.py; ``follow``). Hysteresis: K changes only for a value 3%
better than the current K's, so noise in the measured times does not make it flicker.
"""
from collections import Counter, deque

import numpy as np

PRIOR_ALPHA = 0.7  # the acceptance assumed before a call has measured any (the demo pair measures 0.72-0.83)
PRIOR_WEIGHT = 4.0  # pseudo row-iterations of that prior per position
HYSTERESIS = 1.03
WINDOW = 32  # cost observations kept per kind and K (running means over the newest)
# The fitted costs are refreshed after this many new step observations (or when a K is measured
# for the first time): the medians and two line fits cost 0.12-0.15 ms of host time per choice on
# the CPU (2-core EPYC), which a CPU decoder, with no device to run ahead of, pays per iteration.
REFIT_EVERY = 8


DRAFT_COSTS = ("per_step", "per_iteration")


class AdaptiveK:
    """ks: the Ks available (sorted ints >= 1); start: the K of a call's first iteration;
    draft_cost: "per_step" (a draft model: K steps) or "per_iteration" (a block drafter)."""

    def __init__(self, ks, start: int, draft_cost: str = "per_step"):
        self.ks = sorted(int(k) for k in ks)
        if not self.ks or self.ks[0] < 1:
            raise ValueError(f"ks must hold ints >= 1, got {ks!r}")
        if draft_cost not in DRAFT_COSTS:
            raise ValueError(f"draft_cost must be one of {DRAFT_COSTS}, got {draft_cost!r}")
        self.draft_cost = draft_cost
        self.start = start if start in self.ks else self.ks[min(len(self.ks) - 1, len(self.ks) // 2)]
        self.k_max = self.ks[-1]
        self.draft_step = deque(maxlen=WINDOW)  # seconds per draft step (any K; per_step)
        self.draft = {k: deque(maxlen=WINDOW) for k in self.ks}  # seconds per draft phase at K (per_iteration)
        self.verify = {k: deque(maxlen=WINDOW) for k in self.ks}  # seconds per verify step at K
        self.pinned = None  # a K every choice returns (the engine's warm-up captures each K's graphs)
        # Ks that run without a set-up (graphs captured; every K when eager: all_ready), the set-up
        # time measured (untagged phases: warm-up and capture iterations) and the Ks set up.
        self.ready, self.all_ready = set(), False
        self.setup_seconds, self.setups = 0.0, 0
        self.regret = {k: 0.0 for k in self.ks}
        self._observed, self._fitted = 0, None  # step observations so far; (count, measured Ks, costs) of the last fit
        self.chosen = Counter()
        self.begin_call()

    def begin_call(self) -> None:
        """A new call: its acceptance counts start at zero (the costs carry over)."""
        self.reached = np.zeros(self.k_max)
        self.accepted = np.zeros(self.k_max)
        # the K the previous call ran most (its measured choice), else the start K
        self.k = self.chosen.most_common(1)[0][0] if self.chosen else self.start
        self.chosen = Counter()
        self.drafted_steps = 0

    def mark_ready(self, k: int, *, graphs: bool) -> None:
        """K's steps run as they will from now on (graphs=False: eager, so every K is ready)."""
        self.ready.add(k)
        if graphs:
            self.setups += 1
        else:
            self.all_ready = True

    # -- observations -----------------------------------------------------------------------
    def observe_counters(self, counters) -> None:
        """counters [2, K_max]: the cumulative (reached, accepted) per position of this call."""
        self.reached = np.asarray(counters[0], dtype=np.float64)
        self.accepted = np.asarray(counters[1], dtype=np.float64)

    def observe_phases(self, phases) -> None:
        """(name, k, seconds) of finished phases: "draft" (k steps) and "target" (the verify step
        at k); untagged phases (warm-up, capture) are not the steps' running cost."""
        for name, k, seconds in phases:
            if k is None and seconds > 0 and name in ("draft", "target", "capture"):
                self.setup_seconds += seconds  # a K's warm-up / capture iterations
                continue
            if k is None or seconds <= 0:
                continue
            if name == "draft":
                self.draft_step.append(seconds / k)
                if k in self.draft:
                    self.draft[k].append(seconds)
                self._observed += 1
            elif name == "target" and k in self.verify:
                self.verify[k].append(seconds)
                self._observed += 1

    # -- the estimates ----------------------------------------------------------------------
    def acceptance(self) -> np.ndarray:
        """a_i, i < K_max: the counts with PRIOR_WEIGHT pseudo-counts at the call's pooled alpha."""
        total_reached, total_accepted = self.reached.sum(), self.accepted.sum()
        pooled = (total_accepted + PRIOR_WEIGHT * PRIOR_ALPHA) / (total_reached + PRIOR_WEIGHT)
        return (self.accepted + PRIOR_WEIGHT * pooled) / (self.reached + PRIOR_WEIGHT)

    def expected_tokens(self, k: int, a=None) -> float:
        a = self.acceptance() if a is None else a
        return float(1.0 + np.cumprod(a[:k]).sum())

    def costs(self) -> dict | None:
        """{K: seconds of one iteration at K}, or None before any step was measured; refitted
        after REFIT_EVERY new observations or a K's first (between, the last fit's)."""
        measured_ks = (frozenset(k for k, v in self.verify.items() if v), frozenset(k for k, v in self.draft.items() if v))
        fit = self._fitted
        if fit is not None and fit[1] == measured_ks and self._observed - fit[0] < REFIT_EVERY:
            return fit[2]
        costs = self._fit()
        self._fitted = (self._observed, measured_ks, costs)
        return costs

    def _fit(self) -> dict | None:
        # Medians: a CPU shared with other work (and a GPU's first replays) give outliers that a
        # mean would follow.
        measured = {k: float(np.median(v)) for k, v in self.verify.items() if v}
        if not measured or not self.draft_step:
            return None
        if self.draft_cost == "per_step":
            one_point = "flat"
            draft_step = float(np.median(self.draft_step))
            draft = {k: k * draft_step for k in self.ks}
        else:
            if not any(self.draft.values()):
                return None
            one_point = "proportional"  # a verify scores K + 1 tokens (module docstring)
            draft = self._line(self.draft, "flat")
        verify = self._line(self.verify, one_point)
        return {k: draft[k] + max(verify[k], 1e-9) for k in self.ks}

    def _line(self, samples: dict, one_point: str) -> dict:
        """{K: seconds} from samples {K: deque of seconds}: the measured median where K ran, else a
        line through the measured Ks, weighted by how often each was measured, never decreasing
        with K; through one point: "flat", or "proportional" to K + 1."""
        measured = {k: float(np.median(v)) for k, v in samples.items() if v}
        xs = sorted(measured)
        if len(xs) >= 2:
            weights = [len(samples[k]) ** 0.5 for k in xs]
            slope, intercept = np.polyfit(xs, [measured[k] for k in xs], 1, w=weights)
            slope, intercept = max(float(slope), 0.0), float(intercept)  # more drafts never cost less
            line = {k: intercept + slope * k for k in self.ks}
        elif one_point == "flat":
            line = {k: measured[xs[0]] for k in self.ks}
        else:
            line = {k: measured[xs[0]] * (k + 1) / (xs[0] + 1) for k in self.ks}
        return {k: measured.get(k, line[k]) for k in self.ks}

    # -- the choice -------------------------------------------------------------------------
    def choose(self, remaining: int | None = None) -> int:
        """The K of the next iteration (``remaining``: at most this many tokens are still wanted
        from the longest row, None: unknown)."""
        if self.pinned is not None:
            return self.pinned
        costs = self.costs()
        if costs is not None:
            a = self.acceptance()
            value = {k: self.expected_tokens(k, a) / costs[k] for k in self.ks}
            best = max(self.ks, key=lambda k: (value[k], -k))
            if not self._is_ready(best) and value[best] > value[self.k]:
                # rent or buy: the time this iteration loses to the better K, until it pays the set-up
                self.regret[best] += costs[self.k] * (1.0 - value[self.k] / value[best])
                if self.regret[best] < self.setup_cost():
                    best = max((k for k in self.ks if self._is_ready(k)), key=lambda k: (value[k], -k),
                               default=self.k)
            if value[best] > HYSTERESIS * value.get(self.k, 0.0):
                self.k = best
        k = self.k
        if remaining is not None and remaining - 1 < k:  # no more drafts than tokens left to make
            ready = [q for q in self.ks if self._is_ready(q)] or [k]
            fits = [q for q in ready if q <= max(remaining - 1, 1)]
            k = max(fits) if fits else min(ready)  # none fits: drafts past the end cost less than a set-up
        self.chosen[k] += 1
        self.drafted_steps += k
        return k

    def follow(self, chosen: int, k: int) -> None:
        """The iteration runs ``k``, another process's choice (tensor parallelism: rank 0's), where this one's
        last choose() gave ``chosen``: the counts and the current K follow (the costs this process measures
        at that K stay its own)."""
        if k == chosen:
            return
        self.chosen[chosen] -= 1
        if self.chosen[chosen] <= 0:
            del self.chosen[chosen]
        self.chosen[k] += 1
        self.drafted_steps += k - chosen
        self.k = k

    def _is_ready(self, k: int) -> bool:
        return self.all_ready or k in self.ready

    def setup_cost(self) -> float:
        """Seconds one K's set-up took (mean of those measured; none yet: as long as 8 iterations
        of the most expensive K measured, a guess that only delays the first purchase)."""
        if self.setups:
            return self.setup_seconds / self.setups
        costs = self.costs() or {}
        return 8 * max(costs.values(), default=0.0)

    def report(self) -> dict:
        """What the stats show: the Ks, how often each was chosen, the estimates at the end."""
        costs = self.costs() or {}
        return dict(ks=list(self.ks), chosen=dict(sorted(self.chosen.items())), drafted_steps=self.drafted_steps,
                    ready=sorted(self.ks if self.all_ready else self.ready),
                    acceptance=[round(float(a), 3) for a in self.acceptance()],
                    step_ms={k: round(1000 * float(v), 3) for k, v in costs.items()})
