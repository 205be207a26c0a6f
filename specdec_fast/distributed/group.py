"""TensorParallelGroup: the ranks one sharded model runs over, and the only collectives its
runners call (docs/architecture.md §10).

Per forward of the Llama-family TP runner (runners/paged_llama_tp.py) over T token rows:
    all_reduce_   [T, H] in the model dtype: the vocab-parallel embedding, then o_proj and
                  down_proj of every layer (row-parallel: each rank's partial product)  -> 2L + 1
    gather_vocab  [T, V / N] -> [T, V]: the vocab-parallel lm_head's logits, once per scored
                  call, so every rank verifies (and samples from) the same full logits
Both are in place or return a fresh tensor, read nothing on the host and keep their shapes
static: capture-safe (torch captures NCCL collectives made with async_op=False; NOT run on a
multi-GPU machine here -- none was available; the CPU static twin, cuda_graphs="static", runs
them with gloo in the tests).

The group is a subgroup of the caller's process group made for this package (its members
alone make it, under a name its rank 0 draws: _subgroup), with the caller's backend and the
given timeout, and this object holds its only reference: closing it after a failure closes
its sockets, which is what unblocks the other ranks (failures.py). Calls that start work on
every rank run inside ``guard()`` and begin with ``agree()``.

Counters (bench/bench_tp.py): with ``trace`` set to a list, every collective appends
(name, bytes sent by this rank, seconds) -- seconds are wall time, meaningful where the
collective is synchronous (gloo on CPU).
"""
import contextlib
import time

import torch
import torch.distributed as dist

from .failures import AGREED, HANDLED, FailureChannel, TensorParallelError, describe, mark

FAILURE_WAIT_S = 1.0  # after a collective failed: how long to wait for the failing rank's line
# torch 2.13 renamed all_gather_into_tensor (deprecated, with a warning per call) to all_gather_single.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class TensorParallelGroup:
    """process_group: a torch.distributed ProcessGroup (None: the default group). timeout: the
    subgroup's collective timeout (datetime.timedelta; None: torch's default for the backend).
    size / rank: the group's; device: where collective tensors live (the current CUDA device for
    NCCL, the CPU for gloo)."""

    def __init__(self, process_group=None, *, timeout=None):
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("process_group=... needs torch.distributed initialised (torch.distributed."
                             "init_process_group, or run under torchrun)")
        base = dist.group.WORLD if process_group is None else process_group
        self.ranks = list(dist.get_process_group_ranks(base))
        self.size, self.rank = len(self.ranks), dist.get_rank(base)
        self.backend = str(dist.get_backend(base))
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        self.timeout = timeout  # the collectives' (None: the backend's default); LeaderK waits as long
        self._pg = _subgroup(base, self.ranks, self.backend, timeout)
        self.failures = FailureChannel(_store_of(self._pg), f"specdec_fast/tp/{self._pg.group_name}", self.rank,
                                       self.size)
        self.closed = None  # why the group was closed (a failure line), else None
        self.trace = None  # a list: every collective appends (name, bytes, seconds)

    def __repr__(self) -> str:
        state = f"closed: {self.closed}" if self.closed else self.backend
        return f"TensorParallelGroup(rank {self.rank} of {self.size}, {state})"

    # -- the collectives of a forward -----------------------------------------------------
    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """tensor (any shape) <- its sum over the ranks, in place; returns it."""
        self._run("all_reduce", tensor.numel() * tensor.element_size(), dist.all_reduce, tensor, group=self._pg)
        return tensor

    def gather_vocab(self, local: torch.Tensor) -> torch.Tensor:
        """local [..., V / N] (this rank's vocabulary slice, rank r holding [r V/N, (r+1) V/N))
        -> [..., V], the same tensor on every rank (one all-gather, then one copy that puts the
        slices side by side)."""
        lead, part = local.shape[:-1], local.shape[-1]
        flat = local.reshape(-1, part).contiguous()
        out = torch.empty((self.size * flat.shape[0], part), dtype=local.dtype, device=local.device)
        self._run("all_gather", flat.numel() * flat.element_size(), _ALL_GATHER, out, flat, group=self._pg)
        return out.view(self.size, flat.shape[0], part).permute(1, 0, 2).reshape(*lead, self.size * part)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """tensor [...] of every rank -> [N, ...] in rank order (e.g. per-row statistics)."""
        flat = tensor.reshape(1, -1).contiguous()
        out = torch.empty((self.size, flat.shape[1]), dtype=flat.dtype, device=flat.device)
        self._run("all_gather", flat.numel() * flat.element_size(), _ALL_GATHER, out, flat, group=self._pg)
        return out.view(self.size, *tensor.shape)

    def _run(self, name: str, nbytes: int, op, *args, **kwargs) -> None:
        self._check_open()
        start = time.perf_counter() if self.trace is not None else 0.0
        failure = None
        try:
            op(*args, **kwargs)
        except RuntimeError as exc:  # a peer went away, or the timeout: read its line below
            failure = describe(exc)  # (outside the except block: no traceback keeps the group alive)
        if failure is not None:
            raise self._peer_failure(failure)
        if self.trace is not None:
            self.trace.append((name, nbytes, time.perf_counter() - start))

    def _peer_failure(self, collective_error: str) -> TensorParallelError:
        line = self.failures.first(FAILURE_WAIT_S)
        if line is not None:
            return TensorParallelError(f"tensor-parallel {line} (seen on rank {self.rank})")
        return TensorParallelError(f"tensor-parallel rank {self.rank} of {self.size}: a collective failed and no rank "
                                   f"reported why: {collective_error}")

    # -- calls: agreement and failures ----------------------------------------------------------
    def agree(self, what: str, facts: dict, error: BaseException | None = None, *, uncompared=()) -> list:
        """Every rank gives ``facts`` (name -> value: what it is about to run) or the ``error`` its
        checks raised; returns every rank's facts (rank order) when all agree (the names in
        ``uncompared`` may differ: e.g. each rank's own random draw, of which rank 0's is used).
        Else raises on every rank: ``error`` itself on a rank that failed, TensorParallelError
        naming the first failing rank (or the first fact that differs) on the others; the group
        stays in step. ``what`` names the call in the message."""
        line = None if error is None else self.failures.line(error)
        gathered = self._gather_objects((None if error is not None else facts, line))
        failed = [entry[1] for entry in gathered if entry[1] is not None]
        if error is not None:
            raise mark(error, AGREED)
        if failed:
            raise mark(TensorParallelError(f"{what}: tensor-parallel {failed[0]}"), AGREED)
        for name in facts:
            values = [entry[0].get(name) for entry in gathered]
            if name not in uncompared and any(v != values[0] for v in values):
                shown = ", ".join(f"rank {r} has {v!r}" for r, v in enumerate(values))
                raise mark(TensorParallelError(f"{what}: the ranks disagree on {name}: {shown}"), AGREED)
        return [entry[0] for entry in gathered]

    def all_min(self, what: str, value: int) -> int:
        """The smallest of every rank's ``value`` (e.g. the KV blocks each rank's memory allows)."""
        return min(facts["value"] for facts in self.agree(what, {"value": int(value)}, uncompared=("value",)))

    def _gather_objects(self, payload) -> list:
        """Every rank's picklable ``payload``, in rank order (one all-gather; call boundaries only:
        with NCCL it copies through the device and syncs). Every agreement uses this one protocol,
        so ranks that reach different agreements (one failed before its first) still exchange
        their lines instead of misreading each other."""
        self._check_open()
        gathered = [None] * self.size
        failure = None
        try:
            dist.all_gather_object(gathered, payload, group=self._pg)
        except RuntimeError as exc:
            failure = describe(exc)
        if failure is not None:
            raise self._peer_failure(failure)
        return gathered

    @contextlib.contextmanager
    def guard(self):
        """Around a call that every rank makes: an exception that the ranks did not raise together
        (agree() marks those) is a failure mid-call: this rank's own is published, then the group
        is closed so that peers blocked in a collective unblock (failures.py)."""
        self._check_open()
        try:
            yield self
        except BaseException as exc:
            if not getattr(exc, AGREED, False) and not getattr(exc, HANDLED, False):
                mark(exc, HANDLED)
                if not isinstance(exc, TensorParallelError):
                    self.failures.publish(exc)
                self.close(describe(exc))
                if hasattr(exc, "add_note"):
                    exc.add_note(f"specdec_fast: rank {self.rank} closed its tensor-parallel group so that the other "
                                 "ranks stop too; build a new engine")
            raise

    def close(self, why: str) -> None:
        """Destroys the subgroup (idempotent): its sockets close, peers blocked on them fail."""
        pg, self._pg = self._pg, None
        self.closed = self.closed or why
        if pg is None:
            return
        try:
            if self.backend == "nccl" and hasattr(pg, "abort"):
                pg.abort()
            dist.destroy_process_group(pg)
        except Exception:  # noqa: BLE001 - closing after a failure must not raise a second error
            pass
        del pg

    @property
    def usable(self) -> bool:
        return self._pg is not None

    def _check_open(self) -> None:
        if self._pg is None:
            raise TensorParallelError(f"this tensor-parallel group was closed after a failure ({self.closed}); "
                                      "build a new engine (and group)")


def _store_of(pg):
    """The store the failure lines go through: the group's own, or (torch 2.6 and before, whose
    ProcessGroup has no get_group_store) the default group's, which every rank shares too (the
    keys carry the group's name). None: failures are still raised, without the failing rank's line
    (tests/distributed: torch 2.6's peers said "no rank reported why" before this fallback)."""
    if hasattr(pg, "get_group_store"):
        return pg.get_group_store()
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - a private function: without it, no line
        return None


def _subgroup(base, ranks: list, backend: str, timeout):
    """A new group over ``ranks`` (base's, in its rank order) made by its members alone, named by
    a name that base's rank 0 draws and broadcasts. Why not new_group(ranks,
    use_local_synchronization=True): torch names that group by a hash of the ranks and of how many
    groups this process has made so far, which differs between ranks that made other groups (two
    engines on disjoint pairs of ranks, then one on all four): the members then wait for each
    other's keys in the store forever (seen in tests/distributed). torch's own helper takes the
    name; where it is missing (another torch), new_group(use_local_synchronization=True) serves."""
    import uuid

    c10d = dist.distributed_c10d
    names = [f"specdec_fast_tp_{uuid.uuid4().hex}" if dist.get_rank(base) == 0 else None]
    dist.broadcast_object_list(names, group=base, group_src=0)
    helper = getattr(c10d, "_new_process_group_helper", None)
    kind = dist.Backend(backend)
    if helper is None:  # pragma: no cover - torch versions without the helper
        kwargs = {} if timeout is None else {"timeout": timeout}
        return dist.new_group(ranks, backend=kind, use_local_synchronization=True, **kwargs)
    timeout = timeout if timeout is not None else c10d._get_default_timeout(kind)
    pg, _ = helper(len(ranks), ranks.index(dist.get_rank()), ranks, kind, c10d._get_default_store(), names[0],
                   timeout=timeout)
    c10d._world.pg_group_ranks[pg] = {rank: i for i, rank in enumerate(ranks)}
    return pg


def as_tp_group(process_group, *, timeout=None) -> TensorParallelGroup | None:
    """None -> None; a TensorParallelGroup -> itself; a ProcessGroup -> a new TensorParallelGroup."""
    if process_group is None or isinstance(process_group, TensorParallelGroup):
        return process_group
    return TensorParallelGroup(process_group, timeout=timeout)
