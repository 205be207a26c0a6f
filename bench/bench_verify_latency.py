"""The verify step's candidate defaults side by side with the defaults (GPU), in one run ("now":
the defaults; each way a plan override of chain_verify_triton / sample_triton). None is timed
yet; each flips its default only where a GPU shows it faster (bench/issue25_report.py's levers):

  "rungs_sub256"     the rungs launch comparing 256 sample values a step instead of 32
                     (_triton_plan.RUNGS_SAMPLE_SUB): it took 9.1 us at B = 1 on an H200, 32
                     dependent steps; 4 with 256. Predicted 3-4 us.
  "emit_block_v256"  the emission in blocks of 256 instead of 1024: at B = 1, 501 programs of 2
                     values a thread instead of 126 of 8, where Nsight Compute read the emission at
                     6% occupancy and 9% of issue slots busy for 18.5 us: one warp a scheduler
                     running ~2 k dependent instructions a thread at ~6 cycles each, ~10 us a
                     program. Predicted: a quarter of that chain and four programs an SM, the
                     emission ~8 us; the ~8 us between its programs' active cycles (18.8 k) and the
                     launch's elapsed ones (35.5 k) are not understood and may stay.
  "search_tile1024"  the finishing launch's fused threshold search (_triton_plan.FINISH_SEARCH_TILE =
  "search_tile2048"  1024 / 2048: largest_key_fused, 8-way over a tile of that many values where the
                     interval fits, else 4-way over CAP). The finishing launch took 31.4 us of the
                     B = 1 top_k = 50 verify's 72.4 (H200), ~45 k of its 62 k cycles one program a
                     row alone, and the search is that program's loop: 11-12 steps of 362
                     instructions and 9 barriers a thread (sm_90a, compiled here). Fused, per step:
                     counts 221 (1024) / 309 (2048) instructions, probabilities 412 / 556, the full
                     tile 243 / 422, each with 3 barriers, ~7 steps 8-way, ~10-11 4-way. On these
                     logits a top_k = 50 set holds ~100-950 values (both tiles), a top_p = 0.9
                     interval ~1.4-2.9 k (the full tile with 1024, mostly the 2048 tile with 2048).
                     Predicted: the B = 1 top_k finishing launch 31 -> ~20 us with either; top_p a
                     few us at most, more with 2048; T = 1 unchanged (no finishing launch).

  "emit_skip_identities"  the emission skipping per value what is the identity for all of a
                     program's rows (_triton_plan.EMIT_SKIP_IDENTITIES: the division by T = 1, min-p's
                     test without min-p): the B = 64 pass's step compiles to 1903 instructions a
                     thread on that path against 2443 (sm_90a, here); Nsight Compute read that
                     emission at 169 us of the B = 64 T = 1 verify's 255, compute-bound. Predicted:
                     B = 64 T = 1 verify ~225 us (the emission 15-20% faster); B = 1 a few us at most.
  "emit_block_v256_skips"  both of the emission's candidates: at B = 1 a program's chain is its
                     values a thread times the instructions a value (~8 x ~300 today), and the two
                     cut the first by 4 and the second by ~20%. Predicted: the B = 1 emission
                     ~18.5 -> 8-10 us (what does not scale with values stays: the ratio test's
                     chain, the ticket and the last program's merge).

Measured before (H200, bench/results/h200_2026-11-27c, this script's earlier ways): the rungs
launch against every streaming program placing the rungs (kept: _triton_plan.py records the
figures), and the emission's ratio test in one tile against the loop over positions (B = 1 T = 1
verify 28.0 against 28.4 us, B = 64 T = 1 290.9 against 254.9 us; not kept).

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
from verify_gpu_table import _time, verify_cases  # noqa: E402

MODES = {"T=1": {}, "top_k=50": dict(top_k=50), "top_p=0.9": dict(top_p=0.9), "min_p=0.05": dict(min_p=0.05)}
SHAPES = [(1, 4, 128256), (8, 4, 128256), (64, 4, 128256)]
# "now": the defaults; the candidates of the module docstring.
WAYS = {"now": {}, "rungs_sub256": dict(rungs_sub=256), "emit_block_v256": dict(emit_block_v=256),
        "search_tile1024": dict(finish_search_tile=1024), "search_tile2048": dict(finish_search_tile=2048),
        "emit_skip_identities": dict(emit_skip_identities=True),
        "emit_block_v256_skips": dict(emit_block_v=256, emit_skip_identities=True)}
SMOKE_MODES = ("top_p=0.9",)  # the interpreter pays seconds a call: one mode with rungs


def _measure_way(row, name, way, smoke, case):
    """One way's verify and sampler on case (verify_gpu_table.VerifyCase) into row: whether both give
    the reference's tokens, and their graph-replay medians (smoke: the checked calls' wall clock, not
    a measurement)."""
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    def verify():
        return chain_verify_triton(case.target, case.draft, case.drafts, case.params, **way)

    def sample():
        return sample_triton(case.logits, case.params, case.positions, 2, **way)

    t0 = time.perf_counter()
    got = verify()
    t1 = time.perf_counter()
    got_sample = sample()
    t2 = time.perf_counter()
    row[f"tokens_equal_reference_{name}"] = case.same_tokens(got, got_sample)
    if smoke:  # the interpreter: the checked calls' wall clock (seconds a call), nothing more
        row[f"verify_{name}_us"], row[f"sample_{name}_us"] = (t1 - t0) * 1e6, (t2 - t1) * 1e6
        return
    row[f"verify_{name}_us"] = _time(verify, False)["median_us"]
    row[f"sample_{name}_us"] = _time(sample, False)["median_us"]


def main(argv=None) -> dict:
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
    cases = verify_cases([(2, 2, 600)] if args.smoke else SHAPES, MODES, device,
                         torch.float32 if args.smoke else torch.bfloat16, budget,
                         keep=lambda mode: not args.smoke or mode in SMOKE_MODES)
    for case in cases:
        row = dict(B=case.batch, K=case.k, V=case.vocab, mode=case.mode)
        for name, flags in WAYS.items():
            try:  # a way that fails (a compile error on the device, say) is a result: the others go on
                _measure_way(row, name, dict(ov, **flags), args.smoke, case)
            except Exception as error:  # noqa: BLE001
                row[f"error_{name}"] = f"{type(error).__name__}: {str(error)[:300]}"
                row[f"tokens_equal_reference_{name}"] = False
        measured = [name for name in WAYS if f"verify_{name}_us" in row]
        for name in measured:
            if name != "now" and "now" in measured:
                row[f"verify_{name}_over_now"] = row[f"verify_{name}_us"] / row["verify_now_us"]
                row[f"sample_{name}_over_now"] = row[f"sample_{name}_us"] / row["sample_now_us"]
        rows.append(row)
        ok = all(row[f"tokens_equal_reference_{name}"] for name in WAYS)
        parts = " | ".join(f"{name} {row[f'verify_{name}_us']:.1f} / {row[f'sample_{name}_us']:.1f}"
                           if name in measured else f"{name} FAILED" for name in WAYS)
        print(f"B={case.batch} V={case.vocab} {case.mode} verify / sample us: {parts}{'' if ok else ' WRONG TOKENS'}",
              flush=True)
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
