"""A draft with another tokenizer, end to end on CPU (greedy, batch 1, one run):

    ours        specdec_fast.generate(target, ids, assistant_model=cross_draft, tokenizer=tok,
                assistant_tokenizer=atok, num_assistant_tokens=K) for each K of --ks
                (drafters/cross_tokenizer.py), without K (the default: a constant K = 4 for
                a cross draft) and with num_assistant_tokens_schedule="adaptive" (engine/schedule.py)
    hf_uag      transformers' universal assisted generation: target.generate(assistant_model=
                cross_draft, tokenizer=tok, assistant_tokenizer=atok), its defaults (20 drafts,
                heuristic schedule, lookbehinds 10)
    plain       target.generate (transformers) and specdec_fast.generate without a draft (K = 0)
    references  the same-tokenizer demo draft: ours at K = --same-k and transformers' assisted
                generation (what a draft that shares the vocabulary gets on this target)

Models: the demo target (specdec_fast.pair, vocabulary 4096) and the cross draft
(specdec_fast/assets/cross_draft, bench/train_cross_draft.py: vocabulary 2048, 0.56M params).
Prompts: the first --prompts held-out prompts (bench/pair_corpus.py: modules never trained on),
one after another; a timed run is the whole sequence, --max-new-tokens per prompt with EOS off.
Every method: the best of --repeats runs, round robin after one warm-up of each. Recorded per
method: tokens/s, exact (equal to transformers' greedy output), mean accepted length (tokens per
target forward pass: ours new / (iterations + 1), transformers' counted by a forward hook on the
target) and, for ours, where the draft phase's time goes (the draft model's runner calls vs the
host re-tokenisation around them). Writes bench/results/cross_tokenizer_<machine>.json.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, cpu_simd, versions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def load(args):
    from specdec_fast.pair import held_out_prompts, load_cross_draft, load_demo_pair

    tok, target, same_draft = load_demo_pair()
    atok, cross_draft = load_cross_draft()
    for model in (target, same_draft, cross_draft):
        model.generation_config.eos_token_id = None  # full length: every method makes the same tokens
    prompts = [tok(p, return_tensors="pt") for p in held_out_prompts(args.prompts)]
    return tok, atok, target, same_draft, cross_draft, [(p.input_ids, p.attention_mask) for p in prompts]


class ForwardCount:
    """Counts a model's forward calls (transformers' generate calls model(...) once per pass)."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


class RunnerClock:
    """Wall time inside a runner's score / prefill / commit (the draft model's share of the draft phase)."""

    def __init__(self):
        self.seconds = 0.0

    def wrap(self, runner):
        for name in ("score", "prefill", "commit"):
            fn = getattr(runner, name)

            def timed(*a, fn=fn, **kw):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    self.seconds += time.perf_counter() - t0
            setattr(runner, name, timed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    ap.add_argument("--same-k", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import specdec_fast
    from specdec_fast.engine.cached import cached_engines

    t_start = time.perf_counter()
    tok, atok, target, same_draft, cross_draft, prompts = load(args)
    new = args.max_new_tokens
    forwards = ForwardCount(target)

    def hf(**extra):
        outs = []
        with torch.inference_mode():
            for ids, mask in prompts:
                outs.append(target.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                            pad_token_id=tok.pad_token_id, **extra))
        return outs, None

    def ours(**extra):
        outs, stats = [], []
        for ids, mask in prompts:
            out, st = specdec_fast.generate(target, ids, mask, max_new_tokens=new, do_sample=False, return_stats=True,
                                            **extra)
            outs.append(out)
            stats.append(st)
        return outs, stats

    cross = dict(assistant_model=cross_draft, tokenizer=tok, assistant_tokenizer=atok)
    methods = {"hf_generate": lambda: hf(), "hf_uag": lambda: hf(**cross),
               "hf_assisted_same_tokenizer": lambda: hf(assistant_model=same_draft),
               "specdec_plain": lambda: ours(),
               f"specdec_same_tokenizer_k{args.same_k}": lambda: ours(assistant_model=same_draft,
                                                                       num_assistant_tokens=args.same_k)}
    for k in args.ks:
        methods[f"specdec_cross_k{k}"] = lambda k=k: ours(num_assistant_tokens=k, **cross)
    methods["specdec_cross_default"] = lambda: ours(**cross)  # no K: the constant default K (4)
    methods["specdec_cross_adaptive"] = lambda: ours(num_assistant_tokens_schedule="adaptive", **cross)

    names = list(methods)
    best = {name: None for name in names}
    for name in names:  # warm-up (the cached engines are built and sized for every K here)
        methods[name]()
    # The cross engine's draft runner, timed: its share of the draft phase (the rest is host work).
    (engine,) = [e for e in cached_engines(target) if e.cross_tokenizers is not None]
    clock = RunnerClock()
    clock.wrap(engine.draft_runner)
    times = {}  # every timed run's seconds per method
    for _ in range(args.repeats):
        for name in names:
            before_fw, before_clock = forwards.calls, clock.seconds
            t0 = time.perf_counter()
            outs, stats = methods[name]()
            seconds = time.perf_counter() - t0
            run = dict(seconds=seconds, outs=outs, stats=stats, forwards=forwards.calls - before_fw,
                       draft_model_s=clock.seconds - before_clock)
            times.setdefault(name, []).append(seconds)
            if best[name] is None or seconds < best[name]["seconds"]:
                best[name] = run

    ref = best["hf_generate"]["outs"]
    total_new = new * len(prompts)
    rows = []
    for name in names:
        run = best[name]
        row = dict(method=name, seconds=round(run["seconds"], 4), seconds_all=[round(s, 4) for s in times[name]],
                   new_tokens=total_new, tokens_per_s=round(total_new / run["seconds"], 1),
                   exact_vs_hf_generate=all(torch.equal(a, b) for a, b in zip(run["outs"], ref)))
        if run["stats"] is None:
            row["tokens_per_target_forward"] = round(total_new / max(run["forwards"], 1), 3)
        else:
            st = run["stats"]
            iterations = sum(s.iterations for s in st)
            hist = [sum(col) for col in zip(*[s.accepted_hist for s in st])]
            row.update(k=st[0].k if st[0].schedule is None else "adaptive", iterations=iterations,
                       tokens_per_target_forward=round(total_new / (iterations + len(st)), 3),
                       mean_accepted_length=round(sum((j + 1) * c for j, c in enumerate(hist)) / max(sum(hist), 1), 3),
                       accepted_hist=hist, draft_s=round(sum(s.draft_s for s in st), 4),
                       target_s=round(sum(s.target_s for s in st), 4), wall_s=round(sum(s.wall_s for s in st), 4),
                       graph_mode=st[0].graph_mode, graph_note=st[0].graph_note)
            if st[0].schedule is not None:  # the Ks chosen, over the prompts
                chosen = {}
                for s in st:
                    for q, n in s.schedule["chosen"].items():
                        chosen[q] = chosen.get(q, 0) + n
                row.update(mean_k=round(sum(s.schedule["drafted_steps"] for s in st) / max(iterations, 1), 3),
                           k_chosen=dict(sorted(chosen.items())))
            if name.startswith("specdec_cross"):
                row["draft_model_s"] = round(run["draft_model_s"], 4)
                row["draft_host_s"] = round(row["draft_s"] - run["draft_model_s"], 4)
        rows.append(row)
    plain = next(r for r in rows if r["method"] == "specdec_plain")["tokens_per_s"]
    hf_plain = next(r for r in rows if r["method"] == "hf_generate")["tokens_per_s"]
    for row in rows:
        row["speedup_vs_specdec_plain"] = round(row["tokens_per_s"] / plain, 3)
        row["speedup_vs_hf_generate"] = round(row["tokens_per_s"] / hf_plain, 3)
    result = {
        "machine": f"cpu: {cpu_model()}", **cpu_simd(), "threads": torch.get_num_threads(), **versions(),
        "models": {"target": "demo target (3.8M params, byte-level BPE 4096)",
                   "cross_draft": "specdec_fast/assets/cross_draft (0.56M params, its own byte-level BPE 2048, digits split)",
                   "same_tokenizer_draft": "demo draft (0.82M params, the target's tokenizer)"},
        "settings": dict(prompts=len(prompts), max_new_tokens=new, ks=args.ks, same_k=args.same_k, repeats=args.repeats,
                         mode="greedy", batch=1, eos="off"),
        "results": rows, "total_seconds": round(time.perf_counter() - t_start, 1),
    }
    out = args.out or ROOT / "bench" / "results" / f"cross_tokenizer_cpu_{cpu_simd()['cpu_isa']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    width = max(len(r["method"]) for r in rows)
    for r in rows:
        extra = f"  draft {r['draft_s']:.2f}s (model {r['draft_model_s']:.2f}s, host {r['draft_host_s']:.2f}s)" \
            if "draft_model_s" in r else ""
        print(f"{r['method']:<{width}}  {r['tokens_per_s']:7.1f} tok/s  x{r['speedup_vs_specdec_plain']:.2f} vs plain  "
              f"{r['tokens_per_target_forward']:.2f} tok/fwd  exact {r['exact_vs_hf_generate']}{extra}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
