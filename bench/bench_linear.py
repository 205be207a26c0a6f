"""CPU microbenchmark of the runners' matrix products: the C++ skinny_linear against torch's
F.linear, for the demo pair's shapes (target hidden 256 / intermediate 688 / vocab 4096, draft
hidden 128 / intermediate 256) at M = 1, 2, 5, 6, 8, 16 rows, weight as nn.Linear stores it
("rows": [N, K]) and as GPT-2's Conv1D does ("cols": the transpose of a contiguous [K, N]).

    python bench/bench_linear.py [--threads 1] [--repeats 9] [--cold] [--out FILE]

--cold: each call uses the next of several copies of the weight (> 64 MB in all), so weights
come from DRAM as in a whole model that does not fit the cache (hot: the same weight every call).

Each (shape, M, layout) times both ops round robin, --repeats rounds of a batch of calls; prints
the median per-call time (wall clock and the process's CPU time, which is steadier on a shared
machine) and writes JSON to --out when given. The results are checked against each other first.
"""
import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

# (name, K, N): the distinct projections of the demo pair
SHAPES = [("target q/o", 256, 256), ("target k/v", 256, 64), ("target gate/up", 256, 688),
          ("target down", 688, 256), ("target lm_head", 256, 4096),
          ("draft q/o", 128, 128), ("draft gate/up", 128, 256), ("draft down", 256, 128), ("draft lm_head", 128, 4096)]


def time_pair(fns: dict, repeats: int, budget_s: float = 0.02) -> dict:
    """Median seconds per call of each fn, wall and CPU, measured round robin."""
    for fn in fns.values():
        fn()
    start = time.perf_counter()
    fns[next(iter(fns))]()
    calls = max(5, int(budget_s / max(time.perf_counter() - start, 1e-7)))
    wall, cpu = {k: [] for k in fns}, {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(calls):
                fn()
            wall[name].append((time.perf_counter() - w0) / calls)
            cpu[name].append((time.process_time() - c0) / calls)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in fns}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--ms", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 5, 6, 8, 16])
    ap.add_argument("--cold", action="store_true", help="rotate through > 64 MB of weight copies")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specdec_fast.kernels._backend import cpp_op_available

    if not cpp_op_available("skinny_linear"):
        sys.exit("the C++ op skinny_linear did not build: nothing to compare")
    op = torch.ops.specdec_fast.skinny_linear
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"load average before: {os.getloadavg()}")
    print(f"{'shape':16s} {'K':>4s} {'N':>5s} {'M':>3s} {'layout':6s} {'torch us':>9s} {'cpp us':>8s} {'cpp/torch':>9s}"
          f"   (CPU time; wall in brackets)")
    for name, k, n in SHAPES:
        copies = max(2, (64 << 20) // (n * k * 4)) if args.cold else 1
        weights = {"rows": [torch.randn(n, k, generator=gen) for _ in range(copies)],
                   "cols": [torch.randn(k, n, generator=gen).t() for _ in range(copies)]}
        for m in args.ms:
            x = torch.randn(m, k, generator=gen)
            for layout, ws in weights.items():
                w = ws[0]
                torch.testing.assert_close(op(x, w, None, None), F.linear(x, w), rtol=1e-4, atol=1e-4)
                cycle = itertools.cycle(ws)
                t = time_pair({"torch": lambda: F.linear(x, next(cycle)), "cpp": lambda: op(x, next(cycle), None, None)},
                              args.repeats)
                (tw, tc), (cw, cc) = t["torch"], t["cpp"]
                rows.append(dict(shape=name, K=k, N=n, M=m, layout=layout, torch_us=tc * 1e6, cpp_us=cc * 1e6,
                                 torch_wall_us=tw * 1e6, cpp_wall_us=cw * 1e6))
                print(f"{name:16s} {k:4d} {n:5d} {m:3d} {layout:6s} {tc * 1e6:9.1f} {cc * 1e6:8.1f} {cc / tc:9.2f}"
                      f"   [{tw * 1e6:.1f} / {cw * 1e6:.1f}]", flush=True)
    print(f"load average after: {os.getloadavg()}")
    if args.out:
        from bench_e2e import environment

        Path(args.out).write_text(json.dumps(dict(environment=environment(torch.device("cpu")), settings=vars(args),
                                                  load_average_after=os.getloadavg(), results=rows), indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
