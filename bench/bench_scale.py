"""Scale benchmark (issue 11): an 8B-shaped target on the GPU, side by side in one run.

Models (bench/scale_models.py): a Llama-3-8B-shaped target (vocab 128256, hidden 4096, 32 layers,
GQA 32/8) with random bf16 weights built on the device, and a draft made of the target's own
embedding, first D layers, final norm and head (shared modules). ACCEPTANCE IS SET BY SCALING the
target's residual writes (o_proj, down_proj) until the measured greedy agreement of draft and
target is ~0.6 / 0.8 / 0.9: these are speed stand-ins, not language models.

Per (agreement, batch, mode), round robin, best of --repeats after one warm-up call each:
    hf_generate     transformers model.generate (target only)
    hf_assisted     transformers assisted generation with the same draft (batch 1 only)
    ours_plain      specdec_fast.generate, no draft (K = 0)
    ours_K<k>       specdec_fast.generate with the draft, K = k
Modes: greedy, sample_topk50 (T=1, transformers' default top_k=50), sample_topk0 (T=1, no top-k).
Per run: tokens/s (all new tokens / wall time, prefill and graph capture included; the JSON also
has loop_tokens_per_s without them), alpha, c, Leviathan Theorem 3.8's predicted speedup from
that run's alpha and c beside the measured one (over ours_plain), iterations run vs needed (the run-ahead bound, run_ahead.py), host ms per
iteration (wall - prefill - capture - draft - target phases), and tokens/s against the HBM
ceiling of plain decoding: batch * the measured ceiling bandwidth / weight bytes read per step (on
CUDA the larger of a copy's and a read's rate, as bench/profile_step.py; runs before 2026-11-27
used an eager copy's rate, read + written: bench/scale_models.py ceiling_bandwidth).

    python bench/bench_scale.py --preset headline          # B=1 greedy, agreement 0.8, K 2..8, all methods
    python bench/bench_scale.py --preset batch|sampling|agreement|full
    python bench/bench_scale.py --tiny                     # CPU smoke run: a 4-layer hidden-64 model
    options: --agreements 0.8 --batches 1,8,32 --ks 2,3,4 --modes greedy,sample_topk0
             --methods hf,assisted,plain,spec --graphs on|off|both --new-tokens 128 --prompt-len 128
             --draft-layers 2 --repeats 3 --budget-s 540 --out FILE

--budget-s: no new (agreement, batch, mode) group starts after that many seconds; the JSON is
rewritten after every group, so a run cut short (a 10-minute GPU call) keeps what it measured.
Writes bench/results/scale_<device>[_<preset>].json and a plot beside it (bench/plot_scale.py).
Not a test (tests/test_bench_scale.py runs --tiny).
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_e2e import environment, timed_round_robin  # noqa: E402
import scale_models as sm  # noqa: E402

MODES = {
    "greedy": dict(do_sample=False),
    "sample_topk50": dict(do_sample=True, temperature=1.0, top_k=50, top_p=1.0),
    "sample_topk0": dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0),
}
PRESETS = {  # the targets first: a preset fits one 10-minute GPU call
    "headline": dict(agreements=[0.8], batches=[1], modes=["greedy"], ks=[2, 3, 4, 5, 6, 7, 8]),
    "batch": dict(agreements=[0.8], batches=[8, 32], modes=["greedy"], ks=[3, 4, 5], methods=["hf", "plain", "spec"]),
    "sampling": dict(agreements=[0.8], batches=[1], modes=["sample_topk50", "sample_topk0"], ks=[3, 4, 5]),
    "agreement": dict(agreements=[0.6, 0.9], batches=[1], modes=["greedy"], ks=[2, 3, 4, 5, 6, 7, 8]),
    "full": dict(agreements=[0.6, 0.8, 0.9], batches=[1, 8, 32], modes=list(MODES), ks=[2, 3, 4, 5, 6, 7, 8]),
}
TINY = dict(agreements=[0.8], batches=[1, 2], modes=["greedy", "sample_topk0"], ks=[2, 3], new_tokens=12, prompt_len=8,
            draft_layers=1, repeats=1)
DEFAULTS = dict(agreements=[0.8], batches=[1], modes=["greedy"], ks=[2, 3, 4, 5, 6, 7, 8],
                methods=["hf", "assisted", "plain", "spec"], new_tokens=128, prompt_len=128, draft_layers=2, repeats=3)
# Issue 11's targets (H100/H200, agreement 0.8, greedy): batch -> (what, minimum)
TARGETS = {1: [("of_theorem_3_8", 0.9), ("x_own_plain", 2.0), ("x_hf_generate", 5.0), ("x_hf_assisted", 3.0)],
           8: [("x_own_plain", 1.6)], 32: [("x_own_plain", 1.4)]}


def prefix_match(a: torch.Tensor, b: torch.Tensor) -> list:
    """Per row: how many leading new tokens a and b [B, N] share."""
    same = (a == b).long().cumprod(1)
    return same.sum(1).tolist()


def methods_for(target, draft, batch: int, mode: str, args, graphs):
    """[(name, k, call(ids, mask, new) -> tokens or (tokens, stats))]."""
    from specdec_fast.api import generate

    opts = MODES[mode]

    def hf(ids, mask, new, **extra):
        torch.manual_seed(0)
        with torch.inference_mode():
            return target.generate(ids, attention_mask=mask, max_new_tokens=new, pad_token_id=0, eos_token_id=None,
                                   **opts, **extra)

    def ours(ids, mask, new, **extra):
        return generate(target, ids, mask, max_new_tokens=new, pad_token_id=0, eos_token_id=None, return_stats=True,
                        seed=0, runner="paged", cuda_graphs=graphs, **opts, **extra)

    table = []
    if "hf" in args.methods:
        table.append(("hf_generate", None, hf))
    if "assisted" in args.methods and batch == 1:  # transformers' assisted generation: batch 1 only
        table.append(("hf_assisted", None, lambda i, m, n: hf(i, m, n, assistant_model=draft)))
    if "plain" in args.methods:
        table.append(("ours_plain", 0, ours))
    if "spec" in args.methods:
        for k in args.ks:
            table.append((f"ours_K{k}", k, lambda i, m, n, k=k: ours(i, m, n, assistant_model=draft, num_assistant_tokens=k)))
    return table


def run_group(target, draft, *, agreement: dict, batch: int, mode: str, graphs, args, device, ceiling_b1: float) -> list:
    """One (agreement, batch, mode) group: warm-up, round robin, rows with the derived ratios."""
    vocab = target.config.vocab_size
    gen = torch.Generator().manual_seed(1000 + batch)
    ids = torch.randint(3, vocab, (batch, args.prompt_len), generator=gen).to(device)
    mask = torch.ones_like(ids)
    rows, by_name, working = [], {}, []
    for name, k, call in methods_for(target, draft, batch, mode, args, graphs):
        try:  # warm-up: Triton compiles, cuBLAS workspaces, allocator; a method that fails is reported, not fatal
            call(ids, mask, 8)
            working.append((name, k, call))
        except Exception as exc:  # noqa: BLE001 (e.g. a CUDA graph capture that fails for one K)
            rows.append(dict(goal_agreement=agreement["goal"], agreement=agreement["agreement"], batch=batch, mode=mode,
                             cuda_graphs=graphs, method=name, k=k, error=f"{type(exc).__name__}: {exc}"[:2000]))
            print(f"  {name:12s} FAILED: {rows[-1]['error'][:300]}", flush=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
    table = working
    measured = timed_round_robin([lambda call=call: call(ids, mask, args.new_tokens) for _, _, call in table], device,
                                 args.repeats)
    for (name, k, _), (times, out) in zip(table, measured):
        tokens, stats = out if isinstance(out, tuple) else (out, None)
        seconds = min(times)
        row = dict(goal_agreement=agreement["goal"], agreement=agreement["agreement"], residual_scale=agreement["scale"],
                   batch=batch, mode=mode, cuda_graphs=graphs, method=name, k=k, seconds=seconds, seconds_all=times,
                   tokens_per_s=batch * args.new_tokens / seconds)
        row["of_hbm_ceiling"] = row["tokens_per_s"] / (batch * ceiling_b1)
        row["new_tokens"] = tokens[:, args.prompt_len:]
        if stats is not None:
            row.update(iterations=stats.iterations, iterations_needed=stats.loop.get("iterations_needed"),
                       polls=stats.loop.get("polls"), waits=stats.loop.get("waits"), host_ms_per_iter=stats.host_ms_per_iter,
                       wall_s=stats.wall_s, prefill_s=stats.prefill_s, capture_s=stats.capture_s, draft_s=stats.draft_s,
                       target_s=stats.target_s, graph_mode=stats.graph_mode, accepted_hist=stats.accepted_hist)
            # Without the prefill and the per-call graph capture (each generate() call captures its own).
            row["loop_tokens_per_s"] = batch * args.new_tokens / max(stats.wall_s - stats.prefill_s - stats.capture_s, 1e-9)
            if stats.k:
                row.update(alpha=stats.alpha, cost_ratio=stats.cost_ratio, mean_accepted_length=stats.mean_accepted_length,
                           predicted_speedup=stats.predicted_speedup)
        by_name[name] = row
        rows.append(row)
    plain, hf, assisted = (by_name.get(n) for n in ("ours_plain", "hf_generate", "hf_assisted"))
    for row in rows:
        if "error" in row:
            continue
        for key, base in (("x_own_plain", plain), ("x_hf_generate", hf), ("x_hf_assisted", assisted)):
            if base is not None:
                row[key] = row["tokens_per_s"] / base["tokens_per_s"]
        if "predicted_speedup" in row and "x_own_plain" in row:
            row["of_theorem_3_8"] = row["x_own_plain"] / row["predicted_speedup"]
        if mode == "greedy" and hf is not None:
            row["greedy_prefix_match_vs_hf"] = prefix_match(row["new_tokens"].cpu(), hf["new_tokens"].cpu())
    for row in rows:
        if "error" not in row:
            del row["new_tokens"]
            print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    line = f"  {row['method']:12s} {row['tokens_per_s']:9.1f} tok/s  {100 * row['of_hbm_ceiling']:5.1f}% of HBM ceiling"
    for key, label in (("x_own_plain", "plain"), ("x_hf_generate", "hf"), ("x_hf_assisted", "assisted")):
        if key in row and row["method"] not in ("ours_plain", "hf_generate", "hf_assisted"):
            line += f"  x{row[key]:.2f} {label}"
    if "alpha" in row:
        line += (f"  | alpha {row['alpha']:.3f} c {row['cost_ratio']:.3f} Thm3.8 x{row['predicted_speedup']:.2f}"
                 + (f" (measured {100 * row['of_theorem_3_8']:.0f}% of it)" if "of_theorem_3_8" in row else ""))
    if "iterations" in row:
        line += f"  | iterations {row['iterations']} (needed {row['iterations_needed']}), host {row['host_ms_per_iter']:.3f} ms/iter"
    return line


def check_targets(rows: list) -> list:
    """Issue 11's targets at agreement ~0.8, greedy: (batch, what, best measured, minimum, met)."""
    verdicts = []
    for batch, checks in TARGETS.items():
        spec = [r for r in rows if r["goal_agreement"] == 0.8 and r["mode"] == "greedy" and r["batch"] == batch
                and r["method"].startswith("ours_K") and "error" not in r]
        if not spec:
            continue
        best = max(spec, key=lambda r: r["tokens_per_s"])
        for key, minimum in checks:
            if key in best:
                verdicts.append(dict(batch=batch, method=best["method"], what=key, measured=best[key], minimum=minimum,
                                     met=best[key] >= minimum))
    return verdicts


def parse(argv):
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    words = lambda s: s.split(",")  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run on a tiny model (tests use it)")
    ap.add_argument("--device")
    ap.add_argument("--agreements", type=floats)
    ap.add_argument("--batches", type=ints)
    ap.add_argument("--ks", type=ints)
    ap.add_argument("--modes", type=words)
    ap.add_argument("--methods", type=words)
    ap.add_argument("--graphs", choices=["on", "off", "both"], default="on", help="ours with CUDA graphs (CUDA only)")
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--draft-layers", type=int)
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    for source in (PRESETS.get(args.preset, {}), TINY if args.tiny else {}, DEFAULTS):
        for key, value in source.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
    unknown = set(args.modes) - set(MODES)
    if unknown:
        ap.error(f"unknown mode(s) {sorted(unknown)}; choose from {list(MODES)}")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    graph_options = {"on": [True], "off": [False], "both": [False, True]}[args.graphs] if device.type == "cuda" else [False]
    shape = sm.TINY if args.tiny else sm.LLAMA3_8B
    start = time.perf_counter()
    target = sm.build_target(shape, device)
    draft = sm.draft_of(target, args.draft_layers)
    ceiling = sm.ceiling_bandwidth(device)
    bandwidth = ceiling["ceiling_Bps"]
    weight_bytes = sm.weight_bytes_per_step(target)
    ceiling_b1 = bandwidth / weight_bytes
    env = environment(device)
    stem = f"scale_{env['device_name'].lower().replace(' ', '_')}" + (f"_{args.preset}" if args.preset else "")
    stem += "_tiny" if args.tiny else ""
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"{stem}.json"
    result = dict(env, models=sm.describe(shape, args.draft_layers), copy_bandwidth_Bps=ceiling["copy_Bps"],
                  read_bandwidth_Bps=ceiling["read_Bps"], ceiling_bandwidth_Bps=bandwidth,
                  ceiling_basis=ceiling["basis"],
                  weight_bytes_per_step=weight_bytes, ceiling_tok_s_b1=ceiling_b1, new_tokens=args.new_tokens,
                  prompt_len=args.prompt_len, modes={m: MODES[m] for m in args.modes}, preset=args.preset,
                  acceptance_note="acceptance is SET by scaling the target's residual writes (o_proj, down_proj): "
                                  "random-weight speed stand-ins, not language models",
                  build_s=time.perf_counter() - start, calibrations=[], rows=[], stopped_early=None)
    print(f"{env['device']}: {result['models']}", flush=True)
    print(f"ceiling bandwidth {bandwidth / 1e12:.2f} TB/s ({ceiling['basis']}), {weight_bytes / 1e9:.2f} GB of weights "
          f"per step: plain-decoding HBM ceiling {ceiling_b1:.1f} tok/s per row; built in {result['build_s']:.1f} s",
          flush=True)
    gen = torch.Generator().manual_seed(7)
    calib_tokens = torch.randint(3, shape["vocab_size"], (4, min(64, args.prompt_len * 2)), generator=gen).to(device)
    for goal in args.agreements:
        agreement = sm.calibrate(target, draft, goal, calib_tokens)
        result["calibrations"].append(agreement)
        print(f"\nACCEPTANCE IS SET BY SCALING: the target's o_proj/down_proj weights drawn with std x{agreement['scale']:.3g} "
              f"-> measured greedy agreement draft/target {agreement['agreement']:.3f} (wanted {goal})", flush=True)
        for batch in args.batches:
            for mode in args.modes:
                for graphs in graph_options:
                    elapsed = time.perf_counter() - start
                    if elapsed > args.budget_s:
                        result["stopped_early"] = f"budget {args.budget_s} s reached after {elapsed:.0f} s"
                        continue
                    print(f"agreement {agreement['agreement']:.2f}, batch {batch}, {mode}, cuda_graphs={graphs}, "
                          f"{args.new_tokens} new tokens, prompt {args.prompt_len}:", flush=True)
                    result["rows"] += run_group(target, draft, agreement=agreement, batch=batch, mode=mode, graphs=graphs,
                                                args=args, device=device, ceiling_b1=ceiling_b1)
                    result["targets"] = [] if args.tiny else check_targets(result["rows"])
                    result["total_s"] = time.perf_counter() - start
                    out.write_text(json.dumps(result, indent=1))
    result["targets"] = [] if args.tiny else check_targets(result["rows"])  # the targets are for the 8B shape
    for v in result["targets"]:
        print(f"target B={v['batch']} {v['what']}: {v['method']} {v['measured']:.2f} (>= {v['minimum']}) "
              f"{'met' if v['met'] else 'NOT met'}")
    if result["stopped_early"]:
        print(f"stopped early: {result['stopped_early']}")
    result["total_s"] = time.perf_counter() - start
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    try:
        from plot_scale import plot

        print(f"wrote {plot(out)}")
    except ImportError as exc:  # matplotlib missing on the GPU machine: the JSON is the result
        print(f"no plot ({exc})")
    return result


if __name__ == "__main__":
    main()
