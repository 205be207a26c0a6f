"""StepGraph: one decoding step captured as a CUDA graph and replayed, or its CPU-checkable twin
(capture=False: the same step run eagerly, its outputs copied into the same static buffers,
with every check that makes a capture valid).

A CUDA graph replays the kernels recorded at capture, on the tensor addresses and with the
Python scalars of that moment; Python does not run at replay. A step function is graph safe when
  (1) its tensor arguments are the same tensors at every call (static buffers: e.g. the draft
      graph's outputs fed to the verify graph);
  (2) every tensor it reads that outlives the call (state: lengths, KV cache, pending tokens,
      counters, weights) is updated in place, never rebound, and no state tensor appears
      after warm-up (a lazily built tensor would be filled only by the graph that built it);
  (3) its Python control flow, shapes and Python-scalar kernel arguments are the same at every
      call, and it never reads a device value on the host (.item(), nonzero: a sync, illegal
      in a capture).
  (4) the capture call launches no Triton kernel under a specialisation key that the warm-up did
      not launch: that launch would compile and load a module inside the capture, which
      invalidates it (triton specialises ints on == 1 / % 16 == 0 / i32-i64 range and pointers on
      16-byte alignment: triton_launches.py).
StepGraph checks (1), (2) and (4) in both modes (graph mode: at capture, the only time its Python
runs; argument addresses also at every replay: the captured tensor objects, still at their
captured address, shape and dtype, in a few Python operations; anything else gets the full
comparison by name, which names what changed) and, with capture=False, (3) by tracing the
torch ops of every call (TorchDispatchMode: op, shapes, dtypes, scalar arguments) and its Triton
launches (kernel, specialisation key, scalar arguments, grid) against the capture call's.

Garbage collection is off during a capture: the cyclic GC can free an earlier decoder's CUDA
graph (or a Triton module) at any allocation, and destroying a graph inside another capture is
illegal (CUDAGraph::reset warns "operation not permitted when stream is capturing" and the capture
is invalidated). That is what the H100 run showed: those warnings, then "operation failed due to a
previous error during capture" at the next launch (bench_e2e capturing the draft step of a later
decoder; each decoder and its StepGraphs form a reference cycle, freed only by the cyclic GC).
torch.cuda.graph stopped collecting before a capture (pytorch PRs 158193 / 158649; PR 161037
describes this failure) and torch 2.11 / 2.13 do not pause the collector during one.

Warm-up: the first ``warmup`` calls run eagerly (real steps; on a side stream in graph mode, the
stream the capture then uses, as torch's CUDA graph notes advise) so that Triton compiles,
cuBLAS workspaces and lazily built tensors exist before the capture. The capture call records
the step, then replays it once (capture itself runs nothing on the GPU).
"""
import contextlib
import gc
from collections import deque

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .triton_launches import TritonLaunches, UncompiledLaunchError

# Ops that read device values on the host or have data-dependent output shapes.
SYNC_OPS = ("aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.masked_select", "aten.unique",
            "aten._unique", "aten.repeat_interleave.Tensor", "aten.equal", "aten.is_nonzero")


# Plain values, by exact type: _describe keeps them as they are (an int subclass takes its slower
# path) and state_tensors never enters them.
_PLAIN_TYPES = frozenset({bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format})


class GraphSafetyError(RuntimeError):
    """A step broke a graph-safety rule (rebinding, non-static argument, iteration-dependent ops, a sync)."""


def state_tensors(roots: dict, packages=("specdec_fast",)) -> dict:
    """name -> tensor for every tensor reachable from ``roots`` (name -> object) through lists,
    tuples, dicts and the attributes of the roots and of objects whose class is defined in
    ``packages``. StepGraph objects and other foreign objects (transformers modules, streamers)
    are not entered."""
    found, seen = {}, set()
    queue = deque(roots.items())  # breadth first: each tensor is named by its shortest path
    root_ids = {id(obj) for obj in roots.values()}
    leaf = _PLAIN_TYPES  # never entered: not queued, their names never formatted (walked at every twin call)
    while queue:
        name, obj = queue.popleft()
        if isinstance(obj, torch.Tensor):
            found.setdefault(name, obj)
            continue
        if id(obj) in seen or isinstance(obj, StepGraph):
            continue
        if isinstance(obj, (list, tuple)):
            children = [(f"{name}[{i}]", item) for i, item in enumerate(obj) if type(item) not in leaf]
        elif isinstance(obj, dict):
            children = [(f"{name}[{key!r}]", item) for key, item in obj.items() if type(item) not in leaf]
        elif hasattr(obj, "__dict__") and (id(obj) in root_ids or type(obj).__module__.startswith(packages)):
            children = [(f"{name}.{key}", item) for key, item in vars(obj).items() if type(item) not in leaf]
        else:
            continue
        seen.add(id(obj))
        queue.extend(children)
    return found


def addresses(tensors: dict) -> dict:
    """name -> (data_ptr, shape, dtype): what a captured kernel depends on."""
    return {name: (t.data_ptr(), tuple(t.shape), t.dtype) for name, t in tensors.items()}


def address_changes(before: dict, after: dict) -> list:
    """Human-readable differences between two ``addresses`` snapshots (empty when equal)."""
    changes = [f"{n} rebound" for n in before if n in after and after[n] != before[n]]
    changes += [f"{n} appeared" for n in after if n not in before]
    changes += [f"{n} disappeared" for n in before if n not in after]
    return changes


def _flatten(out) -> list:
    if out is None or isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [x for item in out for x in _flatten(item)]
    raise TypeError(f"a graphed step must return tensors, None or tuples of them, got {type(out).__name__}")


def _describe(value):
    """What a replay must repeat of one op argument: a tensor's shape, dtype and device type (not
    its values), a container's items described, a plain scalar as it is. Called for every argument
    of every op the static twin traces (~20 k ops a generate call of the test models): the common
    types first, by exact type."""
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    if kind is tuple or kind is list:
        return tuple([_describe(v) for v in value])
    if isinstance(value, torch.Tensor):
        return ("tensor", value.shape, value.dtype, value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _describe(v)) for k, v in value.items())
    if isinstance(value, (torch.UntypedStorage, torch.TypedStorage)):  # the Triton interpreter's host copies
        return ("storage", value.nbytes())
    if isinstance(value, (bool, int, float, complex, str)):
        return value
    return type(value).__name__


class OpTrace(TorchDispatchMode):
    """Records (op, described args, described kwargs) for every torch op run inside it (op: the
    OpOverload itself, compared by identity; str(op) names it)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func, _describe(args), _describe(kwargs) if kwargs else ()))
        return func(*args, **(kwargs or {}))

    def sync_ops(self) -> list:
        names = {str(op) for op in {op for op, _, _ in self.ops}}  # each distinct op named once (every twin call)
        return sorted(name for name in names if name.startswith(SYNC_OPS))


def _op_text(entry) -> str:
    """One traced op for a message: its name and described arguments."""
    if entry is None:
        return "None (no op)"
    op, args, kwargs = entry
    return f"{op} {args}" + (f" {kwargs}" if kwargs else "")


@contextlib.contextmanager
def garbage_collection_paused():
    """Python's cyclic GC off inside (restored after): no finaliser of a dead graph or Triton
    module runs in the middle of a capture."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _launch_signature(launches) -> list:
    """What a replay repeats of each Triton launch: kernel, specialisation, scalar args, grid."""
    return [(launch.kernel, launch.key, launch.scalars(), launch.grid) for launch in launches]


class StepGraph:
    """fn(*args) -> tensors / None / tuples of them, run as a CUDA graph (capture=True) or as its
    static twin (capture=False). state() -> name -> tensor: the tensors that outlive a call.
    pool / stream: shared by the graphs of one decoder (captured and replayed in a fixed order)."""

    def __init__(self, fn, *, name: str, capture: bool, state, warmup: int = 1, pool=None, stream=None):
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
        self.fn, self.name, self.capture, self.state, self.warmup = fn, name, capture, state, warmup
        self.pool, self.stream = pool, stream
        if capture and stream is None:
            self.stream = torch.cuda.Stream()
        self.calls = self.replays = 0
        self.graph = None
        self._ready = False
        self._outputs = None
        self._arg_addresses = None
        self._static_args = None  # the capture call's arguments when each is a tensor or None (replay fast path)
        self._static_count = 0
        self._static_keys = None  # their (data_ptr, shape, dtype) at capture (None for None)
        self._trace = None
        self._warm_launches = []  # Triton launches of the warm-up calls
        self._launches = None  # those of the capture call

    @property
    def ready(self) -> bool:
        """The capture call has been made (later calls replay)."""
        return self._ready

    def check_reuse(self) -> None:
        """A decoder reused by a later generate() call re-initialises its state in place; this
        checks, before the first replay of that call, that every state tensor is still the one
        captured (address, shape, dtype): a tensor rebound or allocated anew between calls
        would leave the graph reading the old memory. The whole state is walked once per call.
        Tensors that appeared since (another batch size's buffers) are not the graph's: ignored."""
        if not self._ready:
            return
        changes = [c for c in address_changes(self._captured_state, addresses(self.state())) if not c.endswith(" appeared")]
        if changes:
            raise GraphSafetyError(f"{self.name} step: between calls, state tensors that the captured graph reads moved: "
                                   f"{', '.join(changes[:8])}")

    @property
    def next_call_captures(self) -> bool:
        return not self._ready and self.calls >= self.warmup

    @property
    def outputs(self):
        """The static outputs (after the capture call), else None."""
        return self._outputs

    def __call__(self, *args):
        if self.calls < self.warmup:
            out = self._warm(args)
        elif not self._ready:
            out = self._first(args)
        else:
            out = self._again(args)
        self.calls += 1
        return out

    # -- the three kinds of call ---------------------------------------------------------------
    def _warm(self, args):
        with TritonLaunches() as launches:
            if not self.capture:
                out = self.fn(*args)
            else:
                main = torch.cuda.current_stream()
                self.stream.wait_stream(main)
                with torch.cuda.stream(self.stream):
                    out = self.fn(*args)
                main.wait_stream(self.stream)
        self._warm_launches.extend(launches.launches)
        return out

    def _launch_guard(self) -> TritonLaunches:
        """Records the capture call's Triton launches; with a warm-up, refuses one it did not launch."""
        expected = {(launch.kernel, launch.key) for launch in self._warm_launches} if self.warmup else None
        return TritonLaunches(expected=expected, known=self._warm_launches)

    def _first(self, args):
        self._arg_addresses = addresses(self._named_args(args))
        if all(a is None or isinstance(a, torch.Tensor) for a in args):
            self._static_args, self._static_count = args, len(args)
            self._static_keys = tuple(None if a is None else (a.data_ptr(), a.shape, a.dtype) for a in args)
        before = addresses(self.state())
        guard = self._launch_guard()
        if self.capture:
            self.graph = torch.cuda.CUDAGraph()
            try:
                with garbage_collection_paused(), guard:
                    with torch.cuda.graph(self.graph, pool=self.pool, stream=self.stream):
                        out = self.fn(*args)
            except Exception as exc:
                raise GraphSafetyError(f"CUDA graph capture of the {self.name} step failed ({exc}); "
                                       "decode with cuda_graphs=False") from exc
        else:
            try:
                with OpTrace() as trace, guard:
                    out = self.fn(*args)
            except UncompiledLaunchError as exc:
                raise GraphSafetyError(f"{self.name} step (capture call): {exc}") from exc
            self._trace = trace.ops
            self._check_syncs(trace)
        self._launches = guard.launches
        self._check_state(before, "capture")
        self._captured_state = before
        _flatten(out)  # type check
        self._outputs, self._ready = out, True
        if self.capture:
            self.graph.replay()
        self.replays += 1
        return out

    def _again(self, args):
        # Every replay: the captured argument objects, unmoved (a tensor's storage can be swapped
        # in place: set_, resize_), checked without a function call per argument beyond data_ptr
        # (the loop's host work, tests/engine/test_loop_host_work.py). Anything else: the full
        # comparison by name (it accepts other tensor objects at the captured addresses too).
        same = self._static_args is not None and len(args) == self._static_count
        if same:
            for arg, static, key in zip(args, self._static_args, self._static_keys):
                if arg is not static or (key is not None and (arg.data_ptr(), arg.shape, arg.dtype) != key):
                    same = False
                    break
        if not same:
            now = addresses(self._named_args(args))
            if now != self._arg_addresses:
                raise GraphSafetyError(f"{self.name} step: arguments are not the captured static tensors: "
                                       f"{address_changes(self._arg_addresses, now)}")
        if self.capture:
            self.graph.replay()
            self.replays += 1
            return self._outputs
        before = addresses(self.state())
        with OpTrace() as trace, TritonLaunches() as launches:
            out = self.fn(*args)
        self._check_syncs(trace)
        self._check_state(before, f"call {self.calls}")
        self._check_launches(launches.launches)
        if trace.ops != self._trace:
            now, captured = trace.ops + [None], self._trace + [None]
            diff = next(i for i, (a, b) in enumerate(zip(now, captured)) if a != b)
            raise GraphSafetyError(f"{self.name} step, call {self.calls}: the op sequence differs from the captured one "
                                   f"at op {diff}: {_op_text(now[diff])} vs {_op_text(captured[diff])}")
        self._copy_into_outputs(out)
        self.replays += 1
        return self._outputs

    # -- checks --------------------------------------------------------------------------------
    @staticmethod
    def _named_args(args) -> dict:
        return {f"arg{i}[{j}]": t for i, a in enumerate(args) for j, t in enumerate(_flatten(a)) if t is not None}

    def _check_state(self, before: dict, when: str) -> None:
        changes = address_changes(before, addresses(self.state()))
        if changes:
            raise GraphSafetyError(f"{self.name} step ({when}) changed state tensors that a graph replay would not "
                                   f"see: {', '.join(changes[:8])}")

    def _check_syncs(self, trace: OpTrace) -> None:
        syncs = trace.sync_ops()
        if syncs:
            raise GraphSafetyError(f"{self.name} step reads device values on the host ({', '.join(syncs)}): "
                                   "a sync, not capturable")

    def _check_launches(self, launches) -> None:
        """The static twin of rule (3) for Triton: a replay launches the captured kernels with the
        captured scalar arguments and grids; a call that passes others would be replayed wrong."""
        now, captured = _launch_signature(launches), _launch_signature(self._launches)
        if now == captured:
            return
        i = next(i for i, (a, b) in enumerate(zip(now + [None], captured + [None])) if a != b)
        if i >= min(len(now), len(captured)):
            raise GraphSafetyError(f"{self.name} step, call {self.calls}: {len(now)} Triton launches, "
                                   f"{len(captured)} in the captured call")
        (kernel, key, scalars, grid), (_, old_key, old_scalars, old_grid) = now[i], captured[i]
        changed = [f"{name} = {value!r} (captured: {old!r})" for (name, value), (_, old) in zip(scalars, old_scalars)
                   if value != old]
        if grid != old_grid:
            changed.append(f"grid {grid} (captured: {old_grid})")
        if key != old_key and not changed:
            changed.append("the specialisation key (tensor dtypes or alignment)")
        raise GraphSafetyError(f"{self.name} step, call {self.calls}: Triton launch {i} ({kernel}) differs from the "
                               f"captured one, a replay would repeat the captured values: {'; '.join(changed)}")

    def _copy_into_outputs(self, out) -> None:
        """The static twin of a replay: this call's outputs written into the captured buffers."""
        fresh, static = _flatten(out), _flatten(self._outputs)
        if len(fresh) != len(static):
            raise GraphSafetyError(f"{self.name} step returned {len(fresh)} outputs, {len(static)} at capture")
        for i, (new, old) in enumerate(zip(fresh, static)):
            if (new is None) != (old is None):
                raise GraphSafetyError(f"{self.name} step output {i} is None in one call only")
            if new is None:
                continue
            if new.shape != old.shape or new.dtype != old.dtype:
                raise GraphSafetyError(f"{self.name} step output {i} is {new.dtype} {tuple(new.shape)}, "
                                       f"{old.dtype} {tuple(old.shape)} at capture")
            old.copy_(new)
