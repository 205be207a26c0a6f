"""The adaptive K schedule under tensor parallelism: every rank runs the K that rank 0 chose.

engine/schedule.py chooses each iteration's K from this process's own step times and from the polls
that have landed (engine/run_ahead.py): both differ between ranks, and ranks that ran different Ks
would issue different collectives (a hang, or gloo's size-mismatch abort). So rank 0's schedule
chooses, and every other rank takes rank 0's choice: rank 0 appends each iteration's K to one key of
the call in the group's store (the one its failure lines go through, failures.py), the others read
every K appended so far from it. At most one store round trip per iteration on each host (none on a
follower while rank 0 is ahead), while the device runs the iterations issued before it (the loop runs
ahead of the device: engine/run_ahead.py). A follower polls for its iteration's K (a store's timed
wait logs a warning each time it runs out) and looks at the group's
failure lines as it waits, so a rank 0 that failed ends its wait within a fraction of a second, as a
collective would; one that never writes, at the group's timeout. Rank 0 removes a call's key once
every rank has passed the call's closing agreement (engine/tensor_parallel.check_output): no rank
reads it after that; from a call that failed, on its way out (abandon).
"""
import time

from .failures import TensorParallelError

# A follower's polls for rank 0's key: 20 us, doubling up to 1 ms (rank 0's host is usually there first: its
# own choice is one step of host work); the failure lines looked at every 50 ms of waiting.
POLL_FIRST_S, POLL_LAST_S, FAILURE_LOOK_S = 20e-6, 1e-3, 0.05
DEFAULT_TIMEOUT_S = 1800.0  # a group made without a timeout: gloo's and NCCL's own default (30 min)


class LeaderK:
    """One call's Ks on one rank of ``group`` (a TensorParallelGroup); ``call``: a number every rank gives
    this call alike (the engine's count of calls)."""

    def __init__(self, group, call: int):
        self.store, self.failures = group.failures.store, group.failures
        self.key = f"{group.failures.prefix}/k/{call}"  # rank 0's Ks so far: "4,4,2,"
        self.leader = group.rank == 0
        timeout = getattr(group, "timeout", None)
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout is None else timeout.total_seconds()  # as its collectives'
        self.known = []  # the Ks of iterations 0 .. len - 1 (rank 0: written; the others: read)

    @staticmethod
    def available(group) -> bool:
        """Whether the group has a store to share the Ks through (torch versions without one: a constant K)."""
        return group.failures.store is not None

    def settle(self, iteration: int, k: int) -> int:
        """The K of ``iteration`` (0, 1, ... in order) on every rank: ``k`` (this rank's schedule's choice)
        on rank 0, which appends it to the call's key; rank 0's on the others, read from that key (every K
        rank 0 has appended so far at once: no round trip while rank 0 is ahead), waiting for it."""
        if self.leader:
            self.store.append(self.key, f"{int(k)},")
            self.known.append(int(k))
            return int(k)
        start = time.monotonic()
        delay, looked = POLL_FIRST_S, start
        while iteration >= len(self.known):
            if self.store.check([self.key]):  # polls: a store's timed wait logs a warning at each timeout
                self.known = [int(q) for q in self.store.get(self.key).decode().split(",")[:-1]]
                if iteration < len(self.known):
                    break
            now = time.monotonic()
            if now - looked > FAILURE_LOOK_S:
                looked = now
                line = self.failures.first(0.0)
                if line is not None:
                    raise TensorParallelError(f"the adaptive K schedule: tensor-parallel {line}")
            if now - start > self.timeout_s:
                raise TensorParallelError(f"the adaptive K schedule: rank 0's K of iteration {iteration} did not come "
                                          f"within {self.timeout_s:g} s (the group's timeout)")
            time.sleep(delay)
            delay = min(2 * delay, POLL_LAST_S)
        return self.known[iteration]

    def clear(self) -> None:
        """Rank 0: removes the call's key (after every rank passed the call's closing agreement)."""
        if self.leader and self.known:
            self.store.delete_key(self.key)
        self.known = []

    def abandon(self) -> None:
        """clear() for a call that failed, on the way out of it: every rank's call ends with the
        failure (a follower still waiting for a K ends at the failure line, key or no key), so rank 0
        removes the key at once. Best effort: the store may have gone with the failed group, and the
        call's own error is the one to raise."""
        try:
            self.clear()
        except Exception:  # noqa: BLE001 - see the docstring
            self.known = []
