"""One plain decoding step of the paged runner, profiled: where the time of a step goes.

    python bench/profile_step.py [--quick]  # GPU: 8B-shaped Llama, random bf16 weights built on the GPU
                                            # (--quick: no GEMM sweep; --batch B, --ns 1,5: the steps)
    python bench/profile_step.py --tiny     # CPU: a small Llama, no profiler / GPU parts (the test runs it)

GPU mode writes bench/results/profile_step_<device>.json with, per step width N (1 and 5 tokens
per row; B rows at a --context-token context, the context kept fixed by committing 0 tokens):
  - eager wall ms (median) and CUDA-graph replay ms (StepGraph); tok/s under graphs against the
    HBM ceiling = measured bandwidth / weight bytes per step, the bandwidth the larger of a copy's
    (bytes read + written) and a sum's (bytes read): gpu_timing.hbm_ceiling_bandwidth;
  - torch.profiler kernels of one eager step and one graph replay, grouped by family (gemm/gemv,
    cuBLAS split-K reduce, each Triton kernel, torch elementwise / reduce / cat / copy) with
    counts and GPU us per step, GPU-busy ms vs wall;
  - launches per step counted by bench/launch_count.py (torch ops + Triton launches) / layers;
  - every projection GEMM (F.linear, as the runner calls it) timed alone as graph replays for
    1..16 rows: us, bytes (weight + activations), GB/s, and time relative to 1 row (is anything
    worse picked for 2..16 rows?);
  - transformers' own eager decoding step on the same model (DynamicCache) beside ours;
  - the same steps with torch's matmuls through cuBLASLt (torch.backends.cuda.preferred_blas_library,
    set for the step's capture and replays, then put back) under the key "cublaslt" of each step:
    the default cuBLAS path spent 107 us of the H200's 4.79 ms step in 64 split-K reduce launches
    (h200_2026-11-28); whether cuBLASLt's heuristics pick kernels without them is what it shows;
  - the same steps through the GEMV layer (runners/paged_llama.py GEMV_LAYER: Triton skinny
    linears with the norms and SwiGLU fused in) under the key "gemv_layer" of each step, and
    with its products as programmatic dependent launches (GEMV_PDL) under "gemv_layer_pdl".
--tiny writes the same layout with the GPU-only fields left out: eager ms on CPU, the launches
per layer of the Triton path (counted under the interpreter without running it) and the CPU
GEMM sweep, so the script itself is tested in CI.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from gpu_timing import graph_timer, hbm_ceiling_bandwidth, profile_kernels  # noqa: E402

from specdec_fast.runners.hf import cache_keyword, output_cache  # noqa: E402

LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
GEMM_ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def build_model(config: dict, device: str, dtype: torch.dtype):
    """A random-weight LlamaForCausalLM built directly on ``device`` in ``dtype`` (no CPU copy)."""
    import transformers as tf

    torch.manual_seed(0)
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(tf.LlamaConfig(**config), dtype=dtype)
    return model.eval()


def make_step(runner, batch: int, n: int, device):
    """(step(), tokens): one score(N) + commit(0) call; committing nothing keeps the context fixed."""
    tokens = torch.randint(3, runner.vocab_size, (batch, n), device=device)
    keep = torch.zeros(batch, dtype=torch.int32, device=device)

    def step(tokens=tokens):
        logits = runner.score(tokens)
        runner.commit(keep)
        return logits

    return step, tokens


def median_ms(fn, iters: int, sync) -> float:
    fn()
    times = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def weight_bytes_per_step(model) -> int:
    """Bytes of weights a decoding step reads: every parameter except the input embedding
    table, of which it reads one row per token (negligible)."""
    embed = model.get_input_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)


def launch_counts(runner, step) -> dict:
    from launch_count import LaunchCounter

    step()
    with LaunchCounter(run_triton=runner.device.type == "cuda") as counter:
        step()
    layers = len(runner.layers)
    return {"launches_per_step": counter.total, "torch_ops": counter.torch_ops, "triton": counter.triton_launches,
            "per_layer_average": counter.total / layers, "by_name": dict(sorted(counter.by_name.items()))}


def tiny_launches_per_layer() -> dict:
    """Launches per layer of the Triton path (counted without running the kernels) on TINY."""
    from launch_count import launches_per_layer

    from specdec_fast.runners.paged_llama import PagedLlamaRunner

    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: under the interpreter

    def make(layers):
        model = build_model({**TINY, "num_hidden_layers": layers}, device, torch.bfloat16)
        runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=4, backend="triton")
        runner.prefill(torch.randint(3, TINY["vocab_size"], (1, 6), device=device), None)
        return runner

    return {f"N={n}": launches_per_layer(make, torch.randint(3, 100, (1, n), device=device), layer_counts=(1, 2))
            for n in (1, 5)}


def python_us_per_layer(make_step_fn, layer_counts=(1, 5), calls: int = 20, rounds: int = 5) -> float:
    """Host Python cost per decoder layer of one step: cProfile self time of every Python-level
    function (C builtins, i.e. the torch ops' own work, excluded), difference between layer
    counts, per call (the fastest of ``rounds`` rounds: a shared machine only adds time).
    make_step_fn(layers) -> a zero-argument step."""
    import cProfile
    import pstats

    per_call = {}
    for layers in layer_counts:
        fn = make_step_fn(layers)
        fn()
        best = float("inf")
        for _ in range(rounds):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                fn()
            prof.disable()
            stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
            best = min(best, sum(v[2] for (file, _, _), v in stats.items() if file.endswith(".py")) / calls)
        per_call[layers] = best
    low, high = layer_counts
    return 1e6 * (per_call[high] - per_call[low]) / (high - low)


def host_cost_per_layer(calls: int = 20, rounds: int = 5) -> dict:
    """Python us per layer (python_us_per_layer) of a one-token step on TINY in float32 CPU:
    our runner's Triton path (launches not run: NoTritonRun), its CPU default path (C++ ops),
    and transformers' own forward with its DynamicCache (the eager baseline of issue 13).
    cProfile's own per-call overhead weighs more on code with more Python calls."""
    from launch_count import NoTritonRun

    from specdec_fast.runners.paged_llama import PagedLlamaRunner

    def ours(backend):
        def make(layers):
            model = build_model({**TINY, "num_hidden_layers": layers}, "cpu", torch.float32)
            runner = PagedLlamaRunner(model, max_new_tokens=200, num_draft_tokens=0, backend=backend)
            runner.prefill(torch.randint(3, 100, (1, 6)), None)
            step, _ = make_step(runner, 1, 1, "cpu")
            return step
        return make

    def transformers_step(layers):
        model = build_model({**TINY, "num_hidden_layers": layers}, "cpu", torch.float32)
        ids = torch.randint(3, 100, (1, 6))
        name = cache_keyword(model)  # transformers 5.24 renamed past_key_values to cache
        with torch.no_grad():
            cache = output_cache(model(input_ids=ids, use_cache=True))

        def step():
            with torch.no_grad():
                model(input_ids=ids[:, -1:], use_cache=True, **{name: cache})
            cache.crop(-1)  # drop the step's token (negative: works in transformers 4.x and 5.x)
        return step

    if torch.cuda.is_available():  # the Triton path on CPU tensors needs the interpreter
        triton_path = None
    else:
        with NoTritonRun():
            triton_path = python_us_per_layer(ours("triton"), calls=calls, rounds=rounds)
    return {"ours_triton_path": triton_path, "ours_cpu_path": python_us_per_layer(ours(None), calls=calls, rounds=rounds),
            "transformers": python_us_per_layer(transformers_step, calls=calls, rounds=rounds)}


def llama_8b_launches_on_meta(ns=(1, 5)) -> dict:
    """Launches per step of the 8B-shaped model's Triton path, counted on the meta device (no
    memory, no compute; the Triton launches counted, not run): the GPU step's launch count
    without a GPU (cuBLAS split-K reduce kernels aside)."""
    from launch_count import LaunchCounter

    from specdec_fast.runners.paged_llama import PagedLlamaRunner

    model = build_model(LLAMA_8B, "meta", torch.bfloat16)
    out = {}
    with LaunchCounter(run_triton=False):
        runner = PagedLlamaRunner(model, max_new_tokens=64, num_draft_tokens=max(ns) - 1, backend="triton")
        runner.prefill(torch.randint(3, 1000, (1, 128), device="meta"), None)
    for n in ns:
        step, _ = make_step(runner, 1, n, "meta")
        for gemv in (False, True):  # the cuBLAS layer, then the GEMV layer (GEMV_LAYER)
            runner.set_gemv_layer(gemv)
            with LaunchCounter(run_triton=False):
                step()
            with LaunchCounter(run_triton=False) as counter:
                step()
            out[f"N={n}" + (" gemv_layer" if gemv else "")] = {
                "launches_per_step": counter.total, "layers": LLAMA_8B["num_hidden_layers"],
                "by_name": dict(sorted(counter.by_name.items()))}
    runner.set_gemv_layer(False)
    return out


# ---------------------------------------------------------------------------------- GEMM sweep
def projection_shapes(config: dict) -> dict:
    """name -> (out, in) of the runner's matrix products (fused q/k/v and gate/up)."""
    h, f = config["hidden_size"], config["intermediate_size"]
    d = h // config["num_attention_heads"]
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * d
    return {"qkv": (qkv, h), "o": (h, h), "gate_up": (2 * f, h), "down": (h, f), "lm_head": (config["vocab_size"], h)}


def gemm_sweep(config: dict, device: str, dtype, rows=GEMM_ROWS, timer=None) -> list:
    """F.linear(x [M, in], W [out, in]) per shape and row count M: us, bytes, GB/s, us / us(M=1)."""
    import torch.nn.functional as F

    out = []
    for name, (n_out, n_in) in projection_shapes(config).items():
        weight = torch.randn(n_out, n_in, device=device, dtype=dtype)
        one = None
        for m in rows:
            x = torch.randn(m, n_in, device=device, dtype=dtype)
            us = timer(lambda: F.linear(x, weight)) if timer else 1e3 * median_ms(lambda: F.linear(x, weight), 5, lambda: None)
            one = us if m == 1 else one
            nbytes = (n_out * n_in + m * n_in + m * n_out) * weight.element_size()
            out.append({"gemm": name, "out": n_out, "in": n_in, "rows": m, "us": us, "bytes": nbytes,
                        "GBps": nbytes / us / 1e3, "vs_1_row": us / one})
        del weight
    return out


# ---------------------------------------------------------------------------------- GPU parts
def hf_eager_ms(model, context: int, batch: int, iters: int) -> float:
    """transformers' own eager decoding step (one token per row, DynamicCache at ``context``)."""
    device = model.device
    ids = torch.randint(3, model.config.vocab_size, (batch, context), device=device)
    tok = ids[:, -1:]
    with torch.no_grad():
        name = cache_keyword(model)  # transformers 5.24 renamed past_key_values to cache
        cache = output_cache(model(input_ids=ids, use_cache=True))
        times = []
        for _ in range(iters + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model(input_ids=tok, use_cache=True, **{name: cache})
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            cache.crop(-1)  # back to the context (negative: works in transformers 4.x and 5.x)
    return 1e3 * statistics.median(times[1:])


def gemv_layer_row(runner, args, n: int, ceiling: float, sync, pdl: bool = False) -> dict:
    """One N-token step through the cuBLAS layer and the GEMV layer (runners/paged_llama.py; pdl:
    its products as programmatic dependent launches, GEMV_PDL): graph ms, tok/s and fraction of
    the ceiling, launches, kernels; the largest logit difference between the two layers relative
    to the logits' scale (bf16 roundings differ, tokens rarely; with pdl, a race would show here)."""
    step, tokens = make_step(runner, args.batch, n, "cuda")
    runner.set_gemv_layer(False)
    base = step(tokens).float()
    runner.set_gemv_layer(True, pdl=pdl)
    fused = step(tokens).float()
    row = {"logits_max_abs_diff_over_scale": ((fused - base).abs().max() / base.abs().max()).item(),
           "argmax_agreement": (fused.argmax(-1) == base.argmax(-1)).float().mean().item()}
    name = f"gemv{' pdl' if pdl else ''} N={n}"
    return {**row, **timed_step(runner, step, tokens, n, args, ceiling, sync, name, profile_eager=False)}


def blas_row(runner, args, n: int, ceiling: float, sync, library: str = "cublaslt") -> dict:
    """One N-token step with torch's matmuls through ``library`` (preferred_blas_library, for the
    step's warm-up, capture and replays; the caller's choice put back after): graph ms, tok/s and
    fraction of the ceiling, kernels of a replay (are cuBLAS's split-K reduces gone?), and the
    largest logit difference from the default library relative to the logits' scale (another
    product order: bf16 roundings differ)."""
    step, tokens = make_step(runner, args.batch, n, "cuda")
    base = step(tokens).float()
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        other = step(tokens).float()
        row = {"library": library, "logits_max_abs_diff_over_scale": ((other - base).abs().max() / base.abs().max()).item(),
               "argmax_agreement": (other.argmax(-1) == base.argmax(-1)).float().mean().item()}
        return {**row, **timed_step(runner, step, tokens, n, args, ceiling, sync, f"{library} N={n}", profile_eager=False)}
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def timed_step(runner, step, tokens, n: int, args, ceiling: float, sync, name: str, profile_eager: bool = True) -> dict:
    """One N-token step, eager and as a captured graph: ms (median of args.iters), tok/s and the
    fraction of the HBM ceiling (N = 1), launches, kernels of a graph replay (and of an eager step)."""
    from specdec_fast.engine.graphs import StepGraph, state_tensors

    row = {"eager_ms": median_ms(step, args.iters, sync)}
    graph = StepGraph(lambda t: step(t), name=name, capture=True, state=lambda: state_tensors({"runner": runner}),
                      warmup=2)
    for _ in range(3):
        graph(tokens)
    row["graph_ms"] = median_ms(lambda: graph(tokens), args.iters, sync)
    row["tok_per_s_graph"] = args.batch * n / (row["graph_ms"] / 1e3) if n == 1 else None
    row["fraction_of_hbm_ceiling"] = (1e3 / row["graph_ms"]) / ceiling if n == 1 else None
    row["launches"] = launch_counts(runner, step)
    if profile_eager:
        row["profile_eager"] = profile_kernels(step)
    row["profile_graph"] = profile_kernels(lambda: graph(tokens))
    return row


def run_gpu(args, save=lambda report: None) -> dict:
    """The GPU report (module doc); save(report) after every step row, so a run cut short by a
    device call's limit keeps what it measured."""
    from machine import versions

    from specdec_fast.runners.paged_llama import PagedLlamaRunner

    device = "cuda"
    config = LLAMA_8B
    model = build_model(config, device, torch.bfloat16)
    weights = weight_bytes_per_step(model)
    bandwidth = hbm_ceiling_bandwidth(device)
    ceiling = bandwidth["ceiling_Bps"] / weights  # steps (tokens per row) per second
    report = {"device": torch.cuda.get_device_name(), **versions(), "model": "Llama-3-8B-shaped, random bf16",
              "config": {k: v for k, v in config.items() if k != "rope_parameters"}, "batch": args.batch,
              "context": args.context, "copy_bandwidth_Bps": bandwidth["copy_Bps"],
              "read_bandwidth_Bps": bandwidth["read_Bps"], "hbm_ceiling_basis": bandwidth["basis"],
              "weight_bytes_per_step": weights, "hbm_ceiling_steps_per_s": ceiling, "steps": {}}
    runner = PagedLlamaRunner(model, max_new_tokens=64, num_draft_tokens=max(args.ns) - 1)
    runner.prefill(torch.randint(3, config["vocab_size"], (args.batch, args.context), device=device), None)
    report["runner"] = {"kernels": runner.kernels, "fuse_projections": runner.fuse_projections}
    sync = torch.cuda.synchronize
    for n in args.ns:
        step, tokens = make_step(runner, args.batch, n, device)
        row = timed_step(runner, step, tokens, n, args, ceiling, sync, f"plain N={n}")
        report["steps"][f"N={n}"] = row
        save(report)
        print(json.dumps({k: v for k, v in row.items() if not k.startswith(("profile", "launches"))}), flush=True)
    for n in args.ns:  # the same steps with cuBLASLt's matmuls (issue 25: cuBLAS's split-K reduces)
        row = report["steps"][f"N={n}"]
        try:  # never run on a GPU: an error is recorded, the report goes on
            row["cublaslt"] = blas_row(runner, args, n, ceiling, sync)
        except Exception as exc:  # noqa: BLE001
            row["cublaslt"] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        save(report)
        print(json.dumps({f"N={n} cublaslt": {k: v for k, v in row["cublaslt"].items()
                                              if not k.startswith(("profile", "launches"))}}), flush=True)
    if runner.gemv_layer_reason() is None:  # the same steps through the GEMV layer (issue 25)
        pdl_error = None
        for key, pdl in (("gemv_layer", False), ("gemv_layer_pdl", True)):  # every N without PDL first
            for n in args.ns:
                row = report["steps"][f"N={n}"]
                try:  # the PDL form has never run on a GPU: its error is recorded, not fatal to the report
                    row[key] = gemv_layer_row(runner, args, n, ceiling, sync, pdl=pdl)
                except Exception as exc:  # noqa: BLE001
                    if not pdl:
                        raise
                    row[key] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                    pdl_error = row[key]["error"]
                    break
                save(report)
                print(json.dumps({f"N={n} {key}": {k: v for k, v in row[key].items()
                                                    if not k.startswith(("profile", "launches"))}}), flush=True)
        if pdl_error:  # a fault may leave the CUDA context unusable: keep what was measured
            report["skipped_after_pdl_error"] = "hf_eager_ms, gemm sweep"
            return report
        runner.set_gemv_layer(False, pdl=False)
    del runner
    torch.cuda.empty_cache()
    report["hf_eager_ms"] = hf_eager_ms(model, args.context, args.batch, args.iters)
    one = report["steps"].get("N=1")
    if one:
        report["eager_speed_vs_transformers"] = report["hf_eager_ms"] / one["eager_ms"]
        if "N=5" in report["steps"]:
            report["ratio_N5_vs_N1_graph"] = report["steps"]["N=5"]["graph_ms"] / one["graph_ms"]
    del model
    torch.cuda.empty_cache()
    save(report)
    if not args.quick:
        report["gemm"] = gemm_sweep(config, device, torch.bfloat16, timer=graph_timer)
    report["targets"] = {"graph_fraction_of_ceiling": 0.80, "eager_vs_transformers": 1.0, "N5_vs_N1": 1.08}
    return report


def run_tiny(args) -> dict:
    from machine import cpu_model, versions

    from specdec_fast.engine.graphs import StepGraph, state_tensors
    from specdec_fast.runners.paged_llama import PagedLlamaRunner

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steadier on a shared box; the CPU numbers only exercise the code
    model = build_model(TINY, "cpu", torch.float32)
    runner = PagedLlamaRunner(model, max_new_tokens=16, num_draft_tokens=max(args.ns) - 1)
    runner.prefill(torch.randint(3, TINY["vocab_size"], (args.batch, args.context)), None)
    report = {"device": f"cpu: {cpu_model()}", **versions(), "model": "tiny Llama, random float32",
              "config": {k: v for k, v in TINY.items() if k != "rope_parameters"}, "batch": args.batch,
              "context": args.context, "weight_bytes_per_step": weight_bytes_per_step(model),
              "runner": {"kernels": runner.kernels, "fuse_projections": runner.fuse_projections}, "steps": {}}
    for n in args.ns:
        step, tokens = make_step(runner, args.batch, n, "cpu")
        twin = StepGraph(lambda t: step(t), name=f"plain N={n}", capture=False, state=lambda: state_tensors({"runner": runner}),
                         warmup=1)
        for _ in range(3):  # the CPU twin of a capture: graph-safety checks of the step
            twin(tokens)
        report["steps"][f"N={n}"] = {"eager_ms": median_ms(step, args.iters, lambda: None),
                                     "launches": launch_counts(runner, step)}
    report["triton_path_launches_per_layer"] = tiny_launches_per_layer()
    if not torch.cuda.is_available():  # the interpreter lets backend='triton' take meta tensors
        report["llama_8b_triton_path_launches"] = llama_8b_launches_on_meta(tuple(args.ns))
    report["host_python_us_per_layer"] = host_cost_per_layer(calls=4 * args.iters, rounds=max(2, args.iters))
    report["gemm"] = gemm_sweep(TINY, "cpu", torch.float32, rows=(1, 2, 5))
    torch.set_num_threads(threads)
    return report


def write(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a small model on CPU (no GPU parts)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",")], default=[1, 5])
    parser.add_argument("--iters", type=int, default=None, help="timed calls per measurement (median)")
    parser.add_argument("--quick", action="store_true", help="GPU: leave out the GEMM sweep (the steps only)")
    parser.add_argument("--out", help="JSON path (default bench/results/profile_step_<device>.json)")
    args = parser.parse_args(argv)

    def output(tag: str) -> Path:
        return Path(args.out or ROOT / f"bench/results/profile_step_{tag}.json")

    if args.tiny:
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton path's launches, counted on CPU
        args.iters = args.iters or 5  # --iters 5: host cost over 5 rounds of 20 calls
        args.context = min(args.context, 64)
        report = run_tiny(args)
        tag = "tiny_cpu"
    else:
        if not torch.cuda.is_available():
            sys.exit("the GPU mode needs a CUDA device (--tiny runs on CPU)")
        args.iters = args.iters or 30
        tag = torch.cuda.get_device_name().lower().replace(" ", "_").replace("/", "_")
        report = run_gpu(args, save=lambda partial: write(partial, output(tag)))
    out = output(tag)
    write(report, out)
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
