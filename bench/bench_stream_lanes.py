"""The Triton verify's streaming pass, its variants side by side in one run (GPU): per-lane
statistics reduced once after the loop (stream_lanes=True) against a block-wide reduction every
step (stream_lanes=False); the per-lane loop taking 1, 2 or 4 blocks per step (stream_unroll);
and the kernel compiled with its top-k / top-p / min-p code where no row uses it (selects=True,
the kernel before 2026-11-25: 170-179 registers at B = 64 against 57-62,
bench/results/verify_stream_ptx_sm90.json); the emission's pass with per-lane maxima
(emit_lanes=True: 3 barriers per step instead of 18 in its sm_90a loop at B = 64, same file). The launcher picks per plan
(_triton_plan.plan_launches) from what this measured on an H100
(bench/results/h100_2026-11-23/stream_lanes_112bf69.json for the two loops).

For V in {32000, 128256}, B in {1, 8, 64}, K = 4 with draft logits, modes greedy / T=1 /
top_k=50 (the rows that stream without rungs): chain_verify_triton and sample_triton as CUDA
graph replays under do_bench (median us), GB/s and fraction of the measured-bandwidth roofline
(logits bytes read once), and whether both loops give the reference's tokens. Greedy rows also
time both loops without the sums (stream_sums=False: the max and the argmax alone, the greedy
tokens' only need) and with them (stream_sums=True), whichever the plan's default.

    python bench/bench_stream_lanes.py [--quick] [--budget-s S] [--out bench/results/stream_lanes_<device>.json]
    python bench/bench_stream_lanes.py --greedy-batches 16,32,128 [--out bench/results/stream_lanes_greedy_<device>.json]
    python bench/bench_stream_lanes.py --smoke [--quick] [--out F]   # this code on a tiny shape, CPU
        interpreter (not a measurement; JSON only with --out: tests/test_bench_stream_lanes.py)
Not a test: pytest collects nothing here.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import versions, write_result  # noqa: E402
from gpu_timing import RowBudget  # noqa: E402
from verify_gpu_table import (QUICK_SHAPES, _entry, _time, bandwidth_fields, roofline_bandwidth,  # noqa: E402
                              side_by_side_args, verify_cases)

MODES = {"greedy": dict(temperature=0.0), "T=1": {}, "top_k=50": dict(top_k=50)}
# name -> overrides of chain_verify_triton / sample_triton; "lanes" is the plan's default loop
VARIANTS = {"lanes": dict(stream_lanes=True), "block_loop": dict(stream_lanes=False),
            "lanes_with_select_code": dict(stream_lanes=True, selects=True),
            "lanes_unroll2": dict(stream_lanes=True, stream_unroll=2),
            "lanes_unroll4": dict(stream_lanes=True, stream_unroll=4),
            "emit_lanes": dict(stream_lanes=True, emit_lanes=True),
            "lanes_argmax_only": dict(stream_lanes=True, stream_sums=False, stream_unroll=1),
            "block_argmax_only": dict(stream_lanes=False, stream_sums=False),
            "lanes_sums": dict(stream_lanes=True, stream_sums=True, stream_unroll=1),
            "block_sums": dict(stream_lanes=False, stream_sums=True),
            "lanes_argmax_only_unroll2": dict(stream_lanes=True, stream_sums=False, stream_unroll=2),
            "lanes_argmax_only_unroll4": dict(stream_lanes=True, stream_sums=False, stream_unroll=4)}
# Variants of some modes only: the stream without its sums serves greedy rows alone
# (_triton_plan.STREAM_GREEDY_ARGMAX_ONLY, the greedy rows' default since 2026-11-28: "lanes" and "block_loop"
# follow it there); issue25_report compares each argmax-only loop with the same loop with its sums pinned.
# The argmax-only per-lane loop 2 and 4 blocks a step (_triton_plan.STREAM_ARGMAX_UNROLL, 4 where a lane takes two
# steps since 2026-11-28; issue25_report compares them with "lanes_argmax_only", one block a step, and reads
# the rows' planned_unroll_* for the plan's own choice).
ONLY_MODES = {name: ("greedy",) for name in ("lanes_argmax_only", "block_argmax_only", "lanes_sums", "block_sums",
                                             "lanes_argmax_only_unroll2", "lanes_argmax_only_unroll4")}
SHAPES = [(batch, 4, vocab) for vocab in (32000, 128256) for batch in (1, 8, 64)]
QUICK_MODES = ("greedy", "T=1")  # --quick: issue 25's rows (the verify table's QUICK_SHAPES)


def planned_unroll(case, overrides: dict, device) -> dict:
    """The blocks a step the plan gives the "lanes" variant's streaming loop (_triton_plan.STREAM_ARGMAX_UNROLL
    for greedy rows), verify and sampler: {"planned_unroll_verify": n, "planned_unroll_sample": n}."""
    from specdec_fast.kernels.verify.triton import plan_for

    kw = dict(overrides, **VARIANTS["lanes"])
    return {"planned_unroll_verify": plan_for(case.batch, case.k, case.vocab, True, device, kw,
                                              modes=case.params.modes).stream_unroll,
            "planned_unroll_sample": plan_for(case.batch, 0, case.vocab, False, device, kw,
                                              modes=case.params.modes).stream_unroll}


def main(argv=None) -> dict:
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    def add(ap):
        ap.add_argument("--quick", action="store_true", help="issue 25's rows only: B 1 / 64 at V 128256, greedy and T=1")
        ap.add_argument("--greedy-batches", help="comma-separated batches: greedy rows alone at V 128256 (the argmax-only "
                        "stream's blocks a step where its lanes are 8 / 16 / 64 blocks: B 16 / 32 / 128)")

    args, device = side_by_side_args(__doc__, argv, add)
    measured = roofline_bandwidth(device)
    bandwidth = measured and measured["ceiling_Bps"]
    ov = dict(cap=128, num_chunks=2) if args.smoke else {}  # the smoke shape takes the large-vocabulary path
    rows, budget = [], RowBudget(args.budget_s)
    if args.greedy_batches:
        shapes = [(2, 2, 600)] if args.smoke else [(int(b), 4, 128256) for b in args.greedy_batches.split(",")]
        keep = lambda mode: mode == "greedy"  # noqa: E731
    else:
        shapes = [(2, 2, 600)] if args.smoke else QUICK_SHAPES if args.quick else SHAPES
        keep = lambda mode: not args.quick or mode in QUICK_MODES  # noqa: E731
    cases = verify_cases(shapes, MODES, device, torch.float32 if args.smoke else torch.bfloat16, budget, keep=keep)
    for case in cases:
        verify_bytes = (case.target.numel() + case.draft.numel()) * case.target.element_size()
        sample_bytes = case.logits.numel() * case.logits.element_size()
        row = dict(B=case.batch, K=case.k, V=case.vocab, mode=case.mode, verify_bytes=verify_bytes,
                   sample_bytes=sample_bytes)
        if case.mode == "greedy":  # the plan's blocks a step in the "lanes" variant (issue25_report: STREAM_ARGMAX_UNROLL)
            row.update(planned_unroll(case, ov, device))
        names = [name for name in VARIANTS if case.mode in ONLY_MODES.get(name, (case.mode,))]
        for name in names:
            kw = dict(ov, **VARIANTS[name])
            verify = lambda: chain_verify_triton(case.target, case.draft, case.drafts, case.params, **kw)  # noqa: E731
            sample = lambda: sample_triton(case.logits, case.params, case.positions, 2, **kw)  # noqa: E731
            row[f"tokens_equal_reference_{name}"] = case.same_tokens(verify(), sample())
            row[f"verify_{name}"] = _entry(_time(verify, args.smoke), verify_bytes, bandwidth)
            row[f"sample_{name}"] = _entry(_time(sample, args.smoke), sample_bytes, bandwidth)
        rows.append(row)
        parts = " | ".join(f"{name} {row[f'verify_{name}']['median_us']:.1f} us "
                           f"({100 * (row[f'verify_{name}']['fraction_of_roofline'] or 0):.0f}%)"
                           f"{'' if row[f'tokens_equal_reference_{name}'] else ' WRONG TOKENS'}"
                           for name in names)
        print(f"B={case.batch} V={case.vocab} {case.mode} verify: {parts}", flush=True)
    if args.smoke and not args.out:
        print("smoke run: not a measurement; nothing written")
        return dict(rows=rows)
    name = "cpu (smoke: interpreter, not a measurement)" if args.smoke else torch.cuda.get_device_name(device)
    timer = "wall clock, one call (smoke)" if args.smoke else "CUDA graph replay under triton.testing.do_bench: median (us)"
    result = dict(device=name, versions=versions(), **bandwidth_fields(measured), timer=timer,
                  not_run=budget.not_run, rows=rows)
    write_result(result, "stream_lanes", name, args.out)
    return result


if __name__ == "__main__":
    main()
