"""AdaptiveK: the number of drafts per iteration chosen by the host before each iteration, from
what the loop has already measured (generate(num_assistant_tokens_schedule="adaptive"), the
default when a call gives no K).

The choice maximises the expected tokens per unit of time (Leviathan et al. §3.5):

    value(K) = E[tokens | K] / (K * t_draft + t_verify(K)),   E[tokens | K] = sum_{n=0..K} prod_{i<n} a_i

  a_i        the acceptance of draft position i given the drafts before it were accepted: the
             device's per-position counters (StatsRecorder.positions: reached, accepted), read
             from the polls the loop already makes (RunAheadPoller counters=): no new sync. A
             position with few observations leans on the call's pooled alpha (pseudo-counts).
  t_draft    one draft step's time, t_verify(K) the verify step's at K: the phase timer's own
             measurements (CUDA events between the graph replays, read with event.query() when
             the device has passed them: no wait; perf_counter on CPU), kept per engine decoder
             across calls (they are properties of the models, the device and the batch size).
             A K not measured yet takes a line fitted through the measured ones (one point: the
             same verify time, the draft time per step): trying it corrects it.

The choice is among the Ks the decoder can run (its captured graphs, one pair per K, captured the
first time a K is chosen). Near the end of a call K shrinks to the tokens left (the longest row's
as of the newest poll, less what the iterations issued since may have added). Exactness does not
depend on K: a choice made from the past only changes how many drafts are proposed, never how
they are verified (tests/engine/test_adaptive_k.py). Hysteresis: K changes only for a value 3%
better than the current K's, so noise in the measured times does not make it flicker.
"""
from collections import Counter, deque

import numpy as np

PRIOR_ALPHA = 0.7  # the acceptance assumed before a call has measured any (the demo pair measures 0.72-0.83)
PRIOR_WEIGHT = 4.0  # pseudo row-iterations of that prior per position
HYSTERESIS = 1.03
WINDOW = 32  # cost observations kept per kind and K (running means over the newest)


class AdaptiveK:
    """ks: the Ks available (sorted ints >= 1); start: the K of a call's first iteration."""

    def __init__(self, ks, start: int):
        self.ks = sorted(int(k) for k in ks)
        if not self.ks or self.ks[0] < 1:
            raise ValueError(f"ks must hold ints >= 1, got {ks!r}")
        self.start = start if start in self.ks else self.ks[min(len(self.ks) - 1, len(self.ks) // 2)]
        self.k_max = self.ks[-1]
        self.draft_step = deque(maxlen=WINDOW)  # seconds per draft step (any K)
        self.verify = {k: deque(maxlen=WINDOW) for k in self.ks}  # seconds per verify step at K
        self.pinned = None  # a K every choice returns (the engine's warm-up captures each K's graphs)
        self.begin_call()

    def begin_call(self) -> None:
        """A new call: its acceptance counts start at zero (the costs carry over)."""
        self.reached = np.zeros(self.k_max)
        self.accepted = np.zeros(self.k_max)
        self.k = self.start
        self.chosen = Counter()
        self.drafted_steps = 0

    # -- observations -----------------------------------------------------------------------
    def observe_counters(self, counters) -> None:
        """counters [2, K_max]: the cumulative (reached, accepted) per position of this call."""
        self.reached = np.asarray(counters[0], dtype=np.float64)
        self.accepted = np.asarray(counters[1], dtype=np.float64)

    def observe_phases(self, phases) -> None:
        """(name, k, seconds) of finished phases: "draft" (k steps) and "target" (the verify step
        at k); untagged phases (warm-up, capture) are not the steps' running cost."""
        for name, k, seconds in phases:
            if k is None or seconds <= 0:
                continue
            if name == "draft":
                self.draft_step.append(seconds / k)
            elif name == "target" and k in self.verify:
                self.verify[k].append(seconds)

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
        """{K: seconds of one iteration at K}, or None before any step was measured."""
        # Medians: a CPU shared with other work (and a GPU's first replays) give outliers that a
        # mean would follow.
        measured = {k: float(np.median(v)) for k, v in self.verify.items() if v}
        if not measured or not self.draft_step:
            return None
        draft = float(np.median(self.draft_step))
        xs = sorted(measured)
        if len(xs) >= 2:  # a line through the measured Ks, weighted by how often each was measured
            weights = [len(self.verify[k]) ** 0.5 for k in xs]
            slope, intercept = np.polyfit(xs, [measured[k] for k in xs], 1, w=weights)
            slope, intercept = max(float(slope), 0.0), float(intercept)  # a verify never gets cheaper with more drafts
        else:
            slope, intercept = 0.0, measured[xs[0]]
        verify = {k: measured.get(k, intercept + slope * k) for k in self.ks}
        return {k: k * draft + max(verify[k], 1e-9) for k in self.ks}

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
            if value[best] > HYSTERESIS * value.get(self.k, 0.0):
                self.k = best
        k = self.k
        if remaining is not None and remaining - 1 < k:  # no more drafts than tokens left to make
            k = max([q for q in self.ks if q <= max(remaining - 1, 1)] or [self.ks[0]])
        self.chosen[k] += 1
        self.drafted_steps += k
        return k

    def report(self) -> dict:
        """What the stats show: the Ks, how often each was chosen, the estimates at the end."""
        costs = self.costs() or {}
        return dict(ks=list(self.ks), chosen=dict(sorted(self.chosen.items())), drafted_steps=self.drafted_steps,
                    acceptance=[round(float(a), 3) for a in self.acceptance()],
                    step_ms={k: round(1000 * float(v), 3) for k, v in costs.items()})
