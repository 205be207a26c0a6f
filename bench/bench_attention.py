"""Paged attention benchmarks.

CPU, under pytest-benchmark (one quick run with --benchmark-disable):
    pytest bench/bench_attention.py --benchmark-only --benchmark-group-by=group
Script modes:
    python bench/bench_attention.py --cpu   [--out bench/results/attention_cpu.json]
        C++ op vs the torch reference, median of --reps runs.
    python bench/bench_attention.py --cpu-block-mask [--out bench/results/attention_block_mask_cpu.json]
        The block mask (causal=False: DFlash's draft block) against the causal pass at the same
        shapes, N = 8 / 16 new tokens per row, C++ op and torch reference, fp32.
    python bench/bench_attention.py --cpu-window [--out bench/results/attention_window_cpu.json]
        A sliding window (WINDOW_TABLE: 512 / 2048 over contexts of 2k / 8k), chunked attention
        (Llama 4's, chunks of the same size) and Gemma 2's soft-capping against full attention at the
        same shapes, C++ op and torch reference, fp32: the C++ op reads only the keys from each row's
        window or its first query's chunk (predicted: time ~ the keys read / context of the full
        pass's); the reference reads every key and masks.
    python bench/bench_attention.py --gpu   [--quick] [--budget-s S] [--out bench/results/attention_<device>.json]
        Llama-8B-like heads (32 q, 8 kv, D=128), bf16, B in {1,8,32} x context in {1k,2k,8k,32k},
        N=1 and N=5 queries per row, every call timed as CUDA-graph replays (ours and SDPA):
        Triton us with its launch plan (splits, launches), GB/s against the HBM roofline (target
        >= 70% at B=8/32k), N=5 vs N=1 (target <= 1.25x at 32k), torch SDPA flash on the same
        K/V laid out densely (target: ours <= 1.3x at contexts <= 2k, B=1 and 8), and up to 8k
        a sweep of forced split counts (which one the automatic choice should pick). Both merges
        side by side: the merge launch (triton_*, sweep_*: today's default) and the in-kernel merge
        (in_kernel_*, sweep_in_kernel_*: kernels/attention/triton.py MERGE_IN_KERNEL), after a check
        that they give the same output; and short_row_*: rows of SHORT_ROW_TOKENS in the same tables
        (the split count follows the table), the automatic plan against one split; window_N*_us: a
        sliding window of GPU_WINDOW tokens at contexts past it (predicted: about the time at a
        context of GPU_WINDOW), chunk_N*_us: Llama 4's chunks of GPU_CHUNK at contexts past one
        (predicted: about the time at a context of the keys from the last chunk's start),
        softcap_N*_us: Gemma 2's soft-capping (50), d512_N*_us / _GBps: Gemma 4's full layers (16 query heads
        of 512 over 2 KV heads, 16-row tiles) at the same rows. --quick: B 1 / 8 x
        context 1k / 8k only (the merge forms' decision); the JSON is rewritten after every shape.
    TRITON_INTERPRET=1 python bench/bench_attention.py --gpu --smoke --out F
        The same code on CPU under the interpreter (fp32, B = 1 x context 520, one wall-clock
        call per timing): not a measurement, a check that the device run is not broken on arrival.
"""
import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, versions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}  # SXM datasheet peaks


def make_inputs(B, context, n, hq=32, hkv=8, d=128, block_size=16, dtype=torch.bfloat16, device="cpu", seed=0):
    """Each of B rows holds `context` tokens (its n new ones included) in shuffled pages."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pages = -(-context // block_size)
    num_blocks = B * pages
    k_cache = torch.randn(num_blocks, block_size, hkv, d, device=device, dtype=dtype, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, device=device, dtype=dtype, generator=gen)
    perm = torch.randperm(num_blocks, device=device, generator=gen)
    block_table = perm.reshape(B, pages).to(torch.int32)
    seq_lens = torch.full((B,), context, dtype=torch.int32, device=device)
    cu = torch.arange(0, B + 1, dtype=torch.int32, device=device) * n
    q = torch.randn(B * n, hq, d, device=device, dtype=dtype, generator=gen)
    return q, k_cache, v_cache, block_table, seq_lens, cu


def bytes_moved(B, context, n, hq=32, hkv=8, d=128, elem=2):
    """K+V read once per KV head + q read + out written."""
    return 2 * B * context * hkv * d * elem + 2 * B * n * hq * d * elem


# ---------------------------------------------------------------- CPU, pytest-benchmark
CPU_SHAPES = [(1, 1024, 1), (1, 1024, 5), (4, 512, 5)]


def _cpp_ok():
    from specdec_fast.kernels._backend import cpp_op_available

    return cpp_op_available("paged_attention")


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=lambda s: f"B{s[0]}-ctx{s[1]}-N{s[2]}")
def test_cpu_paged_attention(benchmark, shape, backend):
    from specdec_fast.kernels.attention import paged_attention

    if backend == "cpp" and not _cpp_ok():
        pytest.skip("C++ op unavailable")
    B, ctx, n = shape
    benchmark.group = f"paged_attention fp32 B{B} ctx{ctx} N{n}"
    args = make_inputs(B, ctx, n, dtype=torch.float32)
    out = benchmark(lambda: paged_attention(*args, max_query_len=n, backend=backend, check=False))
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------- script helpers
def median_seconds(fn, reps):
    """(median wall seconds, median process CPU seconds summed over threads) of `reps` calls.
    On a shared, loaded machine the CPU time is the steadier of the two."""
    fn()  # warm-up (and C++ build)
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


CPU_TABLE = [(1, 1024, 1), (1, 1024, 5), (1, 4096, 1), (1, 4096, 5), (4, 1024, 1), (4, 1024, 5), (8, 2048, 5)]


def run_cpu(args):
    from specdec_fast.kernels.attention import paged_attention

    if not _cpp_ok():
        sys.exit("the C++ op did not build: nothing to compare")
    rows = []
    combos = itertools.product(args.threads or [torch.get_num_threads()], (torch.float32, torch.bfloat16), CPU_TABLE)
    for threads, dtype, (B, ctx, n) in combos:
        torch.set_num_threads(threads)  # also the OpenMP thread count of the C++ op
        inputs = make_inputs(B, ctx, n, dtype=dtype)
        res = {"threads": threads, "B": B, "context": ctx, "N": n, "dtype": str(dtype).replace("torch.", "")}
        for backend in ("cpp", "torch"):
            fn = lambda: paged_attention(*inputs, max_query_len=n, backend=backend, check=False)  # noqa: E731
            wall, cpu = median_seconds(fn, args.reps)
            res[f"{backend}_ms"], res[f"{backend}_cpu_ms"] = 1e3 * wall, 1e3 * cpu
        res["speedup_cpp_vs_torch"] = res["torch_ms"] / res["cpp_ms"]
        res["speedup_cpp_vs_torch_cpu_time"] = res["torch_cpu_ms"] / res["cpp_cpu_ms"]
        res["cpp_GBps"] = bytes_moved(B, ctx, n, elem=inputs[0].element_size()) / res["cpp_ms"] / 1e6
        rows.append(res)
        print(json.dumps(res))
    same = ("threads", "dtype", "B", "context")
    for r5 in (r for r in rows if r["N"] == 5):  # N=5 vs N=1 at equal threads, dtype, B, context
        for r1 in (r for r in rows if r["N"] == 1 and all(r[k] == r5[k] for k in same)):
            r5["cpp_ratio_N5_vs_N1"] = r5["cpp_ms"] / r1["cpp_ms"]
            r5["cpp_ratio_N5_vs_N1_cpu_time"] = r5["cpp_cpu_ms"] / r1["cpp_cpu_ms"]
    report = {"device": f"cpu: {cpu_model()}", "cpus": os.cpu_count(), "loadavg_1_5_15": os.getloadavg(),
              "heads": "32 q / 8 kv, D=128, block_size 16", "reps": args.reps, **versions(), "results": rows}
    out = Path(args.out or ROOT / "bench/results/attention_cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


BLOCK_MASK_TABLE = [(1, 256, 8), (1, 256, 16), (1, 1024, 16), (1, 4096, 16), (8, 1024, 16)]


def run_cpu_block_mask(args):
    """Block mask vs causal: the same KV pages, n (n - 1) / 2 more scores per head and row."""
    from specdec_fast.kernels.attention import paged_attention

    if not _cpp_ok():
        sys.exit("the C++ op did not build: nothing to compare")
    load_before = os.getloadavg()
    rows = []
    for threads, (B, ctx, n) in itertools.product(args.threads or [1], BLOCK_MASK_TABLE):
        torch.set_num_threads(threads)
        inputs = make_inputs(B, ctx, n, dtype=torch.float32)
        res = {"threads": threads, "B": B, "context": ctx, "N": n}
        for backend in ("cpp", "torch"):
            for causal in (True, False):
                fn = lambda: paged_attention(*inputs, max_query_len=n, causal=causal, backend=backend, check=False)  # noqa: E731
                wall, cpu = median_seconds(fn, args.reps)
                name = f"{backend}_{'causal' if causal else 'block'}"
                res[f"{name}_ms"], res[f"{name}_cpu_ms"] = round(1e3 * wall, 4), round(1e3 * cpu, 4)
            res[f"{backend}_block_vs_causal_cpu_time"] = round(res[f"{backend}_block_cpu_ms"] / res[f"{backend}_causal_cpu_ms"], 3)
        rows.append(res)
        print(json.dumps(res), flush=True)
    report = {"device": f"cpu: {cpu_model()}", "cpus": os.cpu_count(),
              "loadavg_1_5_15": dict(before=load_before, after=os.getloadavg()),
              "heads": "32 q / 8 kv, D=128, block_size 16, fp32", "reps": args.reps, **versions(),
              "command": "python bench/bench_attention.py " + " ".join(sys.argv[1:]), "results": rows}
    out = Path(args.out or ROOT / "bench/results/attention_block_mask_cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


WINDOW_TABLE = [(1, 2048, 1, 512), (1, 8192, 1, 512), (1, 8192, 1, 2048), (1, 8192, 5, 2048), (8, 2048, 5, 512)]
WINDOW_SOFTCAP = 50.0  # Gemma 2's attn_logit_softcapping


def run_cpu_window(args):
    """Window and soft-cap against full attention: (B, context, N, window) rows of WINDOW_TABLE."""
    from specdec_fast.kernels.attention import paged_attention

    if not _cpp_ok():
        sys.exit("the C++ op did not build: nothing to compare")
    load_before = os.getloadavg()
    rows = []
    for threads, (B, ctx, n, window) in itertools.product(args.threads or [1], WINDOW_TABLE):
        torch.set_num_threads(threads)
        inputs = make_inputs(B, ctx, n, dtype=torch.float32)
        res = {"threads": threads, "B": B, "context": ctx, "N": n, "window": window}
        for backend in ("cpp", "torch"):
            for form, extra in (("full", {}), ("window", dict(window=window)), ("chunk", dict(chunk=window)),
                                ("softcap", dict(softcap=WINDOW_SOFTCAP))):
                fn = lambda: paged_attention(*inputs, max_query_len=n, backend=backend, check=False, **extra)  # noqa: E731
                wall, cpu = median_seconds(fn, args.reps)
                res[f"{backend}_{form}_ms"], res[f"{backend}_{form}_cpu_ms"] = round(1e3 * wall, 4), round(1e3 * cpu, 4)
            for form in ("window", "chunk", "softcap"):
                res[f"{backend}_{form}_vs_full_cpu_time"] = round(res[f"{backend}_{form}_cpu_ms"] / res[f"{backend}_full_cpu_ms"], 3)
        res["predicted_cpp_window_vs_full"] = round(min(1.0, (window + n) / ctx), 3)
        # the chunk of the row's first new query (position ctx - n) starts the walk: keys from there on
        res["predicted_cpp_chunk_vs_full"] = round((ctx - (ctx - n) // window * window) / ctx, 3)
        rows.append(res)
        print(json.dumps(res), flush=True)
    report = {"device": f"cpu: {cpu_model()}", "cpus": os.cpu_count(),
              "loadavg_1_5_15": dict(before=load_before, after=os.getloadavg()),
              "heads": "32 q / 8 kv, D=128, block_size 16, fp32", "reps": args.reps, "softcap": WINDOW_SOFTCAP,
              **versions(), "command": "python bench/bench_attention.py " + " ".join(sys.argv[1:]), "results": rows}
    out = Path(args.out or ROOT / "bench/results/attention_window_cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def graph_us(fn, reps: int = 100) -> float:
    """us per call of fn replayed in a CUDA graph (bench/gpu_timing.py): launch cost out of the
    picture, as in the decoding loop (the H100 run's eager do_bench timed Python launches:
    93 us at B=1/1k for what the GPU does in a fraction of that)."""
    from gpu_timing import graph_timer

    return graph_timer(fn, reps)


GPU_BATCHES, GPU_CONTEXTS = (1, 8, 32), (1024, 2048, 8192, 32768)
SWEEP_SPLITS = (1, 2, 4, 8, 16, 32)  # forced split counts, timed beside the automatic choice
SWEEP_MAX_CONTEXT = 8192
QUICK_BATCHES, QUICK_CONTEXTS = (1, 8), (1024, 8192)  # --quick: the merge forms' decision rows
SMOKE_BATCHES, SMOKE_CONTEXTS = (1,), (520,)  # --smoke: a sweep of 1 / 2 splits (256 tokens each)
SHORT_ROW_TOKENS = 128  # each row's length in the short-row rows (the table keeps the row's context)
GPU_WINDOW = 4096  # window_N*_us: Mistral 7B's / Gemma 2's sliding window, at contexts past it
GPU_CHUNK = 8192  # chunk_N*_us: Llama 4's attention_chunk_size, at contexts past it


def wall_us(fn) -> float:
    """--smoke's timer: us of one call (CPU, interpreter: nothing to warm, not a measurement)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def sdpa_dense_us(q, k_cache, v_cache, block_table, B, ctx, n, hq=32, hkv=8, d=128, time_us=graph_us):
    """SDPA flash on the same K/V laid out densely [B, H, L, D] (no mask: a lower bound), graph-replayed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kd = k_cache[block_table.long()].reshape(B, -1, hkv, d)[:, :ctx].transpose(1, 2).contiguous()
    vd = v_cache[block_table.long()].reshape(B, -1, hkv, d)[:, :ctx].transpose(1, 2).contiguous()
    qd = q.reshape(B, n, hq, d).transpose(1, 2).contiguous()
    for gqa in (True, False):  # native GQA first, else K/V expanded to the q heads
        if not gqa:
            kd, vd = kd.repeat_interleave(hq // hkv, 1), vd.repeat_interleave(hq // hkv, 1)

        def sdpa():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, enable_gqa=gqa)

        try:
            return time_us(sdpa), gqa, None
        except RuntimeError as exc:
            error = str(exc)[:200]
    return None, None, error


def run_gpu(args):
    from gpu_timing import RowBudget

    from specdec_fast.kernels._workspace import KernelWorkspace
    from specdec_fast.kernels.attention.triton import paged_attention_triton, plan_launch

    if args.smoke:
        if not args.out:
            sys.exit("--smoke needs --out (a smoke run is not a measurement for bench/results)")
        device, dtype, name, time_us = "cpu", torch.float32, "cpu (smoke: interpreter, not a measurement)", wall_us
        batches, contexts = SMOKE_BATCHES, SMOKE_CONTEXTS
    else:
        if not torch.cuda.is_available():
            sys.exit("--gpu needs a CUDA device (or --smoke on CPU)")
        device, dtype, name, time_us = "cuda", torch.bfloat16, torch.cuda.get_device_name(), graph_us
        batches, contexts = (QUICK_BATCHES, QUICK_CONTEXTS) if args.quick else (GPU_BATCHES, GPU_CONTEXTS)
    peak = next((v for k, v in HBM_BYTES_PER_S.items() if k in name), None)
    tag = name.replace(" ", "_").replace("/", "_")
    out = Path(args.out or ROOT / f"bench/results/attention_{tag}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, budget = [], RowBudget(args.budget_s)
    for B in batches:
        for ctx in contexts:
            if not budget.allows(f"B={B} context={ctx}"):
                continue
            res = {"B": B, "context": ctx}
            for n in (1, 5):
                inputs = make_inputs(B, ctx, n, block_size=args.block_size, dtype=dtype, device=device)
                q, k_cache, v_cache, block_table, seq_lens, cu = inputs
                capacity = block_table.shape[1] * args.block_size
                ws = KernelWorkspace()  # the in-kernel merge's tickets, as a runner holds them

                def ours(splits=None, merge=False, lens=None, **extra):
                    lens = seq_lens if lens is None else lens
                    return paged_attention_triton(q, k_cache, v_cache, block_table, lens, cu, max_query_len=n,
                                                  scale=128 ** -0.5, num_splits=splits,
                                                  min_split_tokens=None if splits is None else 256,
                                                  merge_in_kernel=merge, workspace=ws if merge else None, **extra)

                # the two merges give the same output (fp32 partials; bf16 out): checked before timing
                auto = ours().float()
                res[f"in_kernel_max_abs_diff_N{n}"] = (ours(merge=True).float() - auto).abs().max().item()
                # which split count would have been best, with either merge? (each checked against auto)
                forced = [s for s in SWEEP_SPLITS if s * 256 <= ctx] if ctx <= SWEEP_MAX_CONTEXT else None
                sweep_diff = 0.0
                # keys: plan_N1 / triton_N1_* / sweep_N1_us (the merge launch), plan_in_kernel_N1 / in_kernel_N1_* / ...
                for form, suffix, merge in (("triton", "", False), ("in_kernel", "_in_kernel", True)):
                    plan = plan_launch(q.device, B, 8, 4, 128, n, capacity, merge_in_kernel=merge)
                    res[f"plan{suffix}_N{n}"] = {
                        "splits": plan.num_splits, "launches": 1 if plan.num_splits == 1 or merge else 2,
                        "grid": [B * 8, plan.num_tiles, plan.num_splits], "block_m": plan.block_m, "block_n": plan.block_n}
                    us = time_us(lambda merge=merge: ours(merge=merge))
                    gbps = bytes_moved(B, ctx, n, elem=q.element_size()) / us / 1e3
                    res[f"{form}_N{n}_us"], res[f"{form}_N{n}_GBps"] = us, gbps
                    res[f"{form}_N{n}_roofline"] = gbps * 1e9 / peak if peak else None
                    if forced is not None:
                        res[f"sweep{suffix}_N{n}_us"] = {s: time_us(lambda s=s, merge=merge: ours(s, merge)) for s in forced}
                        for s in forced:
                            sweep_diff = max(sweep_diff, (ours(s, merge).float() - auto).abs().max().item())
                if forced is not None:
                    res[f"sweep_max_abs_diff_N{n}"] = sweep_diff
                # a row much shorter than its table: the split count follows the table (static shapes),
                # the kernel divides the row's SHORT_ROW_TOKENS over the splits; against one split
                short = torch.full_like(seq_lens, min(SHORT_ROW_TOKENS, ctx))
                res[f"short_row_N{n}_us"] = {"auto": time_us(lambda: ours(lens=short)),
                                             "1": time_us(lambda: ours(1, lens=short))}
                res[f"short_row_max_abs_diff_N{n}"] = (ours(lens=short).float() - ours(1, lens=short).float()
                                                       ).abs().max().item()
                # a sliding window past the context's start (reads ~GPU_WINDOW keys a row), soft-capping
                window = min(GPU_WINDOW, ctx // 2) if args.smoke else GPU_WINDOW
                if ctx > window:
                    res[f"window_N{n}_us"] = time_us(lambda: ours(window=window))
                chunk = min(GPU_CHUNK, ctx // 2) if args.smoke else GPU_CHUNK
                if ctx > chunk:  # Llama 4's chunked layers: the keys from the start of each query's chunk
                    res[f"chunk_N{n}_us"] = time_us(lambda: ours(chunk=chunk))
                res[f"softcap_N{n}_us"] = time_us(lambda: ours(softcap=WINDOW_SOFTCAP))
                # Gemma 4's full layers: heads of 512 (16-row tiles), GQA 8 over 2 KV heads, the same context and
                # rows; its GB/s against the bytes it reads (the 128-wide rows' roofline does not apply)
                wide = make_inputs(B, ctx, n, hq=16, hkv=2, d=512, block_size=args.block_size, dtype=dtype, device=device)
                wide_us = time_us(lambda: paged_attention_triton(*wide, max_query_len=n, scale=1.0))
                res[f"d512_N{n}_us"] = wide_us
                res[f"d512_N{n}_GBps"] = bytes_moved(B, ctx, n, hq=16, hkv=2, d=512, elem=q.element_size()) / wide_us / 1e3
                del wide
                us = res[f"triton_N{n}_us"]
                sdpa, gqa, error = sdpa_dense_us(q, k_cache, v_cache, block_table, B, ctx, n, time_us=time_us)
                res[f"sdpa_flash_N{n}_us"], res["sdpa_native_gqa"] = sdpa, gqa
                if error:
                    res["sdpa_error"] = error
                res[f"ratio_vs_sdpa_N{n}"] = us / sdpa if sdpa else None
                del inputs, q, k_cache, v_cache, block_table
                torch.cuda.empty_cache()
            res["ratio_N5_vs_N1"] = res["triton_N5_us"] / res["triton_N1_us"]
            rows.append(res)
            print(json.dumps(res), flush=True)
            write_report(out, name, peak, args, rows, budget.not_run)  # after every row: a cut run keeps its rows
    write_report(out, name, peak, args, rows, budget.not_run)
    print(f"wrote {out}")


def attention_targets(rows: list) -> dict:
    """The GPU targets of bench_attention from the rows measured (a target whose rows were not run
    is left out) and the in-kernel merge against the merge launch per row (< 1: faster)."""
    short = [r for r in rows if r["context"] <= 2048 and r["B"] in (1, 8)]
    at32k = [r for r in rows if r["context"] == 32768]
    b8 = next((r for r in at32k if r["B"] == 8), None)
    targets = {"short_ratio_target": 1.3, "ratio_target": 1.25, "roofline_target": 0.70}
    if short:
        targets["short_ratio_vs_sdpa_max"] = max(r[f"ratio_vs_sdpa_N{n}"] or 0 for r in short for n in (1, 5))
    if at32k:
        targets["ratio_N5_vs_N1_at_32k_max"] = max(r["ratio_N5_vs_N1"] for r in at32k)
    if b8:
        targets["roofline_N1_B8_32k"] = b8.get("triton_N1_roofline")
        targets["roofline_N5_B8_32k"] = b8.get("triton_N5_roofline")
    targets["in_kernel_vs_launch"] = {f"B{r['B']}_{r['context']}_N{n}": r[f"in_kernel_N{n}_us"] / r[f"triton_N{n}_us"]
                                      for r in rows for n in (1, 5)}
    return targets


def write_report(out: Path, name: str, peak, args, rows: list, not_run: list) -> None:
    smoke = getattr(args, "smoke", False)
    report = {"device": name, "hbm_peak_Bps": peak, "heads": f"32 q / 8 kv, D=128, {'fp32' if smoke else 'bf16'}",
              "timing": "wall clock, one call (smoke)" if smoke else "CUDA graph replay", "block_size": args.block_size,
              "selection": "smoke" if smoke else "quick" if args.quick else "full", **versions(),
              "targets": attention_targets(rows), "not_run": not_run, "results": rows}
    out.write_text(json.dumps(report, indent=2) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gpu", action="store_true", help="Triton vs SDPA on CUDA (CUDA-graph replays)")
    mode.add_argument("--cpu", action="store_true", help="C++ op vs torch reference on CPU")
    mode.add_argument("--cpu-block-mask", action="store_true", help="block mask vs causal on CPU (C++ op, torch)")
    mode.add_argument("--cpu-window", action="store_true", help="sliding window and soft-cap vs full on CPU")
    parser.add_argument("--out", help="JSON path (default bench/results/attention_<device>.json)")
    parser.add_argument("--reps", type=int, default=7, help="CPU mode: timed runs per shape (median)")
    parser.add_argument("--threads", type=int, nargs="*", help="CPU mode: thread counts to run (default: torch's)")
    parser.add_argument("--block-size", type=int, default=16, help="GPU mode: KV page size")
    parser.add_argument("--quick", action="store_true", help="GPU mode: B 1 / 8 x context 1k / 8k (the merge decision)")
    parser.add_argument("--smoke", action="store_true",
                        help="GPU mode's code on CPU under the interpreter (TRITON_INTERPRET=1), tiny shapes; needs --out")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="GPU mode: no new shape after this many s")
    args = parser.parse_args(argv)
    if args.gpu:
        run_gpu(args)
    elif args.cpu_block_mask:
        run_cpu_block_mask(args)
    elif args.cpu_window:
        run_cpu_window(args)
    else:
        run_cpu(args)


if __name__ == "__main__":
    main()
