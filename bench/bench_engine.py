"""What a generate() call costs beyond prefill and decoding, its first call against the later ones
(specdec_fast/engine/engine.py: runners, KV pools and CUDA graphs built once, reused by later calls).

For each number of new tokens N (default 32, 128, 512) and each method (draft model K, plain
decoding), in one run:
    first call   the call that builds the engine (runners, KV pool) and captures its graphs:
                 specdec_fast.release_engines(target) before it, i.e. what every call cost
                 before the engine (each built its runners and captured its graphs anew)
    later calls  the same call again on the cached engine, --calls times (median)
and for each: wall time, prefill_s, capture_s, decode_s (draft + target phases) and
overhead_s = wall - prefill - decode (capture included): the per-call cost the engine removes.
Tokens/s and the speedup of the draft-model method over plain decoding, first and later, beside
Leviathan's Theorem 3.8 prediction from the run's measured alpha and c.

    python bench/bench_engine.py                # CPU: the demo pair, a held-out prompt, greedy
    python bench/bench_engine.py --gpu          # CUDA: the 8B-shaped pair at greedy agreement 0.8
                                                # (bench/scale_models.py), CUDA graphs, bf16

Writes bench/results/engine_<device>.json. EOS is off (every call makes exactly N tokens).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import specdec_fast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, versions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def cpu_models():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec_fast.pair import held_out_prompts

    target_dir, draft_dir = specdec_fast.demo_pair()
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    target.generation_config.eos_token_id = None
    ids = AutoTokenizer.from_pretrained(target_dir)(held_out_prompts(1), return_tensors="pt").input_ids
    return target, draft, ids, "demo pair (3.8M Llama code model + 0.8M draft), float32"


def gpu_models(agreement: float, prompt_len: int):
    import scale_models as sm

    device = torch.device("cuda")
    target = sm.build_target(sm.LLAMA3_8B, device)
    draft = sm.draft_of(target, 2)
    gen = torch.Generator().manual_seed(7)
    calib = torch.randint(3, sm.LLAMA3_8B["vocab_size"], (4, 64), generator=gen).to(device)
    got = sm.calibrate(target, draft, agreement, calib)
    ids = torch.randint(3, sm.LLAMA3_8B["vocab_size"], (1, prompt_len), generator=gen).to(device)
    return target, draft, ids, f"Llama-3-8B-shaped random bf16 target, 2-layer draft, greedy agreement {got['agreement']:.3f}"


def call(target, ids, new: int, extra: dict, graphs) -> dict:
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    _, stats = specdec_fast.generate(target, ids, max_new_tokens=new, do_sample=False, return_stats=True,
                                     cuda_graphs=graphs, pad_token_id=0, **extra)
    if ids.is_cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    decode = stats.draft_s + stats.target_s
    return dict(wall_s=wall, prefill_s=stats.prefill_s, capture_s=stats.capture_s, decode_s=decode,
                overhead_s=wall - stats.prefill_s - decode, tokens_per_s=stats.new_tokens / wall,
                graphs_captured=stats.graphs_captured, alpha=stats.alpha, predicted_speedup=stats.predicted_speedup,
                host_ms_per_iter=stats.host_ms_per_iter, iterations=stats.iterations,
                mean_k=getattr(stats, "mean_k", None))


def median_row(rows: list) -> dict:
    return {key: statistics.median(r[key] for r in rows) if isinstance(rows[0][key], (int, float)) else rows[0][key]
            for key in rows[0]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--new-tokens", default="32,128,512")
    ap.add_argument("--calls", type=int, default=5, help="later calls per configuration (median)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--agreement", type=float, default=0.8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if not args.gpu:
        torch.set_num_threads(args.threads)
    target, draft, ids, models = gpu_models(args.agreement, args.prompt_len) if args.gpu else cpu_models()
    graphs = None  # generate()'s default: CUDA graphs where they can run (eager on CPU)
    device = torch.cuda.get_device_name() if args.gpu else cpu_model()
    # "adaptive": the engine's adaptive schedule picks K per step (engine/schedule.py)
    methods = {"draft": dict(assistant_model=draft, num_assistant_tokens=args.k),
               "adaptive": dict(assistant_model=draft, num_assistant_tokens_schedule="adaptive"), "plain": {}}
    result = dict(device=device, versions=versions(), models=models, prompt_tokens=ids.shape[1], k=args.k,
                  calls=args.calls, threads=None if args.gpu else args.threads, rows=[])
    for new in [int(n) for n in args.new_tokens.split(",")]:
        for name, extra in methods.items():
            specdec_fast.release_engines(target)  # the first call builds: the cost of every call before the engine
            first = call(target, ids, new, extra, graphs)
            later = median_row([call(target, ids, new, extra, graphs) for _ in range(args.calls)])
            result["rows"].append(dict(method=name, new_tokens=new, first=first, later=later))
            print(f"{name:5s} N={new:4d}: first {first['wall_s'] * 1e3:8.1f} ms ({first['tokens_per_s']:7.1f} tok/s, "
                  f"overhead {first['overhead_s'] * 1e3:6.2f} ms, capture {first['capture_s'] * 1e3:6.2f} ms) | later "
                  f"{later['wall_s'] * 1e3:8.1f} ms ({later['tokens_per_s']:7.1f} tok/s, overhead "
                  f"{later['overhead_s'] * 1e3:6.2f} ms, graphs captured {later['graphs_captured']})", flush=True)
        rows = {r["method"]: r for r in result["rows"] if r["new_tokens"] == new}
        for when in ("first", "later"):
            for name, label in (("draft", f"draft K={args.k}"), ("adaptive", "adaptive K")):
                speedup = rows[name][when]["tokens_per_s"] / rows["plain"][when]["tokens_per_s"]
                rows[name][when]["speedup_over_plain"] = speedup
                print(f"      N={new:4d} {when}: {label} / plain = {speedup:.2f}x (Theorem 3.8 from alpha "
                      f"{rows[name][when]['alpha']:.2f} and c: {rows[name][when]['predicted_speedup']:.2f}x)")
    stem = "engine_" + ("".join(c if c.isalnum() else "_" for c in device.lower()) if args.gpu else "cpu")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"{stem}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
