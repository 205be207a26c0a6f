"""What a tensor-parallel group does when one rank fails: one clear line on every rank, never a
hang (docs/architecture.md §10).

A collective that one rank never joins blocks the others. Three layers keep that from hanging:

1. Agreement (TensorParallelGroup.agree). Every call (engine construction, each generate())
   runs its checks on every rank, then all ranks join one small all-gather of (what the rank
   is about to run, or its error). If a rank failed, every rank raises -- the failing rank its
   own exception, the others TensorParallelError naming it -- and the group stays in step and
   usable: nothing after the agreement had started. The same all-gather catches ranks that
   disagree (another prompt, another seed, another world size or checkpoint).
2. A failure mid-call (after the agreement: an exception in a step, an out-of-memory, a bug).
   The failing rank writes its line into the group's store (``FailureChannel.publish``), then
   closes the subgroup the runners talk through (TensorParallelGroup.close: this package made it
   and holds its only reference, so dropping it closes its sockets). A peer blocked in a
   collective on that subgroup then fails at once ("connection closed by peer"), reads the line
   and raises TensorParallelError with it, closing its own subgroup in turn, so ranks that
   were waiting on it unblock too. Measured on CPU / gloo (tests/distributed): 2 and 4 ranks,
   every rank ended with the failing rank's line well within the test's few-second bound,
   whether the failing process exits or stays alive. The group is unusable afterwards.
3. The group's timeout (TensorParallelGroup(timeout=); the CLI's --tp-timeout) bounds what
   neither catches: a rank that hangs without raising, a lost machine. The peers then raise
   TensorParallelError with the store's line if one was written, else the collective's error.

NCCL (not run: no multi-GPU machine here): closing a communicator on one rank does not stop a
peer's kernels that wait on it; those peers end at the group's timeout (the NCCL watchdog), and
the line in the store names the failing rank. Set a timeout on the group.
"""
import time

AGREED = "_specdec_tp_agreed"  # set on an exception every rank raised together (group still in step)
HANDLED = "_specdec_tp_handled"  # set once a guard has published / closed for this exception
POLL_S = 0.02


class TensorParallelError(RuntimeError):
    """A tensor-parallel call failed on another rank (the message names it and its error), the
    ranks disagreed on what to run, or the group was closed by an earlier failure."""


def first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else ""


def describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (one line)."""
    line = first_line(exc)
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def mark(exc: BaseException, flag: str) -> BaseException:
    try:
        setattr(exc, flag, True)
    except AttributeError:  # pragma: no cover - exceptions of C types without a __dict__
        pass
    return exc


class FailureChannel:
    """Failure lines of one group in its store, under ``prefix``: a counter and one key per failure
    (the first failure keeps key 1: later ones, often consequences, do not overwrite it)."""

    def __init__(self, store, prefix: str, rank: int, size: int):
        self.store, self.prefix, self.rank, self.size = store, prefix, rank, size

    def line(self, exc: BaseException) -> str:
        return f"rank {self.rank} of {self.size} failed: {describe(exc)}"

    def publish(self, exc: BaseException) -> None:
        """Writes this rank's failure line (never raises: the store may be gone too)."""
        if self.store is None:
            return
        try:
            n = self.store.add(f"{self.prefix}/failures", 1)
            self.store.set(f"{self.prefix}/failure/{n}", self.line(exc))
        except Exception:  # noqa: BLE001 - reporting must not mask the failure itself
            pass

    def first(self, wait_s: float) -> str | None:
        """The first failure line published in this group, waiting up to wait_s seconds for one
        (a peer's line is written before it closes the sockets whose closing we saw; the wait
        covers a peer that failed on its own collective first)."""
        if self.store is None:
            return None
        key = f"{self.prefix}/failure/1"
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if self.store.check([key]):
                    return self.store.get(key).decode("utf-8", "replace")
            except Exception:  # noqa: BLE001 - the store's host may have gone with the failing rank
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)
