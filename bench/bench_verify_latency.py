"""The rungs launch side by side with the form it replaced (GPU), in one run: each selecting row's
rungs placed once by their own launch (rungs_launch, kernels/verify/_triton_select_rungs.py:
"now") against every streaming program of the row placing them ("rungs_per_program", the kernel
before 2026-11-27). Nsight Compute on an H200 read the B = 1 streaming launch at 34.2 us with
top_k = 50 and 41.6 us with top_p = 0.9 against 7.5 us at T = 1 (bench/results/h200_2026-11-27c):
63 programs a row, each placing the same rungs from a 1024-value sample.

Candidate defaults ride along, untimed so far: "rungs_sub256" (the rungs launch, 9.1 us at
B = 1 on the H200, comparing 256 sample values a step instead of 32: 4 dependent steps instead of
32; predicted 3-4 us) and "emit_block_v256" (the emission's block 256 instead of 1024: at B = 1,
501 programs of 2 values a thread instead of 126 of 8, where Nsight Compute read the emission at
6% occupancy and 9% of issue slots busy for 18.5 us: one warp a scheduler running ~2 k dependent
instructions a thread at ~6 cycles each, ~10 us a program. Predicted: a quarter of that chain and
four programs an SM, the emission ~8 us; the ~8 us between its programs' active cycles (18.8 k)
and the launch's elapsed ones (35.5 k) are not understood and may stay).
A third since 2026-11-27 (no GPU that session): "search_tile1024", the finishing launch's fused
threshold search (_triton_plan.FINISH_SEARCH_TILE = 1024: largest_key_fused, 8-way over a
1024-value tile where the interval fits, else 4-way over CAP). The finishing launch took 31.4 us
of the B = 1 top_k = 50 verify's 72.4 (H200), ~45 k of its 62 k cycles one program a row alone,
and the search is that program's loop: 11-12 steps of 362 instructions and 9 barriers a thread
(sm_90a, compiled here), against ~8 steps of 221 and 3 with the fused form on a top set.
Predicted: the B = 1 top_k finishing launch 31 -> ~20 us; top_p (intervals of 1.4-2.9 k values
on these logits: the full tile, 4-way) a few us at most; T = 1 unchanged (no finishing launch).

The first run (H200, commit 15f46cc) also timed the emission's ratio test in one tile against
the loop over positions: B = 1 T = 1 verify 28.0 against 28.4 us, B = 64 T = 1 290.9 against
254.9 us; the tile was not kept, and that comparison is gone from this script (the JSON of that
run holds its ways "ratio_loop" and "before").

For B in {1, 8, 64}, K = 4 with draft logits, V = 128256, modes T=1 / top_k=50 / top_p=0.9 /
min_p=0.05: chain_verify_triton (and sample_triton, the draft sampler) as CUDA graph replays
under do_bench (median us), each way, and whether each gives the torch reference's tokens.

    python bench/bench_verify_latency.py [--budget-s S] [--out bench/results/verify_latency_<device>.json]
    python bench/bench_verify_latency.py --smoke [--out F]   # a tiny shape through the CPU interpreter
        (not a measurement; JSON only with --out: tests/test_bench_verify_latency.py)
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import versions, write_result  # noqa: E402
from gpu_timing import RowBudget  # noqa: E402
from verify_gpu_table import _time, make_logits  # noqa: E402

from specdec_fast.kernels import make_sampling_tensors  # noqa: E402
from specdec_fast.kernels.verify import chain_verify_reference, sample_reference  # noqa: E402

MODES = {"T=1": {}, "top_k=50": dict(top_k=50), "top_p=0.9": dict(top_p=0.9), "min_p=0.05": dict(min_p=0.05)}
SHAPES = [(1, 4, 128256), (8, 4, 128256), (64, 4, 128256)]
# "now": the defaults. Candidates, untimed (each flips a default only where a GPU shows it faster):
# the rungs launch comparing 256 sample values a step instead of 32 (_triton_plan.RUNGS_SAMPLE_SUB);
# the emission in blocks of 256 (more programs at small batch: 501 a row instead of 126 at B = 1);
# the finishing launch's fused search with a 1024-value tile (_triton_plan.FINISH_SEARCH_TILE).
WAYS = {"now": {}, "rungs_per_program": dict(rungs_launch=False), "rungs_sub256": dict(rungs_sub=256),
        "emit_block_v256": dict(emit_block_v=256), "search_tile1024": dict(finish_search_tile=1024)}
SMOKE_MODES = ("top_p=0.9",)  # the interpreter pays seconds a call: one mode with rungs


def main(argv=None) -> dict:
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--smoke", action="store_true", help="tiny shape through the interpreter (set TRITON_INTERPRET=1)")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="no new row after this many seconds")
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --smoke)")
    device = torch.device("cpu" if args.smoke else "cuda")
    # the smoke shape: the large-vocabulary path with several chunks a row
    ov = dict(cap=128, num_chunks=4, block_v=64) if args.smoke else {}
    rows, budget = [], RowBudget(args.budget_s)
    for batch, k, vocab in [(2, 2, 600)] if args.smoke else SHAPES:
        target, draft, drafts = make_logits(batch, k, vocab, "random", device,
                                            torch.float32 if args.smoke else torch.bfloat16)
        logits = target[:, 0].contiguous()
        positions = torch.zeros(batch, dtype=torch.int64, device=device)
        for mode, kw in MODES.items():
            if args.smoke and mode not in SMOKE_MODES:
                continue
            if not budget.allows(f"B={batch} K={k} V={vocab} {mode}"):
                continue
            params = make_sampling_tensors(batch, device, seed=1, **kw)
            expected = chain_verify_reference(target, draft, drafts, params)
            expected_sample = sample_reference(logits, params, positions, 2)
            row = dict(B=batch, K=k, V=vocab, mode=mode)
            for name, flags in WAYS.items():
                way = dict(ov, **flags)
                t0 = time.perf_counter()
                got = chain_verify_triton(target, draft, drafts, params, **way)
                t1 = time.perf_counter()
                got_sample = sample_triton(logits, params, positions, 2, **way)
                t2 = time.perf_counter()
                row[f"tokens_equal_reference_{name}"] = bool(torch.equal(got[0], expected[0])
                                                             and torch.equal(got[1], expected[1])
                                                             and torch.equal(got_sample, expected_sample))
                if args.smoke:  # the interpreter: the checked calls' wall clock (seconds a call), nothing more
                    row[f"verify_{name}_us"], row[f"sample_{name}_us"] = (t1 - t0) * 1e6, (t2 - t1) * 1e6
                    continue
                row[f"verify_{name}_us"] = _time(lambda: chain_verify_triton(target, draft, drafts, params, **way),
                                                 False)["median_us"]
                row[f"sample_{name}_us"] = _time(lambda: sample_triton(logits, params, positions, 2, **way),
                                                 False)["median_us"]
            row["verify_now_over_rungs_per_program"] = row["verify_now_us"] / row["verify_rungs_per_program_us"]
            row["sample_now_over_rungs_per_program"] = row["sample_now_us"] / row["sample_rungs_per_program_us"]
            rows.append(row)
            ok = all(row[f"tokens_equal_reference_{name}"] for name in WAYS)
            parts = " | ".join(f"{name} {row[f'verify_{name}_us']:.1f} / {row[f'sample_{name}_us']:.1f}" for name in WAYS)
            print(f"B={batch} V={vocab} {mode} verify / sample us: {parts}{'' if ok else ' WRONG TOKENS'}", flush=True)
    if args.smoke and not args.out:
        print("smoke run: not a measurement; nothing written")
        return dict(rows=rows)
    name = "cpu (smoke: interpreter, not a measurement)" if args.smoke else torch.cuda.get_device_name(device)
    timer = "wall clock of the checked call (smoke)" if args.smoke else "CUDA graph replay under triton.testing.do_bench: median (us)"
    result = dict(device=name, versions=versions(), timer=timer, not_run=budget.not_run, rows=rows)
    write_result(result, "verify_latency", name, args.out)
    return result


if __name__ == "__main__":
    main()
