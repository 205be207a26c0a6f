"""Verify-step microbenchmarks: chain_verify on CPU (C++ backend vs the torch reference vs a
transformers-style materialising baseline) and on GPU (verify_gpu_table.py: Triton vs the
torch reference vs plain PyTorch vs FlashInfer, every sampling mode, CUDA-graph replays).

    pytest bench/bench_verify.py --benchmark-only --benchmark-group-by=group -p no:xdist
    python bench/bench_verify.py --cpu [--threads N] [--repeats R] [--out bench/results/verify_cpu.json]
    python bench/bench_verify.py --gpu [--data random|peaked] [--quick] [--budget-s S] [--out bench/results/verify_<device>.json]
    python bench/bench_verify.py --smoke [--out ...]   # the GPU table's code on tiny shapes, CPU interpreter
    python bench/bench_verify.py --penalties [--out bench/results/verify_penalties_cpu_<isa>.json]

Inputs: target logits [B, K+1, V], draft logits [B, K, V] correlated with them (like a real
draft), drafts sampled from the draft, plain sampling (temperature 1) unless a case says so.
Under --benchmark-disable (CI) each benchmark runs once and checks the output shapes.

--penalties (run_penalties): the C++ verify and draft sampler with and without repetition /
frequency / presence penalties (kernels/penalties), B = 1 and 8, K = 4, V = 32000, CPU only
(bench/results/verify_penalties_cpu_avx512.json, 1 thread: verify x1.08-1.14 sampled, x1.30 /
x1.59 greedy at B = 1 / 8; the sampler x1.05-1.08 sampled, x1.29 / x1.51 greedy).
The GPU figure waits for a GPU (no GPU number is written here). Prediction for the Triton
kernels: a penalised distribution reads an int32 count per logit beside its 2-byte bf16 logit
(verify_plan(penalties=True)["count_reads_per_row"] = 2K + 1 + 2 reads of a row's 4 V bytes);
at B = 1 (V = 128256: a 0.5 MB count row, which L2 keeps for the row's 9 distributions) the
HBM bytes grow by ~20% and the latency-bound step by ~10-20%; at B = 64 the 33 MB of counts
are read once per call if L2 serves a row's 9 distributions (programs of one row run together),
up to 9 times if not: a 1.2x to 3x longer streaming pass (148 MB of logits per pass).
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # the Triton interpreter must be chosen before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, cpu_simd, git_commit  # noqa: E402
from verify_baseline import chain_verify_materialising  # noqa: E402

from specdec_fast.kernels import chain_verify, make_sampling_tensors, sample  # noqa: E402
from specdec_fast.kernels.penalties import add_tokens, make_penalty_tensors  # noqa: E402
from specdec_fast.kernels.verify.reference import chain_verify_reference  # noqa: E402

CPU_SHAPES = [(8, 4, 32000), (1, 4, 32000), (32, 4, 32000), (8, 4, 128256)]


def make_case(batch: int, k: int, vocab: int, dtype=torch.float32, device="cpu", seed=0):
    """(target [B,K+1,V], draft [B,K,V], draft_tokens int64 [B,K]) on device."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 3
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g)
    tokens = torch.multinomial(torch.softmax(draft.reshape(-1, vocab), -1), 1, generator=g).reshape(batch, k)
    return target.to(device, dtype), draft.to(device, dtype), tokens.to(device)


def implementations(device: str, sampling: dict) -> dict:
    """name -> fn(target, draft, tokens) returning (tokens [B,K+1], num_accepted [B])."""
    backend = "cpp" if device == "cpu" else "triton"

    def ours(t, d, x):
        return chain_verify(t, d, x, seed=1, backend=backend, check=False, **sampling)

    def reference(t, d, x):
        params = make_sampling_tensors(t.shape[0], t.device, seed=1, **sampling)
        return chain_verify_reference(t, d, x, params)

    def baseline(t, d, x):
        return chain_verify_materialising(t, d, x, temperature=sampling.get("temperature", 1.0))

    impls = {backend: ours, "reference": reference}
    if not set(sampling) - {"temperature"}:  # the baseline knows temperature only
        impls["transformers-style"] = baseline
    return impls


def _check_shapes(out, batch: int, k: int) -> None:
    tokens, accepted = out
    assert tokens.shape == (batch, k + 1) and accepted.shape == (batch,)
    assert int(accepted.min()) >= 0 and int(accepted.max()) <= k


# ---------------------------------------------------------------- CPU: pytest-benchmark
CPU_CASES = [(shape, "plain", {}) for shape in CPU_SHAPES] + [
    ((8, 4, 32000), "top_p=0.9", dict(top_p=0.9)),
    ((8, 4, 32000), "temperature+top_k+top_p+min_p", dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02)),
]


@pytest.mark.parametrize("impl", ["cpp", "reference", "transformers-style"])
@pytest.mark.parametrize("shape,mode,sampling", CPU_CASES, ids=[f"B{b}-K{k}-V{v}-{m}" for (b, k, v), m, _ in CPU_CASES])
def test_bench_chain_verify_cpu(benchmark, impl, shape, mode, sampling):
    from tests.kernels.backends import kernel_backends

    impls = implementations("cpu", sampling)
    if impl not in impls:
        pytest.skip(f"{impl} has no {mode} sampling")
    if impl == "cpp" and "cpp" not in kernel_backends():
        pytest.skip("C++ backend unavailable")
    batch, k, vocab = shape
    benchmark.group = f"chain_verify CPU B={batch} K={k} V={vocab} {mode}"
    target, draft, tokens = make_case(batch, k, vocab)
    fn = impls[impl]
    slow = impl != "cpp" and batch * vocab > 8 * 32000
    out = benchmark.pedantic(fn, (target, draft, tokens), rounds=3 if slow else 10, iterations=1, warmup_rounds=1)
    _check_shapes(out, batch, k)


# ---------------------------------------------------------------- script modes
def _load_average():
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def median_ms(fn, args, min_runs: int = 5, budget_s: float = 2.0) -> dict:
    """Median (and min/max) wall time of fn(*args) in ms: one warm-up, then at least min_runs
    runs and up to budget_s seconds."""
    fn(*args)
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < budget_s and len(times) < 200):
        t0 = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "runs": len(times)}


def _combine(repeats: list[dict]) -> dict:
    """One timing from R repeats of median_ms(): the median of their medians (the shared box's
    noise moves whole repeats), with the extremes and every repeat's median."""
    medians = [r["median_ms"] for r in repeats]
    return {"median_ms": statistics.median(medians), "min_ms": min(r["min_ms"] for r in repeats),
            "max_ms": max(r["max_ms"] for r in repeats), "runs": sum(r["runs"] for r in repeats),
            "repeat_medians_ms": medians}


def run_cpu(out_path: str | None, repeats: int = 1) -> dict:
    from specdec_fast.kernels._cpp_build import load_cpu_ops

    if not load_cpu_ops():
        raise SystemExit("the C++ CPU ops did not build: nothing to compare")
    cases = [(shape, mode, sampling, make_case(*shape)) for shape, mode, sampling in CPU_CASES]
    timings = [{} for _ in cases]  # per case: implementation -> [median_ms() of each repeat]
    for rep in range(repeats):  # repeats outermost, so a noisy spell of the box spreads over cases
        for (shape, mode, sampling, inputs), times in zip(cases, timings):
            for name, fn in implementations("cpu", sampling).items():
                times.setdefault(name, []).append(median_ms(fn, inputs))
            ms = {n: round(t[-1]["median_ms"], 3) for n, t in times.items()}
            print(f"repeat {rep + 1}/{repeats} B={shape[0]} K={shape[1]} V={shape[2]} {mode}: ms {ms}", flush=True)
    results = []
    for (shape, mode, _, _), times in zip(cases, timings):
        row = {"B": shape[0], "K": shape[1], "V": shape[2], "mode": mode}
        row.update({name: _combine(t) for name, t in times.items()})
        row["reference_over_cpp"] = row["reference"]["median_ms"] / row["cpp"]["median_ms"]
        if "transformers-style" in row:
            row["transformers_style_over_cpp"] = row["transformers-style"]["median_ms"] / row["cpp"]["median_ms"]
        results.append(row)
    report = {
        "device": f"cpu: {cpu_model()}",
        **cpu_simd(),
        "threads": torch.get_num_threads(),
        "load_average_at_start": _load_average(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        "torch": torch.__version__,
        "commit": git_commit(),
        "timer": f"median over {repeats} repeat(s) of the median wall time of >= 5 calls (time.perf_counter), "
                 "each after one warm-up",
        "results": results,
    }
    _write(report, out_path)
    return report


PENALTY_SHAPES = [(1, 4, 32000), (8, 4, 32000)]
PENALTY_MODES = [("T=1", {}), ("greedy", dict(temperature=0.0)), ("top_k=50+top_p=0.9", dict(top_k=50, top_p=0.9))]
PENALTIES = dict(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2)


def penalty_case(batch: int, k: int, vocab: int, prompt: int = 512, generated: int = 256, seed: int = 0):
    """make_case's inputs and PenaltyTensors of a prompt of `prompt` tokens and `generated` output tokens."""
    target, draft, tokens = make_case(batch, k, vocab, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    pen = make_penalty_tensors(torch.randint(0, vocab, (batch, prompt), generator=g), vocab, **PENALTIES)
    add_tokens(pen.counts, torch.randint(0, vocab, (batch, generated), generator=g))
    return target, draft, tokens, pen


def run_penalties(out_path: str | None, repeats: int = 1, shapes=PENALTY_SHAPES, budget_s: float = 2.0) -> dict:
    """C++ chain_verify and the draft sampler (K = 0, the drafts so far as prefix) with and
    without penalties: median ms and the ratio, per shape and sampling mode."""
    from specdec_fast.kernels._cpp_build import load_cpu_ops

    if not load_cpu_ops():
        raise SystemExit("the C++ CPU ops did not build: nothing to time")
    results = []
    for batch, k, vocab in shapes:
        target, draft, tokens, pen = penalty_case(batch, k, vocab)
        logits, prefix = draft[:, -1].contiguous(), tokens[:, :-1]
        for mode, sampling in PENALTY_MODES:
            kw = dict(seed=1, backend="cpp", check=False, **sampling)
            calls = {
                "verify": lambda: chain_verify(target, draft, tokens, **kw),
                "verify+penalties": lambda: chain_verify(target, draft, tokens, penalties=pen, **kw),
                "sample": lambda: sample(logits, position=k - 1, **kw),
                "sample+penalties": lambda: sample(logits, position=k - 1, penalties=pen, prefix_tokens=prefix, **kw),
            }
            row = {"B": batch, "K": k, "V": vocab, "mode": mode}
            row.update({name: _combine([median_ms(fn, (), budget_s=budget_s) for _ in range(repeats)])
                        for name, fn in calls.items()})
            row["verify_penalties_over_plain"] = row["verify+penalties"]["median_ms"] / row["verify"]["median_ms"]
            row["sample_penalties_over_plain"] = row["sample+penalties"]["median_ms"] / row["sample"]["median_ms"]
            print(f"B={batch} K={k} V={vocab} {mode}: " + ", ".join(
                f"{n} {row[n]['median_ms']:.3f} ms" for n in calls), flush=True)
            results.append(row)
    report = {
        "device": f"cpu: {cpu_model()}",
        **cpu_simd(),
        "threads": torch.get_num_threads(),
        "load_average_at_start": _load_average(),
        "torch": torch.__version__,
        "commit": git_commit(),
        "penalties": PENALTIES,
        "state": "prompt of 512 random tokens, 256 generated ones; the sampler's prefix: the first K - 1 drafts",
        "timer": f"median over {repeats} repeat(s) of the median wall time of >= 5 calls (time.perf_counter), "
                 "each after one warm-up",
        "gpu": "not measured here (no GPU); prediction in bench/bench_verify.py's docstring",
        "results": results,
    }
    _write(report, out_path)
    return report


def _write(report: dict, out_path: str | None) -> None:
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out_path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cpu", action="store_true", help="time cpp / reference / transformers-style on CPU")
    mode.add_argument("--gpu", action="store_true", help="the GPU table (verify_gpu_table.py): graph replays, do_bench")
    mode.add_argument("--smoke", action="store_true", help="the GPU table's code on tiny shapes under the interpreter")
    mode.add_argument("--penalties", action="store_true", help="C++ verify / sample with and without penalties (CPU)")
    parser.add_argument("--data", choices=("random", "peaked"), default="random", help="logits for --gpu (verify_gpu_table.py)")
    parser.add_argument("--quick", action="store_true", help="--gpu / --smoke: issue 25's rows only (B 1 / 64, V 128256, "
                        "greedy / T=1 / top_k=50 / top_p=0.9)")
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="--gpu / --smoke: no new shape after this many seconds (a device call's limit)")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (CPU: also the C++ OpenMP threads)")
    parser.add_argument("--repeats", type=int, default=1, help="CPU: time every case this many times, report the median")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu:
        run_cpu(args.out, args.repeats)
    elif args.penalties:
        run_penalties(args.out, args.repeats)
    else:
        from verify_gpu_table import run_table

        _write(run_table(smoke=args.smoke, data=args.data, quick=args.quick, budget_s=args.budget_s), args.out)


if __name__ == "__main__":
    main()
