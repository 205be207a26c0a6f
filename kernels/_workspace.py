"""A caller-owned workspace for Triton launches that count across programs: the verify / sample /
tree_verify kernels and attention's in-kernel split merge. Their integer counters live in a
buffer that stays zero between calls, so a call needs no zero fill (one graph node fewer: the
greedy verify is ONE launch, T = 1 sampling two; tree_verify two nodes fewer; a split
attention one launch instead of two).

Why it stays zero: every counter is put back to zero by its last user in the same launch --
tickets by the program that takes the last one (kernels/_triton_sync.py: last_program_of /
last_rows_of), a selecting row's candidate counters by its finishing program
(verify/_triton_select_finish.py) -- so a launch that starts with zeros ends with zeros. The
paths diagnostics are written, not counted: they live in a separate scratch buffer and are not
returned (return_paths needs the per-call fill).

One workspace serves one sequence of calls on one stream (a decoder's verify step, a drafter's
sample): two calls in flight at once on different streams would share counters. Buffers are
allocated (zero filled) the first time a size is asked for, then reused: the first call of a
shape pays the fill, later calls and CUDA-graph replays do not (the engine's graphs are captured
after an eager warm-up, so capture finds the buffers allocated). A call that raises between its
launches discards the buffers (a launch that ran may have left a counter for a later one).
"""
import torch


class KernelWorkspace:
    """counters(n) -> int32 [n] zeros (persistent), scratch(n) -> int32 [n] (persistent, any values),
    zeros(n) -> int32 [n] zeros that no kernel writes (tree_verify's dummy drafts)."""

    def __init__(self):
        self._counters: dict[tuple, torch.Tensor] = {}
        self._scratch: dict[tuple, torch.Tensor] = {}
        self._zeros: dict[tuple, torch.Tensor] = {}

    @staticmethod
    def _get(store: dict, n: int, device: torch.device, zero: bool) -> torch.Tensor:
        key = (device, n)
        buf = store.get(key)
        if buf is None:
            buf = (torch.zeros if zero else torch.empty)((n,), dtype=torch.int32, device=device)
            store[key] = buf
        return buf

    def counters(self, n: int, device: torch.device) -> torch.Tensor:
        """int32 [n] on device, zero at every call's start (the kernels leave it zero)."""
        return self._get(self._counters, n, device, True)

    def scratch(self, n: int, device: torch.device) -> torch.Tensor:
        """int32 [n] on device that the kernels may write (diagnostics nobody reads)."""
        return self._get(self._scratch, n, device, False)

    def zeros(self, n: int, device: torch.device) -> torch.Tensor:
        """int32 [n] zeros on device that kernels only read (apart from the counters: a launch's
        tickets must never alias its inputs)."""
        return self._get(self._zeros, n, device, True)

    def discard(self) -> None:
        """Forget every buffer (the next call allocates zeroed ones): after a call that raised
        between its launches (a compile error in a later kernel), counters may be left nonzero."""
        self._counters.clear()
        self._scratch.clear()
        self._zeros.clear()

    def all_zero(self) -> bool:
        """Whether every counter (and read-only zeros) buffer is zero (a test's check; reads the device)."""
        return all(not bool(buf.any()) for store in (self._counters, self._zeros) for buf in store.values())
