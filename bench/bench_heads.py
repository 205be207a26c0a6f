"""Drafters that read the target's hidden states against the shipped draft model, on the demo pair:

    plain          specdec_fast without a drafter
    draft K        the shipped draft model (0.82M parameters), K drafts per iteration (each --k)
    eagle3 K       the shipped EAGLE-3 head (specdec_fast/assets/pair/eagle3), K drafts per iteration
    dflash K       a DFlash (or DFlash2) block drafter (--dflash DIR; all K drafts from one forward), when given, at
                   each --dflash-k (default: each --k) up to block_size - 1 and at block_size - 1
    dflash adaptive  the same drafter under num_assistant_tokens_schedule="adaptive" (K per
                   iteration among the first drafts of the block; the Ks it chose are recorded)
    draft tree /   both drafters expanding the same token tree (--tree N: TokenTree.recommended(N)
    eagle3 tree    for the mode), when --tree is given

Batch 1, the first --prompts held-out prompts one after another, --max-new-tokens each, EOS off
(every run makes the same number of tokens); greedy and sampling (T 0.8, top-p 0.95). Each
method: one warm-up pass, then --repeats timed passes round robin over the methods of a mode;
tokens/s of the best pass (the median and every pass's kept too). Mean accepted length = tokens emitted per
iteration (accepted drafts + 1), pooled over the prompts; acceptance per draft position.

    .venv/bin/python bench/bench_heads.py [--k 2 4 6] [--tree 16] [--prompts 8] [--dflash DIR [--dflash-k 4 8]]

Writes bench/results/heads_pair_cpu_<isa>.json and .png (or --out). CPU only here: no GPU number.
"""
import argparse
import json
import os
import statistics
from collections import Counter
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, cpu_simd, versions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODES = {"greedy": dict(do_sample=False), "sampling": dict(do_sample=True, temperature=0.8, top_p=0.95)}


def methods(args, draft, head, dflash) -> dict:
    """name -> generate() keyword arguments (besides the mode's)."""
    from specdec_fast.drafters import TokenTree

    out = {"plain": {}}
    for k in args.k:
        out[f"draft K={k}"] = dict(assistant_model=draft, num_assistant_tokens=k)
    for k in args.k:
        out[f"eagle3 K={k}"] = dict(draft_head=head, num_assistant_tokens=k)
    if dflash is not None:  # at the chains' Ks and with the whole block (its K drafts cost one forward)
        name = dflash.label.lower()  # dflash / dflash2
        for k in sorted({k for k in (args.dflash_k or args.k) if k < dflash.block_size} | {dflash.block_size - 1}):
            out[f"{name} K={k}"] = dict(draft_head=dflash, num_assistant_tokens=k)
        out[f"{name} adaptive"] = dict(draft_head=dflash, num_assistant_tokens_schedule="adaptive")
    if args.tree:
        for mode in MODES:
            tree = TokenTree.recommended(args.tree, greedy=mode == "greedy")
            out[f"draft tree {args.tree} ({mode})"] = dict(assistant_model=draft, tree=tree, _mode=mode)
            out[f"eagle3 tree {args.tree} ({mode})"] = dict(draft_head=head, tree=tree, _mode=mode)
    return out


def run_pass(target, prompts, kwargs, mode, args):
    from specdec_fast import generate

    stats, start = [], time.perf_counter()
    for i, ids in enumerate(prompts):
        _, s = generate(target, ids, max_new_tokens=args.max_new_tokens, eos_token_id=None, pad_token_id=0, seed=i,
                        return_stats=True, **MODES[mode], **kwargs)
        stats.append(s)
    return time.perf_counter() - start, stats


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, nargs="+", default=[4], help="the chains' Ks (default 4)")
    ap.add_argument("--tree", type=int, default=0, help="also both drafters on TokenTree.recommended(N) (0: no trees)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--head", type=Path, default=ROOT / "specdec_fast" / "assets" / "pair" / "eagle3")
    ap.add_argument("--dflash", type=Path, default=None)
    ap.add_argument("--dflash-k", type=int, nargs="+", default=None, help="the block drafter's Ks (default: --k)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()  # the machine may be shared: its load beside the timings

    from specdec_fast import load_draft_head
    from specdec_fast.engine.phase_costs import merge_stats
    from specdec_fast.pair import held_out_prompts, load_demo_pair

    tokenizer, target, draft = load_demo_pair()
    target.generation_config.eos_token_id = None
    head = load_draft_head(args.head)
    dflash = load_draft_head(args.dflash) if args.dflash else None
    prompts = [tokenizer(p, return_tensors="pt").input_ids for p in held_out_prompts(args.prompts)]
    table = methods(args, draft, head, dflash)
    results = {}
    for mode in MODES:
        names = [n for n, kw in table.items() if kw.get("_mode", mode) == mode]
        for name in names:  # warm-up: engines built, kernels compiled
            run_pass(target, prompts[:1], {k: v for k, v in table[name].items() if k != "_mode"}, mode,
                     argparse.Namespace(**{**vars(args), "max_new_tokens": 8}))
        times = {name: [] for name in names}
        last = {}  # name -> the last pass's per-call stats
        for _ in range(args.repeats):
            for name in names:
                seconds, s = run_pass(target, prompts, {k: v for k, v in table[name].items() if k != "_mode"}, mode, args)
                times[name].append(seconds)
                last[name] = s
        tokens = len(prompts) * args.max_new_tokens
        plain_tps = tokens / min(times["plain"])
        for name in names:
            merged = merge_stats(last[name])
            entry = dict(tokens_per_s=round(tokens / min(times[name]), 2),
                         tokens_per_s_median=round(tokens / statistics.median(times[name]), 2),
                         tokens_per_s_passes=[round(tokens / t, 1) for t in times[name]],  # the spread
                         speedup_over_plain=round(tokens / min(times[name]) / plain_tps, 3))
            if name != "plain":
                entry.update(mean_accepted_length=round(merged.mean_accepted_length, 3),
                             acceptance_per_position=[round(a, 3) for a in merged.acceptance_per_position],
                             alpha=round(merged.alpha, 3), iterations=merged.iterations,
                             draft_ms_per_iter=round(1000 * merged.draft_s / max(merged.iterations, 1), 3),
                             target_ms_per_iter=round(1000 * merged.target_s / max(merged.iterations, 1), 3))
                if "num_assistant_tokens_schedule" in table[name]:  # the Ks chosen, over the last pass's calls
                    chosen = sum((Counter(one.schedule["chosen"]) for one in last[name]), Counter())
                    entry["ks_chosen"] = dict(sorted(chosen.items()))
            results.setdefault(mode, {})[name] = entry
            print(f"{mode:8s} {name:28s} {json.dumps(entry)}", flush=True)
    simd = cpu_simd()
    record = dict(results=results, k=args.k, tree=args.tree, prompts=len(prompts), max_new_tokens=args.max_new_tokens,
                  repeats=args.repeats, threads=torch.get_num_threads(),
                  load_average_1_5_15_min=dict(before=[round(x, 2) for x in load_before],
                                               after=[round(x, 2) for x in os.getloadavg()]), device=f"cpu: {cpu_model()}", **simd,
                  head=str(args.head.relative_to(ROOT) if args.head.is_relative_to(ROOT) else args.head),
                  head_params=sum(p.numel() for p in head.parameters()),
                  draft_params=sum(p.numel() for p in draft.parameters()),
                  target_params=sum(p.numel() for p in target.parameters()), versions=versions(),
                  command="python bench/bench_heads.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    if dflash is not None:
        record["dflash"] = str(args.dflash.relative_to(ROOT) if args.dflash.is_relative_to(ROOT) else args.dflash)
        record["dflash_params"] = sum(p.numel() for p in dflash.parameters())
    out = args.out or ROOT / "bench" / "results" / f"heads_pair_cpu_{simd['cpu_isa']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    plot(record, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "tokens_per_s", "tokens/s (best of repeats)"),
                           (axes[1], "mean_accepted_length", "tokens per iteration")):
        names = [n for n in record["results"]["greedy"] if key in record["results"]["greedy"][n]]
        names = [n.replace(" (greedy)", "") for n in names]
        width = 0.38
        for i, mode in enumerate(MODES):
            rows = record["results"][mode]
            values = [next((v[key] for n, v in rows.items() if n.replace(f" ({mode})", "") == name and key in v), 0)
                      for name in names]
            ax.bar([j + (i - 0.5) * width for j in range(len(names))], values, width, label=mode)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"demo pair, batch 1, {record['prompts']} held-out prompts x {record['max_new_tokens']} tokens; "
                 f"{record['device']}, {record['threads']} thread", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
