"""GPU timing helpers shared by the benchmarks: CUDA-graph replay timing, copy and read bandwidth, a
torch.profiler kernel census grouped by family (bench/profile_step.py, bench/bench_attention.py),
and the row budget that keeps a benchmark inside a device call (RowBudget)."""
import statistics
import time

import torch


def graph_timer(fn, reps: int = 200) -> float:
    """us per call of fn replayed in a CUDA graph (median of 5 rounds of reps replays)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rounds = []
    for _ in range(5):
        graph.replay()
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        rounds.append(1e3 * start.elapsed_time(end) / reps)
    return statistics.median(rounds)


def median_ms(fn, reps: int, sync=lambda: None, graphs: bool = False) -> float:
    """ms per call of fn: the median of reps synchronised calls after a warm-up, or (graphs) its CUDA-graph
    replay time (graph_timer)."""
    if graphs:
        return graph_timer(fn, reps=50) / 1e3
    fn()  # warm-up
    times = []
    for _ in range(reps):
        sync()
        begin = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - begin))
    return statistics.median(times)


class RowBudget:
    """A benchmark's --budget-s: no new row starts once budget_s seconds have passed since this was
    made (a device call's limit then keeps the rows measured); the rows left out are named in
    not_run (the report's "not_run") and printed as they are passed over."""

    def __init__(self, budget_s: float):
        self.budget_s, self.start, self.not_run = budget_s, time.perf_counter(), []

    def allows(self, row: str) -> bool:
        if time.perf_counter() - self.start <= self.budget_s:
            return True
        self.not_run.append(row)
        print(f"budget {self.budget_s} s reached: {row} not run", flush=True)
        return False


def copy_bandwidth(device, nbytes: int = 2 << 30) -> float:
    """Bytes read + written per second by a device-to-device copy of nbytes."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    us = graph_timer(lambda: dst.copy_(src), reps=20)
    return 2 * nbytes / (us * 1e-6)


def read_bandwidth(device, nbytes: int = 2 << 30) -> float:
    """Bytes read per second by a sum over nbytes of bf16 (fp32 result: 4 bytes written). The
    ceiling of a step that streams its weights and writes next to nothing. On an H200 the copy
    above (a graph replay) measured 2.71-2.77 TB/s, the sum 4.28 and cuBLAS's lm_head GEMV read
    4.42, so a copy-based ceiling put plain decoding at 119%; on the same machine a 1 GiB copy
    timed eagerly under do_bench measured 4.23 TB/s (bench/results/h200_2026-11-27)."""
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    out = torch.empty((), dtype=torch.float32, device=device)
    us = graph_timer(lambda: torch.sum(src, dim=0, dtype=torch.float32, out=out), reps=20)
    return nbytes / (us * 1e-6)


def hbm_ceiling_bandwidth(device) -> dict:
    """{"copy_Bps", "read_Bps", "ceiling_Bps", "basis"}: the two measured rates and the ceiling of
    a read-dominated step (the larger: bytes can be read at least as fast as either measured)."""
    copy, read = copy_bandwidth(device), read_bandwidth(device)
    return {"copy_Bps": copy, "read_Bps": read, "ceiling_Bps": max(copy, read),
            "basis": "read (sum)" if read >= copy else "copy (read + written)"}


TRITON_KERNELS = ("_add_rms_norm_kernel", "_silu_mul_kernel", "_rope_append_kv_kernel", "_paged_attn_split",
                  "_merge_splits", "_append_kv_kernel", "_skinny_linear_kernel")


def kernel_family(name: str) -> str:
    if name in TRITON_KERNELS:
        return f"triton:{name}"
    if "splitKreduce" in name:
        return "cublas split-K reduce"
    if any(key in name.lower() for key in ("gemm", "gemv", "nvjet", "xmma", "cutlass", "sm90_", "sm80_")):
        return "gemm/gemv"
    for key, family in (("elementwise", "torch elementwise"), ("reduce_kernel", "torch reduce"),
                        ("CatArrayBatchedCopy", "torch cat"), ("index", "torch index"), ("Memcpy", "memcpy"),
                        ("Memset", "memset"), ("embedding", "torch embedding")):
        if key in name:
            return family
    return f"other: {name[:60]}"


def profile_kernels(fn, iters: int = 5) -> dict:
    """torch.profiler over ``iters`` calls of fn: kernels per call by family, GPU busy vs wall."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / iters
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    families = {}
    for e in kernels:
        count, us = families.get(kernel_family(e.name), (0, 0.0))
        families[kernel_family(e.name)] = (count + 1, us + e.time_range.elapsed_us())
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, last = 0.0, float("-inf")
    for lo, hi in spans:  # union of the kernels' intervals
        if hi > last:
            busy += hi - max(lo, last)
            last = hi
    rows = sorted(([name, c / iters, us / iters] for name, (c, us) in families.items()), key=lambda r: -r[2])
    return {"kernels_per_call": len(kernels) / iters, "gpu_busy_ms": busy / iters / 1e3, "wall_ms": 1e3 * wall,
            "families_count_us": rows}
