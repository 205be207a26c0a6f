"""The adaptive K schedule (specdec_fast/engine/schedule.py) against every fixed K and plain decoding,
side by side in one run, per (draft agreement, batch size).

For each configuration: plain decoding, a draft model at each fixed K (num_assistant_tokens=K,
schedule "constant"), and the adaptive schedule (num_assistant_tokens_schedule="adaptive"; the
H100 runs of 2026-11-24 were made while it was the default of greedy calls without K). Each method
makes one warm-up call (graph capture, Triton compiles, and for the adaptive schedule its first
cost measurements, which the engine keeps across calls) and then --calls timed calls on the same
cached engine; the row is their median. Greedy by default (--sample: T=1), EOS off: every call
makes exactly N tokens per row. What the table shows: tokens/s of the whole call, the best fixed
K, the adaptive schedule's tokens/s as a fraction of the best fixed K's, the mean K it ran and the
Ks it chose; and "adaptive pinned": the schedule's whole machinery (position counters in the
verify, counters in the polls, the phase timer, every choice computed) with each choice then
replaced by the best fixed K, which separates what the mechanics cost from what the choices cost
(the H100's open question of 2026-11-24: adaptive 0-10% slower than a constant K at the same K).

    python bench/bench_adaptive_k.py            # CPU: the demo pair, a noisier copy of its draft, its EAGLE-3
                                                # head (--drafters "demo EAGLE-3 head": that one alone)
    python bench/bench_adaptive_k.py --gpu      # CUDA: the 8B-shaped pair (bench/scale_models.py),
                                                # greedy agreement 0.6 / 0.8 / 0.9 x batch 1 / 8 / 32

Writes bench/results/adaptive_k_<device>.json (rewritten after every configuration; --budget-s
stops starting new configurations after that many seconds).
"""
import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import specdec_fast
from specdec_fast.engine.cached import cached_engines

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, versions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def cpu_setup(batches):
    """The demo pair and, per label, the drafting keywords of a call: the demo draft, a copy with
    noise on its decoder layers (seeded), which lowers its agreement with the target, and the
    pair's EAGLE-3 head (draft_head; its adaptive schedule since 2026-11-29)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec_fast.pair import eagle3_head_dir, held_out_prompts

    target_dir, draft_dir = specdec_fast.demo_pair()
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    target.generation_config.eos_token_id = None
    noisy = copy.deepcopy(draft)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in noisy.named_parameters():
            if ".layers." in name and p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * 0.6 * p.std())
    tok = AutoTokenizer.from_pretrained(target_dir)
    rows = [tok(p, return_tensors="pt").input_ids[0] for p in held_out_prompts(max(batches))]
    width = min(len(r) for r in rows)
    prompts = torch.stack([r[:width] for r in rows])  # the same length: no padding
    drafts = {"demo draft": dict(assistant_model=draft), "noisy draft": dict(assistant_model=noisy)}
    head_dir = eagle3_head_dir()
    if head_dir is not None:
        drafts["demo EAGLE-3 head"] = dict(draft_head=specdec_fast.load_draft_head(head_dir))
    return target, drafts, lambda b: prompts[:b], "demo pair (3.8M Llama code model + 0.8M draft, its EAGLE-3 head), float32"


def gpu_setup(agreements, prompt_len):
    import scale_models as sm

    device = torch.device("cuda")
    target = sm.build_target(sm.LLAMA3_8B, device)
    draft = sm.draft_of(target, 2)
    gen = torch.Generator().manual_seed(7)
    calib = torch.randint(3, sm.LLAMA3_8B["vocab_size"], (4, 64), generator=gen).to(device)
    ids = torch.randint(3, sm.LLAMA3_8B["vocab_size"], (64, prompt_len), generator=gen).to(device)

    def drafts():  # the draft shares the target's layers: calibrating moves both, one agreement at a time
        for goal in agreements:
            got = sm.calibrate(target, draft, goal, calib)
            yield f"greedy agreement {got['agreement']:.3f}", dict(assistant_model=draft)
    return target, drafts, lambda b: ids[:b], "Llama-3-8B-shaped random bf16 target, 2-layer draft"


@contextlib.contextmanager
def pinned_choices(k: int):
    """AdaptiveK.choose computes its choice as usual (its host time is paid), then returns k."""
    from specdec_fast.engine.schedule import AdaptiveK

    real = AdaptiveK.choose

    def choose(self, remaining=None):
        chosen = real(self, remaining)
        self.chosen[chosen] -= 1
        if not self.chosen[chosen]:
            del self.chosen[chosen]
        self.drafted_steps += k - chosen
        self.chosen[k] += 1
        self.k = k
        return k
    AdaptiveK.choose = choose
    try:
        yield
    finally:
        AdaptiveK.choose = real


def timed(target, ids, new: int, extra: dict, calls: int, sample: bool) -> dict:
    def one():
        if ids.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        _, stats = specdec_fast.generate(target, ids, max_new_tokens=new, do_sample=sample, temperature=1.0,
                                         seed=0 if sample else None, return_stats=True, pad_token_id=0, **extra)
        if ids.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, stats

    one()  # warm-up: capture, compiles, the schedule's first measurements
    runs = [one() for _ in range(calls)]
    wall = statistics.median(w for w, _ in runs)
    stats = runs[-1][1]
    # graphs captured inside the timed calls (an adaptive schedule buys a K's capture when its
    # regret pays for it, engine/schedule.py): their cost is part of the timed wall
    row = dict(wall_s=wall, tokens_per_s=ids.shape[0] * new / wall, walls_s=[w for w, _ in runs],
               graphs_captured=[s.graphs_captured for _, s in runs], capture_s=[s.capture_s for _, s in runs])
    if extra:
        row.update(alpha=stats.alpha, mean_k=stats.mean_k, iterations=stats.iterations)
        if stats.schedule is not None:
            row.update(chosen=stats.schedule["chosen"], acceptance=stats.schedule["acceptance"],
                       step_ms=stats.schedule["step_ms"])
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--agreements", default="0.6,0.8,0.9", help="GPU: greedy agreements of the 8B-shaped pair")
    ap.add_argument("--batches", default=None, help="default 1,8,32 on GPU, 1,4 on CPU")
    ap.add_argument("--ks", default="1,2,3,4,5,6,8")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 128 on GPU, 64 on CPU")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--sample", action="store_true", help="T=1 sampling instead of greedy")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--drafters", default=None, help="CPU: the labels to run, comma-separated (default: all: "
                    "'demo draft', 'noisy draft', 'demo EAGLE-3 head')")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    batches = [int(b) for b in (args.batches or ("1,8,32" if args.gpu else "1,4")).split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    new = args.new_tokens or (128 if args.gpu else 64)
    if args.gpu:
        target, drafts, prompts, models = gpu_setup([float(a) for a in args.agreements.split(",")], args.prompt_len)
        configs = drafts()
        device = torch.cuda.get_device_name()
    else:
        torch.set_num_threads(args.threads)
        target, by_name, prompts, models = cpu_setup(batches)
        wanted = None if args.drafters is None else [name.strip() for name in args.drafters.split(",")]
        if wanted is not None and set(wanted) - set(by_name):
            ap.error(f"--drafters: unknown {sorted(set(wanted) - set(by_name))}; choose from {sorted(by_name)}")
        configs = iter([(name, by_name[name]) for name in wanted] if wanted else by_name.items())
        device = cpu_model()
    stem = "adaptive_k_" + ("".join(c if c.isalnum() else "_" for c in device.lower()) if args.gpu else "cpu")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"{stem}.json"
    result = dict(device=device, versions=versions(), models=models, new_tokens=new, ks=ks, calls=args.calls,
                  sample=args.sample, threads=None if args.gpu else args.threads, configs=[])
    for label, drafting in configs:
        for b in batches:
            if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: skipping the rest")
                break
            ids = prompts(b)
            methods = {"plain": {}}
            methods.update({f"K={k}": dict(drafting, num_assistant_tokens=k) for k in ks})
            methods["adaptive"] = dict(drafting, num_assistant_tokens_schedule="adaptive")
            rows = {name: timed(target, ids, new, extra, args.calls, args.sample) for name, extra in methods.items()}
            best = max((n for n in rows if n.startswith("K=")), key=lambda n: rows[n]["tokens_per_s"])
            with pinned_choices(int(best[2:])):
                rows["adaptive pinned"] = timed(target, ids, new, methods["adaptive"], args.calls, args.sample)
            # A server's engine: warmup() captures (and times) every K up front, so the schedule
            # chooses among all of them from the first call (engine/schedule.py).
            for engine in cached_engines(target):
                if (engine.assistant_model is drafting.get("assistant_model") and
                        engine.draft_head is drafting.get("draft_head")):
                    engine.warmup([b], do_sample=args.sample, num_assistant_tokens_schedule="adaptive")
            rows["adaptive after warmup"] = timed(target, ids, new, methods["adaptive"], args.calls, args.sample)
            ada, warm, plain = rows["adaptive"], rows["adaptive after warmup"], rows["plain"]["tokens_per_s"]
            summary = dict(draft=label, batch=b, best_fixed=best, adaptive_over_best=ada["tokens_per_s"] / rows[best]["tokens_per_s"],
                           warmed_over_best=warm["tokens_per_s"] / rows[best]["tokens_per_s"],
                           pinned_over_best=rows["adaptive pinned"]["tokens_per_s"] / rows[best]["tokens_per_s"],
                           adaptive_over_plain=ada["tokens_per_s"] / plain,
                           best_over_plain=rows[best]["tokens_per_s"] / plain, rows=rows)
            result["configs"].append(summary)
            fixed = "  ".join(f"{n[2:]}:{rows[n]['tokens_per_s']:.0f}" for n in rows if n.startswith("K="))
            print(f"{label:28s} B={b:2d}: plain {plain:8.1f} tok/s | fixed K {fixed} | best {best} "
                  f"({summary['best_over_plain']:.2f}x plain) | adaptive {ada['tokens_per_s']:.1f} tok/s = "
                  f"{summary['adaptive_over_best']:.3f} of best, {summary['adaptive_over_plain']:.2f}x plain, "
                  f"mean K {ada['mean_k']:.2f}, chose {ada.get('chosen')}, graphs captured in the timed calls "
                  f"{ada['graphs_captured']} | after warmup {warm['tokens_per_s']:.1f} tok/s = "
                  f"{summary['warmed_over_best']:.3f} of best, mean K {warm['mean_k']:.2f}, chose {warm.get('chosen')} | "
                  f"pinned at {best}: {summary['pinned_over_best']:.3f} of best",
                  flush=True)
            out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
