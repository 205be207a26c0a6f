"""RunAheadPoller: how the host learns the device's progress without waiting, within a run-ahead
bound (docs/architecture.md §3).

Polls. After prefill (poll 0) and after every iteration n (poll n) the loop issues one poll: an
asynchronous copy of the persistent device status buffer, status [2, B] int64 (row 0: gen_len,
row 1: 1 while the row is unfinished; the verify step keeps it current in place), into slot
n % R of a preallocated pinned host ring of R slots, then the slot's preallocated event is recorded.
With a streamer, row 0 of the token buffer is copied beside it; with host-side stopping
criteria (stopping.py), every row of it. No tensor, event or pinned buffer
is allocated per poll: two host calls (copy_, record) per poll, three with a streamer.

Reading. Before the host issues iteration n + 1 it calls ``wait(n)``:
  - Run-ahead bound R: the host may be at most R iterations ahead of the newest poll it has
    read: iteration n + 1 may be issued once poll n + 1 - R has been read. If it has not, the
    host blocks on its event unless query() says it has completed (it is the oldest unread
    poll, and R iterations old): event.synchronize(), the only place the loop waits. Then every newer poll whose event has
    completed is read too (event.query(), no wait).
  - Polls are never dropped: they are read in order, each one (a queue, not a single pending
    poll that a newer poll replaces: that one was never read under CUDA graphs, whose host
    runs ahead of the GPU, so the H100 loop ran max_new_tokens - 1 iterations; see
    bench/results/h100_3dca4fa/). A slot is reused R polls later, by which time its poll has been
    read (the bound guarantees it; issue() checks).
  - A finished batch stops within R iterations: if every row has finished after iteration m,
    poll m is read before iteration m + R is issued, so at most R - 1 iterations run after the
    batch finished (the one iteration the GPU keeps queued at R = 2).
R = 2 is the default: the smallest bound that leaves the GPU one iteration queued while the host
waits for the one before it. R = 1 is synchronous: the host waits for iteration n before it
issues n + 1, so the GPU idles for the host's issue time every iteration.

Lockstep (``lockstep=True``: tensor parallelism, docs/architecture.md §10). Reading the newer
polls that happen to have completed makes the iteration at which the loop stops depend on
timing; ranks of a tensor-parallel group must stop at the same one (an extra iteration on one
rank is a collective the others never join). In lockstep, wait(n) reads exactly the polls up to
n + 1 - R (the bound's), so the stop is a function of the iterations alone: a finished batch
always runs R - 1 more iterations. Without events (CPU: every poll is complete when issued)
both modes read every poll: lockstep changes nothing there.

``events``: None (CPU: device work is synchronous, every poll is complete when issued) or an
event class like torch.cuda.Event (tests/fake_cuda.py has one whose work completes late).
"""
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Snapshot:
    """A read poll: taken after ``iteration`` iterations; gen_len [B] and seq [B', T] (the copied
    rows of the token buffer, or None) are numpy views of the ring slot, valid until the host
    issues its next poll."""

    iteration: int
    done: bool
    gen_len: np.ndarray
    seq: np.ndarray | None
    counters: np.ndarray | None = None  # the polled counters (RunAheadPoller's counters=), or None
    live: np.ndarray | None = None  # [B] 1 while a row is unfinished (status[1]), as of that poll


class RunAheadPoller:
    """Polls of ``status`` [2, B] int64 (and ``seq`` [B', T], rows of the token buffer, when given) through a ring of R
    pinned host slots; see the module docstring for the protocol. run_ahead: R >= 1. lockstep: read
    only the polls the bound requires (module docstring)."""

    def __init__(self, status: torch.Tensor, run_ahead: int, *, events=None, seq: torch.Tensor | None = None,
                 counters: torch.Tensor | None = None, lockstep: bool = False):
        if isinstance(run_ahead, bool) or not isinstance(run_ahead, int) or run_ahead < 1:
            raise ValueError(f"run_ahead must be an int >= 1, got {run_ahead!r}")
        self.run_ahead, self.status, self.seq, self.counters = run_ahead, status, seq, counters
        self._slots = slots = run_ahead
        pin = status.device.type == "cuda"
        ring = torch.empty((slots, *status.shape), dtype=status.dtype, device="cpu", pin_memory=pin)
        self._ring, self._ring_np = list(ring), ring.numpy()  # per-slot views, made once
        self._seq_ring = self._seq_ring_np = None
        if seq is not None:
            seq_ring = torch.empty((slots, *seq.shape), dtype=seq.dtype, device="cpu", pin_memory=pin)
            self._seq_ring, self._seq_ring_np = list(seq_ring), seq_ring.numpy()
        self._counter_ring = self._counter_ring_np = None
        if counters is not None:  # e.g. the acceptance per draft position (the adaptive K schedule reads it)
            counter_ring = torch.empty((slots, *counters.shape), dtype=counters.dtype, device="cpu", pin_memory=pin)
            self._counter_ring, self._counter_ring_np = list(counter_ring), counter_ring.numpy()
        self._events = None if events is None else [events() for _ in range(slots)]
        self._opportunistic = not lockstep or events is None  # read newer completed polls too
        self.reset()

    def reset(self) -> None:
        """Ready for a new loop (the ring and events are reused: a decoder keeps its poller)."""
        self.issued = -1  # newest poll issued
        self.read = -1  # newest poll read
        self.first_done = None  # first poll read that saw every row finished
        self.waits = self.queries = 0
        self.max_ahead = 0

    def issue(self, iteration: int) -> None:
        """Poll ``iteration`` (= iterations issued so far): copy the status into its slot."""
        if iteration != self.issued + 1:
            raise RuntimeError(f"poll {iteration} issued after poll {self.issued}: polls are issued once per iteration")
        slot = iteration % self._slots
        if iteration - self.read > self._slots:  # the bound keeps this from happening
            raise RuntimeError(f"poll {iteration} would overwrite unread poll {iteration - self._slots}")
        self._ring[slot].copy_(self.status, non_blocking=True)
        if self._seq_ring is not None:
            self._seq_ring[slot].copy_(self.seq, non_blocking=True)
        if self._counter_ring is not None:
            self._counter_ring[slot].copy_(self.counters, non_blocking=True)
        if self._events is not None:
            self._events[slot].record()
        self.issued = iteration

    def wait(self, issued: int) -> Snapshot | None:
        """Before iteration issued + 1: read the polls the bound requires (blocking on the oldest
        unread one if needed) and every newer completed one, in order. Returns the newest read
        poll (the first that saw the batch finished, if one did), or None when nothing new was read."""
        newest = None
        must_read = issued + 1 - self.run_ahead  # the newest read poll must be at least this one
        if self.read < must_read <= self.issued:
            if not self._complete(must_read):
                self._events[must_read % self._slots].synchronize()
                self.waits += 1
            while self.read < must_read:  # stream order: every poll up to must_read is complete
                newest = self._read_next()
                if newest.done:
                    return newest
        while self._opportunistic and self.read < self.issued and self._complete(self.read + 1):
            newest = self._read_next()
            if newest.done:
                return newest
        if issued + 1 - self.read > self.max_ahead:
            self.max_ahead = issued + 1 - self.read
        return newest

    def finish(self) -> None:
        """After the loop and a device sync: read the remaining polls (for first_done)."""
        while self.first_done is None and self.read < self.issued:
            self._read_next()

    def report(self) -> dict:
        return dict(run_ahead=self.run_ahead, polls=self.issued + 1, waits=self.waits, queries=self.queries,
                    max_ahead=self.max_ahead)

    # -- internals --------------------------------------------------------------------------
    def _complete(self, poll: int) -> bool:
        if self._events is None:
            return True
        self.queries += 1
        return self._events[poll % self._slots].query()

    def _read_next(self) -> Snapshot:
        poll = self.read + 1
        slot = poll % self._slots
        values = self._ring_np[slot]
        done = 1 not in values[1]  # no live row (one C call; ndarray.any() costs three)
        if done and self.first_done is None:
            self.first_done = poll
        self.read = poll
        seq = None if self._seq_ring_np is None else self._seq_ring_np[slot]
        counters = None if self._counter_ring_np is None else self._counter_ring_np[slot]
        return Snapshot(poll, done, values[0], seq, counters, values[1])
