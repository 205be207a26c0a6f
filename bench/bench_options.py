"""What generate() options cost: tokens/s of the demo pair with a checkpoint's usual options (the
repetition_penalty Qwen2.5 Instruct ships, 1.05; a chat template's combination) against none, in
one run (alternating rounds, the best round of each), greedy and sampling, draft model K = 4.

    option sets  none | repetition_penalty=1.05 (fused into the verify and sample kernels) |
                 chat = repetition_penalty 1.05 + min_new_tokens 8 + stop_strings (host check per
                 token) | no_repeat_ngram_size=3 (per position on the device) | forced_eos_token_id +
                 exponential_decay_length_penalty (on the device) | prefix_allowed_tokens_fn (a host
                 call per row and position, eager: a fn that answers at once, so the cost is ours) |
                 encoder_repetition_penalty (on the device) | top_h (the warpers in torch; greedy
                 ignores it) | watermarking_config (transformers' processor per row and position,
                 eager) | the output dict with scores and hidden states (forwards after the loop) |
                 cache=DynamicCache() (a chat loop's first turn: the cache extended by one forward
                 of the whole sequence after the loop, engine/user_cache.py) | guidance_scale=1.5
                 (the unconditional stream: one forward per row and iteration, eager)

    python bench/bench_options.py [--rounds 5] [--new-tokens 96] [--prompts 4] [--tree]
                                  [--sets none,repetition_penalty=1.05] [--device cuda]

--tree drafts the default token tree (generate(tree=True): each node processed with its ancestor
path, the tree's drafts too) instead of K = 4, without guidance_scale (chains only); it writes
options_tree_<device>.json. --sets times only the named option sets ("none" always). --device cuda
runs the demo pair on the GPU (float32, CUDA graphs where the options allow them): there the models
are tiny, so the ratios show what each option adds per step to a step that costs little; e.g. the
cost of processing every tree node (bench/run_gpu.sh options).

Beside them, transformers' own generate (greedy, no draft) with no option and with
guidance_scale=1.5 (which costs it a second forward per token), in the same rounds.

Writes bench/results/options[_tree]_<device>.json (cpu, or the GPU's name): the demo pair, float32.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

import specdec_fast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, versions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODES = {"greedy": dict(do_sample=False), "sampling": dict(do_sample=True, temperature=0.8, top_p=0.95)}


def option_sets(tok) -> dict:
    from transformers import DynamicCache
    from transformers.generation import WatermarkingConfig

    allowed = list(range(1, len(tok)))
    return {
        "none": {},
        "repetition_penalty=1.05": dict(repetition_penalty=1.05),
        "chat (rep 1.05 + min_new 8 + stop)": dict(repetition_penalty=1.05, min_new_tokens=8,
                                                   stop_strings=["\n\n\n"], tokenizer=tok),
        "no_repeat_ngram_size=3": dict(no_repeat_ngram_size=3),
        "forced_eos + exp. decay": dict(forced_eos_token_id=tok.eos_token_id,
                                        exponential_decay_length_penalty=(48, 1.05)),
        # the host path's own cost: a fn that answers at once (one list, all but one token)
        "prefix_allowed_tokens_fn (host)": dict(prefix_allowed_tokens_fn=lambda batch_id, ids, allowed=allowed: allowed),
        "encoder_repetition_penalty=1.1": dict(encoder_repetition_penalty=1.1),
        # sampling only (greedy ignores it): the warpers then run in torch (standardise_all)
        "top_h=0.9": dict(top_h=0.9),
        # transformers' own processor per row and position (eager); sampled calls standardise in torch
        "watermark (lefthash)": dict(watermarking_config=WatermarkingConfig()),
        "output_scores + hidden_states": dict(return_dict_in_generate=True, output_scores=True,
                                              output_hidden_states=True),
        # a fresh cache per call (a callable: options made at each call)
        "cache=DynamicCache() (chat turn)": lambda: dict(cache=DynamicCache()),
        "guidance_scale=1.5": dict(guidance_scale=1.5),
    }


def main(argv=None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec_fast.pair import held_out_prompts

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tree", action="store_true", help="draft the default token tree instead of a K = 4 chain")
    ap.add_argument("--sets", help="comma-separated option set names to time (default: all; 'none' always)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    target_dir, draft_dir = specdec_fast.demo_pair()
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval().to(device)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval().to(device)
    prompts = [tok(p, return_tensors="pt").input_ids.to(device) for p in held_out_prompts(args.prompts)]
    sets = option_sets(tok)
    drafting = dict(tree=True) if args.tree else dict(num_assistant_tokens=4)
    if args.tree:
        del sets["guidance_scale=1.5"]  # refused with tree= (guidance runs on chains only)
    if args.sets:
        chosen = ["none"] + [name for name in args.sets.split(",") if name != "none"]
        unknown = [name for name in chosen if name not in sets]
        if unknown:
            ap.error(f"--sets: unknown {unknown}; the sets{' with --tree' if args.tree else ''}: {list(sets)}")
        sets = {name: sets[name] for name in chosen}

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def run(mode: str, options: dict):
        tokens, seconds = 0, 0.0
        for i, ids in enumerate(prompts):
            synchronize()
            start = time.perf_counter()
            out = specdec_fast.generate(target, ids, assistant_model=draft, **drafting,
                                        max_new_tokens=args.new_tokens, seed=i, **MODES[mode],
                                        **(options() if callable(options) else options))
            synchronize()
            seconds += time.perf_counter() - start
            out = getattr(out, "sequences", out)  # the output dict's tokens
            tokens += out.shape[1] - ids.shape[1]
        return tokens / seconds

    rows = []
    hf_sets = {"none": {}, **({"guidance_scale=1.5": dict(guidance_scale=1.5)} if "guidance_scale=1.5" in sets else {})}

    def run_transformers(options: dict):
        tokens, seconds = 0, 0.0
        for ids in prompts:
            synchronize()
            start = time.perf_counter()
            out = target.generate(ids, max_new_tokens=args.new_tokens, do_sample=False, **options)
            synchronize()
            seconds += time.perf_counter() - start
            tokens += out.shape[1] - ids.shape[1]
        return tokens / seconds

    for mode in MODES:
        for options in sets.values():
            run(mode, options)  # warm-up: each option set's decoders are built once
        best = {name: 0.0 for name in sets}
        for _ in range(args.rounds):  # alternating rounds: the machine's drift hits every set alike
            for name, options in sets.items():
                best[name] = max(best[name], run(mode, options))
        for name in sets:
            rows.append(dict(mode=mode, options=name, tokens_per_s=best[name], ratio_to_none=best[name] / best["none"]))
            print(f"{mode:8s} {name:36s} {best[name]:7.1f} tok/s ({best[name] / best['none']:.2f}x of none)", flush=True)
    hf_best = {name: 0.0 for name in hf_sets}
    for name, options in hf_sets.items():
        run_transformers(options)  # warm-up
    for _ in range(args.rounds):
        for name, options in hf_sets.items():
            hf_best[name] = max(hf_best[name], run_transformers(options))
    greedy = {row["options"]: row["tokens_per_s"] for row in rows if row["mode"] == "greedy"}
    transformers_rows = [dict(options=name, tokens_per_s=hf_best[name], specdec_fast_speedup=greedy[name] / hf_best[name])
                         for name in hf_sets]
    for row in transformers_rows:
        print(f"transformers generate, greedy, {row['options']:20s} {row['tokens_per_s']:7.1f} tok/s "
              f"(specdec_fast {row['specdec_fast_speedup']:.2f}x)", flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    result = dict(device=name, versions=versions(), threads=args.threads, rounds=args.rounds,
                  new_tokens=args.new_tokens, prompts=args.prompts, k=None if args.tree else 4, tree=args.tree,
                  models=f"demo pair (3.8M Llama code model + 0.8M draft), float32, {device.type.upper()}", rows=rows,
                  transformers_greedy=transformers_rows)
    tag = "cpu" if device.type == "cpu" else name.lower().replace(" ", "_")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"options{'_tree' if args.tree else ''}_{tag}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
