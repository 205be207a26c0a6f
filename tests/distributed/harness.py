"""Runs a worker function on N CPU ranks (gloo over a FileStore), each in its own spawned
process, and returns what each rank returned. A rank that raises returns {"error": line} (its
traceback goes to stderr, which pytest captures from the spawned processes too); a
rank that never reports within ``timeout`` seconds is killed and reported as "hung" (a test
that fails is better than a CI job that hangs)."""
import datetime
import os
import pickle
import tempfile
import time

import torch.multiprocessing as mp

TP_TIMEOUT = datetime.timedelta(seconds=30)  # the tensor-parallel groups' backstop (not gloo's 30 minutes)
WORLD_TIMEOUT = datetime.timedelta(seconds=120)  # the default group's: ranks wait at a barrier for phases of others


def _entry(rank: int, world: int, tmp: str, timeout: float, fn, args) -> None:
    import faulthandler

    import torch
    import torch.distributed as dist

    stacks = open(os.path.join(tmp, f"rank{rank}.stack"), "w")  # noqa: SIM115 - open until the process ends
    faulthandler.dump_traceback_later(max(1.0, timeout - 20.0), file=stacks)  # where a hung rank was

    from tests.interpreter_speedup import install

    install()  # a spawned rank does not load tests/conftest.py
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world, timeout=WORLD_TIMEOUT)
    try:
        result = fn(rank, world, *args)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        import traceback

        from specdec_fast.distributed.failures import describe

        traceback.print_exc()  # to the inherited stderr: pytest shows it with a failing test's output
        result = {"error": describe(exc)}
    with open(os.path.join(tmp, f"rank{rank}.tmp"), "wb") as f:
        pickle.dump(result, f)
    os.replace(os.path.join(tmp, f"rank{rank}.tmp"), os.path.join(tmp, f"rank{rank}.pkl"))
    os._exit(0)  # no teardown: a closed or half-broken group must not hang the exit


def run_ranks(fn, world: int, *args, timeout: float = 120.0) -> list:
    """[result of rank 0, ..., rank world-1]; fn(rank, world, *args) runs after the default group
    is initialised (gloo). fn and args must be picklable (module-level function)."""
    tmp = tempfile.mkdtemp(prefix="specdec_tp_")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_entry, args=(rank, world, tmp, timeout, fn, args), daemon=True) for rank in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    results = []
    for rank, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            p.join()
        path = os.path.join(tmp, f"rank{rank}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                results.append(pickle.load(f))
        else:
            with open(os.path.join(tmp, f"rank{rank}.stack")) as f:
                stack = [line.strip() for line in f.read().splitlines() if line.strip().startswith("File")][:6]
            results.append({"error": f"hung or died (exit code {p.exitcode}) after {timeout:.0f} s; "
                                     f"innermost frames: {stack}"})
    return results
