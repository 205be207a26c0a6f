"""Counting kernel launches on any device: torch ops that launch a kernel + Triton launches.

    with LaunchCounter() as counter:
        runner.score(tokens)
    counter.total, counter.torch_ops, counter.triton_launches, counter.by_name

A TorchDispatchMode sees every aten op (and the package's C++ ops) that reaches a backend
kernel; ops that only make a view or allocate without writing (view, slice, t, empty, ...)
launch nothing on a GPU and are not counted. Triton launches are counted through the launch
hook the graph checks use (specdec_fast/engine/triton_launches.py hook_launches); the torch ops
the interpreter itself runs inside a launch are not counted. Under the interpreter (CPU) this
counts the launches the same Python code makes on CUDA: the number that set the pace of an eager step
on the H100 (bench/results/h100_3dca4fa/step_profile.json: 1435 launches, 25 ms eager vs 8 ms of GPU work).
cuBLAS may add a split-K reduce kernel per GEMM on a GPU (160 of them in that profile): a CPU
count cannot see those (bench/profile_step.py measures them on the GPU).
"""
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdec_fast.engine.triton_launches import hook_launches

# ops that make a view / metadata / an uninitialised allocation: no kernel on a GPU
_NO_LAUNCH = {"empty", "empty_like", "empty_strided", "detach", "alias", "lift_fresh", "_unsafe_view",
              "_reshape_alias", "view", "reshape", "t", "transpose", "permute", "expand", "slice", "select", "split",
              "split_with_sizes", "unbind", "squeeze", "unsqueeze", "as_strided", "unfold", "narrow", "set_",
              "resize_", "sym_size", "sym_stride", "sym_numel", "is_same_size", "_local_scalar_dense"}


class LaunchCounter(TorchDispatchMode):
    """Counts kernel launches inside its ``with`` block (see the module doc). run_triton=False
    counts Triton launches without running them (their outputs stay unwritten): the count of a
    host-sync-free step does not depend on values, and interpreted launches cost ~0.1-1 s each."""

    def __init__(self, run_triton: bool = True):
        super().__init__()
        self.run_triton = run_triton
        self.by_name = Counter()
        self.syncs = 0  # .item() / .tolist() style reads (aten._local_scalar_dense)
        self._inside_triton = 0

    @property
    def triton_launches(self) -> int:
        return sum(n for name, n in self.by_name.items() if name.startswith("triton:"))

    @property
    def torch_ops(self) -> int:
        return sum(n for name, n in self.by_name.items() if not name.startswith("triton:"))

    @property
    def total(self) -> int:
        return sum(self.by_name.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._inside_triton:
            name = func.overloadpacket.__name__
            if name == "_local_scalar_dense":
                self.syncs += 1
            elif not (name in _NO_LAUNCH or func.is_view):
                self.by_name[f"{func.namespace}.{name}"] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._restore = hook_launches(self._count)
        return super().__enter__()

    def __exit__(self, *exc):
        self._restore()
        return super().__exit__(*exc)

    def _count(self, kernel, args, kwargs, grid, warmup, launch):
        fn = getattr(kernel, "fn", None)
        self.by_name[f"triton:{getattr(fn, '__name__', type(kernel).__name__)}"] += 1
        if not self.run_triton:
            return None
        self._inside_triton += 1
        try:
            return launch()
        finally:
            self._inside_triton -= 1


class NoTritonRun:
    """Inside its ``with`` block Triton launches return at once without running (nor counting):
    what remains of a step is its Python and torch work (cProfile of the host cost per layer)."""

    def __enter__(self):
        self._restore = hook_launches(lambda *_: None)
        return self

    def __exit__(self, *exc):
        self._restore()
        return False


def launches_per_layer(make_runner, tokens: torch.Tensor, layer_counts=(1, 3), run_triton: bool = False) -> dict:
    """Launches of one warm score(tokens) call for runners with different layer counts:
    {"per_layer": .., "per_step_outside_layers": .., "per_layer_by_name": {...}, "total": {layers: n}}.
    make_runner(num_layers) -> a runner already prefilled. run_triton: see LaunchCounter (the
    runner's Triton launches, prefill included, are only counted by default)."""
    low, high = layer_counts
    counts, names = {}, {}
    for layers in layer_counts:
        with LaunchCounter(run_triton=run_triton):  # set-up: not counted
            runner = make_runner(layers)
            runner.score(tokens)  # warm-up (lazy index tensors, first-call caches)
            runner.commit(torch.zeros(tokens.shape[0], dtype=torch.int32, device=tokens.device))
        with LaunchCounter(run_triton=run_triton) as counter:
            runner.score(tokens)
        counts[layers], names[layers] = counter.total, counter.by_name
    per_layer = (counts[high] - counts[low]) / (high - low)
    by_name = {name: (names[high][name] - names[low][name]) / (high - low)
               for name in set(names[high]) | set(names[low]) if names[high][name] != names[low][name]}
    return {"per_layer": per_layer, "per_step_outside_layers": counts[low] - low * per_layer,
            "per_layer_by_name": dict(sorted(by_name.items())), "total": counts}
