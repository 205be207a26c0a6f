"""The verify step's off-or-on levers side by side with the defaults (GPU), in one run ("now": the
defaults; each way a plan override of chain_verify_triton / sample_triton that flips one lever, so
that every GPU run re-checks the defaults' choice; bench/issue25_report.py reads each as "the lever
on over the lever off"):

  "search_tile"           the finishing launch's threshold search: the fused search over a 1024-value
                          tile (_triton_plan.FINISH_SEARCH_TILE = 1024) or the earlier one (0).
  "emit_skip_identities"  the emission skipping per value what is the identity for all of a
                          program's rows (_triton_plan.EMIT_SKIP_IDENTITIES: the division by T = 1,
                          min-p's test without min-p), or not.
  "emit_one_row_block"    the B = 1 emission in blocks of 256 (_triton_plan.EMIT_ONE_ROW_BLOCK_V) or
                          of 1024 (EMIT_MAX_BLOCK_V); B = 1 rows only (the other batches' plans do
                          not change).
  "earlier_defaults"      all three as they were before 2026-11-28 (the fused search off, no skips,
                          1024-value blocks): the three changes together against the earlier plan.
  "finish_gather_4096"    the finishing launch's second pass (a row's interval gathered, min-p's chunk
  "finish_gather_8192"    masses) in blocks of 4096 / 8192 values (_triton_plan.FINISH_GATHER_BLOCK_V,
                          a candidate, off) against the streaming block of 2048: twice / four times
                          the loads in flight of a program that holds an SM alone (B = 64: 570 of 576
                          top_p = 0.9 distributions take that pass, 2230 us on the H200). An H200 timed
                          8192 0.958x at B = 64 top_p (2026-11-30): on from B = 64 (FINISH_GATHER_MIN_BATCH).
  "emit_prob_keys"        the draft sampler's Gumbel-max keys weighted by the probability (as the verify's)
                          instead of exp(std - m) (_triton_plan.EMIT_SAMPLER_EXP_KEYS, on since 2026-11-30,
                          predicted, not timed): the sampler's columns alone change (the verify's plan keeps
                          the probability either way).

An H200 timed each of the three alone against the then-defaults at e4f1563 (bench/results/
h200_2026-11-28: the figures are at each constant in kernels/verify/_triton_plan.py) and they were
turned on; the same run timed two candidates that stayed off: the rungs launch comparing 256
sample values a step (RUNGS_SAMPLE_SUB, 1.01-1.05x slower) and the emission in blocks of 256 at
every batch (1.05-1.51x slower at B = 64), and the fused search's 2048-value tile (faster than
1024 for the B = 1 top_p sampler only). The rungs launch and the emission's ratio-test tile were
timed before that (bench/results/h200_2026-11-27c).

For B in {1, 8, 64}, K = 4 with draft logits, V = 128256, modes T=1 / top_k=50 / top_p=0.9 /
min_p=0.05: chain_verify_triton (and sample_triton, the draft sampler) as CUDA graph replays
under do_bench (median us), each way, and whether each gives the torch reference's tokens.

    python bench/bench_verify_latency.py [--budget-s S] [--out bench/results/verify_latency_<device>.json]
    python bench/bench_verify_latency.py --smoke [--out F]   # a tiny shape through the CPU interpreter
        (not a measurement; JSON only with --out: tests/test_bench_verify_latency.py)
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import versions, write_result  # noqa: E402
from gpu_timing import RowBudget  # noqa: E402
from verify_gpu_table import _time, side_by_side_args, verify_cases  # noqa: E402

from specdec_fast.kernels.verify import _triton_plan as _plan  # noqa: E402

MODES = {"T=1": {}, "top_k=50": dict(top_k=50), "top_p=0.9": dict(top_p=0.9), "min_p=0.05": dict(min_p=0.05)}
SHAPES = [(1, 4, 128256), (8, 4, 128256), (64, 4, 128256)]
_ONE_ROW_BLOCK_ON = _plan.EMIT_ONE_ROW_BLOCK_V < _plan.EMIT_MAX_BLOCK_V
_GATHER_OFF = _plan.LARGE_BLOCK_V  # the finishing launch's second pass in the streaming block (FINISH_GATHER_BLOCK_V None)
# way -> (the plan override that flips the lever, whether the defaults have it on, the batches where it changes
# the plan (None: every batch)); "now" is the defaults.
LEVERS = {
    "search_tile": (dict(finish_search_tile=0 if _plan.FINISH_SEARCH_TILE else 1024), bool(_plan.FINISH_SEARCH_TILE),
                    None),
    "emit_skip_identities": (dict(emit_skip_identities=not _plan.EMIT_SKIP_IDENTITIES), _plan.EMIT_SKIP_IDENTITIES,
                             None),
    "emit_one_row_block": (dict(emit_block_v=_plan.EMIT_MAX_BLOCK_V if _ONE_ROW_BLOCK_ON else 256), _ONE_ROW_BLOCK_ON,
                           (1,)),
    "earlier_defaults": (dict(finish_search_tile=0, emit_skip_identities=False, emit_block_v=_plan.EMIT_MAX_BLOCK_V),
                         True, None),
    # a block the defaults take (FINISH_GATHER_BLOCK_V) is flipped back to the streaming block's. Timed where
    # the question is (B = 64) and at B = 1 for 4096 (its chunks change there too: 11 a row against 13); each
    # way compiles its own finishing kernels, which the limits stage's budget pays for
    "finish_gather_4096": (dict(finish_block_v=_GATHER_OFF if _plan.FINISH_GATHER_BLOCK_V == 4096 else 4096),
                           _plan.FINISH_GATHER_BLOCK_V == 4096, (1, 64)),
    "finish_gather_8192": (dict(finish_block_v=_GATHER_OFF if _plan.FINISH_GATHER_BLOCK_V == 8192 else 8192),
                           _plan.FINISH_GATHER_BLOCK_V == 8192, (64,)),
    # the sampler's keys (its verify column runs the same plan as "now": the verify keeps the probability)
    "emit_prob_keys": (dict(emit_exp_keys=not _plan.EMIT_SAMPLER_EXP_KEYS), _plan.EMIT_SAMPLER_EXP_KEYS, None),
}
WAYS = {"now": {}, **{name: flip for name, (flip, _, _) in LEVERS.items()}}
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
    args, device = side_by_side_args(__doc__, argv)
    # the smoke shape: the large-vocabulary path with several chunks a row, B = 1 (every way runs there)
    ov = dict(cap=128, num_chunks=4, block_v=64) if args.smoke else {}
    rows, budget = [], RowBudget(args.budget_s)
    cases = verify_cases([(1, 2, 600)] if args.smoke else SHAPES, MODES, device,
                         torch.float32 if args.smoke else torch.bfloat16, budget,
                         keep=lambda mode: not args.smoke or mode in SMOKE_MODES)
    for case in cases:
        row = dict(B=case.batch, K=case.k, V=case.vocab, mode=case.mode)
        for name, flags in WAYS.items():
            batches = LEVERS[name][2] if name in LEVERS else None
            if batches is not None and case.batch not in batches:
                continue  # the lever does not change this batch's plan
            if name in LEVERS:
                row[f"{name}_default_on"] = LEVERS[name][1]
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
        tried = [name for name in WAYS if f"tokens_equal_reference_{name}" in row]
        ok = all(row[f"tokens_equal_reference_{name}"] for name in tried)
        parts = " | ".join(f"{name} {row[f'verify_{name}_us']:.1f} / {row[f'sample_{name}_us']:.1f}"
                           if name in measured else f"{name} FAILED" for name in tried)
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
