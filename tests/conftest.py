"""Shared test set-up: the one device every test builds its inputs on.

``device`` is "cuda" on a machine with a GPU, else "cpu". Without a GPU the Triton kernels run
through the interpreter: TRITON_INTERPRET=1 must be set before triton is first imported, so it
is set here, at collection start. The backends a kernel table runs are decided in one place,
tests/kernels/backends.py (triton on CUDA tensors on a GPU machine, interpreted on CPU
elsewhere; cpp only where the tensors are on the CPU).

Markers: ``gpu`` (needs CUDA: skipped elsewhere), ``cpu_only`` (only meaningful where the test
device is the CPU: skipped on a GPU machine; say why in the test).
"""
import copy
import os


def _share_the_cores_among_workers() -> None:
    """Under pytest-xdist, each worker's OpenMP team gets its share of the cores (OMP_NUM_THREADS,
    unless the caller set it), set before torch loads libgomp. Every worker at the default team
    (all cores) oversubscribes the machine, and libgomp's spin-then-sleep wait then costs a
    scheduler tick a parallel region (csrc/verify_args.h): on this 2-core box with -n 2,
    test_tree_verify_semantics.py took 77.9 s of wall clock with two threads a worker and 31.2 s
    with one (a torch-backend case: 6.9 s beside an interpreted test, 0.2 s alone)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // int(workers)))


_share_the_cores_among_workers()

import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.interpreter_speedup import install as _install_interpreter_speedup  # noqa: E402

_install_interpreter_speedup()  # helper calls skip Triton's redundant re-patching (its docstring)

import pytest  # noqa: E402

from tests.kernels.backends import TEST_DEVICE as DEVICE  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Skips by marker; on a GPU machine the ``gpu`` tests first (a stable sort: otherwise in
    collection order). A device session's suite runs under a time cap (bench/run_gpu.sh tests,
    which hands them to its workers a few at a time): the H200's of 2026-11-28 was cut at 400 s
    inside tests/kernels/test_verify_triton_gpu.py, tests that only a GPU runs, while the ones
    the CPU's CI runs anyway had all finished."""
    if HAS_CUDA:
        items.sort(key=lambda item: "gpu" not in item.keywords)
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_cpu_only = pytest.mark.skip(reason="only meaningful where the test device is the CPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "cpu_only" in item.keywords and HAS_CUDA:
            item.add_marker(skip_cpu_only)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def poisoned_empty(monkeypatch):
    """torch.empty returns memory filled with NaN (floating dtypes) or -7 (integer dtypes), so an
    output element no program writes shows: without it the caching allocator hands a call the block
    the previous call freed, often holding the right values (a verify control passed by that on an
    H200 while its stale tickets had stopped every write)."""
    real = torch.empty

    def empty(*args, **kwargs):
        out = real(*args, **kwargs)
        if out.is_floating_point():
            return out.fill_(float("nan"))
        return out if out.dtype == torch.bool or out.is_complex() else out.fill_(-7)

    monkeypatch.setattr(torch, "empty", empty)


def backend_device(backend: str, device: str) -> str:
    """Where a test that runs ``backend`` on models built on the CPU puts them: the test device for
    triton (CUDA on a GPU machine, whose compiled kernels take no CPU tensors; the interpreter's CPU
    elsewhere), the CPU for cpp (it takes no CUDA tensors) and for torch (where these tests always
    ran it)."""
    return device if backend == "triton" else "cpu"


def on_device(device, *objects):
    """Each tensor moved to ``device``; each module a copy on ``device`` (the module itself on the
    CPU, so session-cached CPU models stay where other tests expect them). One object: returned
    alone, else a tuple."""
    moved = []
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            obj = obj if torch.device(device).type == "cpu" else copy.deepcopy(obj).to(device)
        elif isinstance(obj, torch.Tensor):
            obj = obj.to(device)
        moved.append(obj)
    return moved[0] if len(moved) == 1 else tuple(moved)
