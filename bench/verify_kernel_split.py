"""The verify step's device time per kernel (GPU): which launch each mode and batch waits on.

bench_verify_latency times whole calls; this reads inside them. For B in {1, 8, 64}, K = 4 with
draft logits, V = 128256, modes greedy / T=1 / top_k=50 / top_p=0.9 / min_p=0.05: one eager
chain_verify_triton call (and sample_triton, the draft sampler) under torch.profiler, five calls
(gpu_timing.profile_kernels: [kernel, launches, us] per call, slowest first; the eager call's
kernels run as in a graph replay, without the gaps between launches), the GPU's busy time per call,
and whether the call gives the torch reference's tokens. The question it answers first (H200,
bench/results/h200_2026-11-28c): the B = 64 top_p = 0.9 verify took 2230 us against 791 for
top_k = 50 and 214 for T = 1, with every row's threshold on the one-program-a-row second pass
(threshold_routes: gathered_by_chunks) -- which of the four launches holds the difference.

    python bench/verify_kernel_split.py [--budget-s S] [--out bench/results/verify_kernels_<device>.json]
    python bench/verify_kernel_split.py --smoke [--out F]   # a tiny shape through the CPU interpreter: the
        calls and their tokens only (no CUDA kernel to profile; not a measurement)
Not a test: pytest collects nothing here.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import versions, write_result  # noqa: E402
from gpu_timing import RowBudget  # noqa: E402
from verify_gpu_table import side_by_side_args, verify_cases  # noqa: E402

MODES = {"greedy": dict(temperature=0.0), "T=1": {}, "top_k=50": dict(top_k=50), "top_p=0.9": dict(top_p=0.9),
         "min_p=0.05": dict(min_p=0.05)}
SHAPES = [(64, 4, 128256), (1, 4, 128256), (8, 4, 128256)]  # B = 64 first: the question above
SMOKE_OVERRIDES = dict(cap=128, num_chunks=2)  # the smoke shape takes the large-vocabulary path


def census(fn, profile) -> dict:
    """profile(fn) (gpu_timing.profile_kernels) without the "other: " prefix of the Triton kernels' names; an
    error is recorded, not raised (a profiler failure must not lose the other rows)."""
    try:
        got = profile(fn)
    except Exception as error:  # noqa: BLE001
        return {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    got["families_count_us"] = [[name.removeprefix("other: "), launches, us]
                                for name, launches, us in got["families_count_us"]]
    return got


def main(argv=None) -> dict:
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    args, device = side_by_side_args(__doc__, argv)
    if not args.smoke:
        from gpu_timing import profile_kernels
    overrides = SMOKE_OVERRIDES if args.smoke else {}
    rows, budget = [], RowBudget(args.budget_s)
    shapes = [(2, 2, 600)] if args.smoke else SHAPES
    modes = {m: MODES[m] for m in ("greedy", "top_p=0.9")} if args.smoke else MODES
    for case in verify_cases(shapes, modes, device, torch.float32 if args.smoke else torch.bfloat16, budget):
        def verify():
            return chain_verify_triton(case.target, case.draft, case.drafts, case.params, **overrides)

        def sample():
            return sample_triton(case.logits, case.params, case.positions, 2, **overrides)

        row = dict(B=case.batch, K=case.k, V=case.vocab, mode=case.mode,
                   tokens_equal_reference=case.same_tokens(verify(), sample()))
        if not args.smoke:
            row["verify"], row["sample"] = census(verify, profile_kernels), census(sample, profile_kernels)
            split = ", ".join(f"{name} x{launches:g} {us:.1f} us"
                              for name, launches, us in row["verify"].get("families_count_us", []))
            print(f"B={case.batch} {case.mode} verify: {split or row['verify'].get('error')}", flush=True)
        rows.append(row)
    if args.smoke and not args.out:
        print("smoke run: not a measurement; nothing written")
        return dict(rows=rows)
    name = "cpu (smoke: interpreter, not a measurement)" if args.smoke else torch.cuda.get_device_name(device)
    timer = ("none (smoke: the calls and their tokens only)" if args.smoke
             else "torch.profiler device time per kernel, eager calls (gpu_timing.profile_kernels, 5 calls)")
    result = dict(device=name, versions=versions(), timer=timer, not_run=budget.not_run, rows=rows)
    write_result(result, "verify_kernels", name, args.out)
    return result


if __name__ == "__main__":
    main()
