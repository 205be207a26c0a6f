"""Run statistics: acceptance, tokens/s, the measured cost ratio c and Leviathan's predicted speedup.

Counters live on the device during the loop (no sync) and are read once at the end. Phase
times: on CUDA with events recorded at phase boundaries (preallocated, no sync until the end),
on CPU with perf_counter (CPU work is synchronous).

Definitions (Leviathan et al. 2022, section 3):
    alpha  = accepted drafts / drafts examined, where an iteration with j accepted examines
             min(j + 1, K) drafts (rows' missing prompt-lookup drafts count as rejections)
    c      = (draft phase time / (iterations * K)) / (target phase time / iterations); the
             target phase is score + verify + commit + append
    E[tokens per iteration] = (1 - alpha^(K+1)) / (1 - alpha)          (Theorem 3.8)
    predicted speedup       = E[tokens per iteration] / (K * c + 1)

Under CUDA graphs (loop.py) the draft and the verify step are two graph replays: the phase
events are recorded between the replays (never inside a capture), so draft_s and target_s are
the GPU times of the draft graph and of the verify graph, and c is their ratio as in eager
mode. The capture iteration (warm-up sync + capture + first replay) is timed as phase
"capture" (capture_s), the prefill as "prefill" (prefill_s); both are outside draft_s /
target_s, and wall_s includes them. What remains,
    host_s = wall_s - prefill_s - capture_s - draft_s - target_s,
is the time outside the two phases: the poll copies, and (under graphs) whatever the GPU spent
waiting for the host; host_ms_per_iter = host_s / iterations (the issue-11 target: <= 0.3 ms).
"""
import time
from dataclasses import dataclass, field

import torch

EVENTS_PER_CHUNK = 64  # timing events are created in chunks, never one per mark


class PhaseTimer:
    """Accumulates wall time per named phase; ``mark(name)`` ends the current phase, starts name
    (None: an untimed stretch). ``events``: None (perf_counter, CPU) or an event class like
    torch.cuda.Event; its events are created EVENTS_PER_CHUNK at a time and recorded in turn
    (the engine never marks inside a graph capture: marks sit between the steps)."""

    def __init__(self, events=None):
        self.events = events
        self.pool = []  # event objects, reused across generate() calls of one decoder
        self._next, self._capacity = 0, 0  # the next event to record, len(pool)
        self.names = []  # (name, tag) of the phase started at mark i (tag: the K of a step, or None)
        self.stamps = []  # perf_counter values (CPU)
        self.totals = {}
        self._drained = 0  # marks whose phase drain() has handed out

    def mark(self, name, tag=None) -> None:
        """End the current phase and start ``name`` (None: untimed), tagged with ``tag`` (the K of
        a step; kept as one (name, tag) pair: one append per mark, the loop's host work is counted)."""
        self.names.append((name, tag))
        if self.events is None:
            self.stamps.append(time.perf_counter())
            return
        i = self._next
        if i == self._capacity:
            self.pool.extend([self.events(enable_timing=True) for _ in range(EVENTS_PER_CHUNK)])
            self._capacity += EVENTS_PER_CHUNK
        self.pool[i].record()
        self._next = i + 1

    def drain(self) -> list:
        """(name, tag, seconds) of the phases that ended since the last drain and whose end the
        device has reached (event.query(): no wait). The adaptive K schedule reads its step
        costs this way, at poll time."""
        out = []
        while self._drained + 1 < len(self.names):
            i = self._drained
            if self.events is None:
                seconds = self.stamps[i + 1] - self.stamps[i]
            else:
                if not self.pool[i + 1].query():
                    break
                seconds = self.pool[i].elapsed_time(self.pool[i + 1]) / 1000.0
            name, tag = self.names[i]
            if name is not None:
                out.append((name, tag, seconds))
            self._drained = i + 1
        return out

    def finish(self) -> None:
        """Totals of this call's marks (a timer serves one call at a time)."""
        self.totals = {}
        n = len(self.names)
        if self.events is not None and n:
            self.pool[n - 1].synchronize()
        for i in range(n - 1):
            name = self.names[i][0]
            if name is None:
                continue
            if self.events is None:
                seconds = self.stamps[i + 1] - self.stamps[i]
            else:
                seconds = self.pool[i].elapsed_time(self.pool[i + 1]) / 1000.0
            self.totals[name] = self.totals.get(name, 0.0) + seconds
        self.names, self.stamps, self._next, self._drained = [], [], 0, 0


class StatsRecorder:
    """Device-side counters filled by the engine, one record per append (three small ops)."""

    def __init__(self, k: int, device: torch.device):
        self.k = k
        self.hist = torch.zeros(k + 1, dtype=torch.long, device=device)  # row-iterations with j accepted
        self.first_tokens = torch.zeros((), dtype=torch.long, device=device)  # tokens of the prefill's first step
        # [2, K]: row-iterations that reached draft position i (row 0) and accepted it (row 1): the
        # acceptance per position whatever K each iteration ran (the adaptive schedule polls it).
        self.positions = torch.zeros(2, max(k, 1), dtype=torch.long, device=device)
        self._position_index = torch.arange(max(k, 1), device=device)[None, :]
        self.result = None

    def reset(self) -> None:
        """Zero the counters for a new call (in place: the verify graph writes them)."""
        self.hist.zero_()
        self.first_tokens.zero_()
        self.positions.zero_()
        self.result = None

    def record_first(self, count: torch.Tensor) -> None:
        """The prefill's first token per row (count [B])."""
        self.first_tokens.copy_(count.sum())

    def record(self, num_accepted: torch.Tensor, count: torch.Tensor) -> None:
        """num_accepted [B] int, count [B] tokens appended: rows that appended nothing (finished)
        are not counted. scatter_add_ on integers: deterministic, no host sync (F.one_hot would
        check its input range on the host)."""
        self.hist.scatter_add_(0, num_accepted.long(), (count > 0).long())

    def record_positions(self, num_accepted: torch.Tensor, count: torch.Tensor, k: int) -> None:
        """After an iteration of K = k drafts: position i < k was reached by a counted row when
        i <= j (j accepted), accepted when i < j. Two adds of [k] sums, no sync."""
        index = self._position_index[:, :k]
        j = num_accepted.long()[:, None]
        counted = (count > 0)[:, None]
        self.positions[0, :k] += ((index <= j) & counted).sum(0)
        self.positions[1, :k] += ((index < j) & counted).sum(0)

    def finish(self, wall_s: float, iterations: int, timer: PhaseTimer, gen_len: torch.Tensor, graphs=None,
               loop=None, schedule=None) -> None:
        hist = self.hist.cpu().tolist()
        first = int(self.first_tokens.cpu())
        new_tokens = int(gen_len.sum())
        self.result = GenerationStats(
            k=self.k, batch=int(gen_len.shape[0]), new_tokens=new_tokens, tokens_per_row=gen_len.tolist(),
            first_tokens=first, loop_tokens=new_tokens - first, iterations=iterations, wall_s=wall_s,
            accepted_hist=hist, draft_s=timer.totals.get("draft", 0.0), target_s=timer.totals.get("target", 0.0),
            capture_s=timer.totals.get("capture", 0.0), prefill_s=timer.totals.get("prefill", 0.0),
            graph_mode=(graphs or {}).get("mode", "eager"), graph_note=(graphs or {}).get("note"),
            graph_replays=dict((graphs or {}).get("replays", {})), graphs_captured=(graphs or {}).get("captured", 0),
            loop=dict(loop or {}),
        )
        if schedule is not None:  # an adaptive K: acceptance per position from the position counters
            self.result.position_counts = self.positions.cpu().tolist()
            self.result.schedule = schedule


@dataclass
class GenerationStats:
    k: int
    batch: int
    new_tokens: int  # generated tokens, all rows
    tokens_per_row: list
    first_tokens: int  # tokens from the prefill (one per row)
    loop_tokens: int  # tokens emitted by the iterations: first_tokens + loop_tokens == new_tokens
    iterations: int
    wall_s: float
    accepted_hist: list  # [K+1]: row-iterations in which j drafts were accepted
    draft_s: float
    target_s: float
    plain_tokens_per_s: float | None = None
    extra: dict = field(default_factory=dict)
    capture_s: float = 0.0  # the CUDA graph capture iteration (not in draft_s / target_s)
    graph_mode: str = "eager"  # "eager", "static" (graph code path run eagerly) or "cuda_graphs"
    graph_note: str | None = None  # why eager, when graphs were not requested explicitly
    graph_replays: dict = field(default_factory=dict)  # step name -> calls served by its graph
    prefill_s: float = 0.0  # the prefill and the first token (not in draft_s / target_s)
    # The loop's run-ahead (loop.py, run_ahead.py): run_ahead R, iterations_needed (the first
    # iteration after which every row had finished, as seen by the polls), polls, waits
    # (event.synchronize calls), max_ahead (most iterations issued beyond the last read poll).
    loop: dict = field(default_factory=dict)
    graphs_captured: int = 0  # CUDA graphs (or static twins) captured in this call: 0 when an engine reuses them
    # An adaptive K (engine/schedule.py): [reached, accepted] per draft position, and the
    # schedule's report (K chosen per iteration, the estimates it used, drafted steps).
    position_counts: list | None = None
    schedule: dict | None = None

    @property
    def capture_ms(self) -> float:
        return 1000.0 * self.capture_s

    @property
    def prefill_ms(self) -> float:
        return 1000.0 * self.prefill_s

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def host_s(self) -> float:
        """Wall time outside prefill, capture and the draft / target phases (see the module doc)."""
        return self.wall_s - self.prefill_s - self.capture_s - self.draft_s - self.target_s

    @property
    def host_ms_per_iter(self) -> float:
        return 1000.0 * self.host_s / self.iterations if self.iterations else float("nan")

    @property
    def row_iterations(self) -> int:
        return sum(self.accepted_hist)

    @property
    def mean_accepted_length(self) -> float:
        """Mean tokens emitted per row per iteration (accepted drafts + 1), before EOS/length cuts."""
        n = self.row_iterations
        return sum((j + 1) * c for j, c in enumerate(self.accepted_hist)) / n if n else float("nan")

    @property
    def mean_k(self) -> float:
        """Drafts per iteration: K, or the mean K an adaptive schedule chose."""
        if self.schedule is not None and self.iterations:
            return self.schedule["drafted_steps"] / self.iterations
        return float(self.k)

    @property
    def acceptance_per_position(self) -> list:
        """P(draft i accepted | drafts 0..i-1 accepted), i = 0..K-1."""
        if self.position_counts is not None:
            reached, accepted = self.position_counts
            return [a / r if r else float("nan") for r, a in zip(reached, accepted)]
        rates = []
        for i in range(self.k):
            reached = sum(self.accepted_hist[i:])
            accepted = sum(self.accepted_hist[i + 1 :])
            rates.append(accepted / reached if reached else float("nan"))
        return rates

    @property
    def alpha(self) -> float:
        if self.k == 0:
            return float("nan")
        if self.position_counts is not None:
            reached, accepted = (sum(row) for row in self.position_counts)
            return accepted / reached if reached else float("nan")
        accepted = sum(j * c for j, c in enumerate(self.accepted_hist))
        examined = sum(min(j + 1, self.k) * c for j, c in enumerate(self.accepted_hist))
        return accepted / examined if examined else float("nan")

    @property
    def cost_ratio(self) -> float:
        if self.k == 0 or self.iterations == 0 or self.target_s <= 0:
            return float("nan")
        return (self.draft_s / (self.iterations * self.mean_k)) / (self.target_s / self.iterations)

    @property
    def predicted_speedup(self) -> float:
        """Leviathan Theorem 3.8 from the measured alpha and c."""
        a, c, k = self.alpha, self.cost_ratio, self.mean_k
        if k == 0 or a != a or c != c:
            return float("nan")
        expected = k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
        return expected / (k * c + 1)

    @property
    def measured_speedup(self) -> float | None:
        if not self.plain_tokens_per_s:
            return None
        return self.tokens_per_s / self.plain_tokens_per_s

    def as_dict(self) -> dict:
        keys = ("k", "batch", "new_tokens", "iterations", "wall_s", "accepted_hist", "draft_s", "target_s", "capture_s",
                "prefill_s", "graph_mode", "graph_note", "graph_replays", "graphs_captured", "loop")
        out = {key: getattr(self, key) for key in keys}
        for key in ("tokens_per_s", "host_ms_per_iter", "mean_accepted_length", "acceptance_per_position", "alpha", "cost_ratio",
                    "predicted_speedup", "measured_speedup"):
            out[key] = getattr(self, key)
        return out

    def _loop_line(self) -> str:
        loop = self.loop
        if "iterations_needed" not in loop:
            return ""
        return (f"; needed {loop['iterations_needed']}, run-ahead bound R = {loop['run_ahead']}, "
                f"{loop['waits']} waits on {loop['polls']} polls")

    def format(self) -> str:
        lines = [
            f"generated tokens     {self.new_tokens} ({self.batch} row(s)) in {self.wall_s:.3f} s = {self.tokens_per_s:.1f} tokens/s",
            f"iterations           {self.iterations} ({self._k_text()})" + self._loop_line(),
            f"outside the phases   {self.host_ms_per_iter:.3f} ms per iteration (wall - prefill - capture - draft - target)",
        ]
        if self.k:
            per_pos = ", ".join("-" if r != r else f"{r:.2f}" for r in self.acceptance_per_position)  # -: never reached
            lines += [
                f"mean accepted length {self.mean_accepted_length:.2f} tokens per row-iteration",
                f"acceptance by draft position  [{per_pos}]",
                f"alpha                {self.alpha:.3f}",
                f"cost ratio c         {self.cost_ratio:.3f} (draft step / target step; draft {self.draft_s:.3f} s, target {self.target_s:.3f} s)",
                f"predicted speedup    {self.predicted_speedup:.2f}x (Leviathan Thm 3.8 from alpha and c)",
            ]
        if self.graph_mode == "eager":
            lines.append(f"execution            eager ({self.graph_note})" if self.graph_note else "execution            eager")
        else:
            replays = ", ".join(f"{name} {n}" for name, n in self.graph_replays.items())
            lines.append(f"execution            {self.graph_mode} (graph calls: {replays}; {self.graphs_captured} graph(s) "
                         f"captured in this call, {self.capture_s * 1000:.1f} ms)")
        if self.schedule is not None:
            s = self.schedule
            lines.append(f"K schedule           adaptive: chosen {s['chosen']} (iterations per K); estimates at the end: "
                         f"acceptance {s['acceptance']}, step ms {s['step_ms']}")
        if self.measured_speedup is not None:
            lines.append(f"measured speedup     {self.measured_speedup:.2f}x (vs plain decoding at {self.plain_tokens_per_s:.1f} tokens/s)")
        return "\n".join(lines)

    def _k_text(self) -> str:
        tree = self.extra.get("tree")
        if tree is not None:  # TreeStats.summary (engine/tree_loop.py): K is the tree's depth
            return f"a tree of {tree['tree']}"
        if self.schedule is None:
            return f"K = {self.k}"
        return f"K adaptive in {self.schedule['ks']}, mean {self.mean_k:.2f}"
