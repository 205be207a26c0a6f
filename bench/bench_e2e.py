"""End-to-end decoding speed, side by side in one run, same models and prompts (greedy):

    transformers generate (plain) | transformers assisted generation (batch 1 only)
    specdec_fast K=0 (plain, same engine) | specdec_fast K=1..8 with the draft | prompt lookup

    python bench/bench_e2e.py [--target DIR --draft DIR] [--batch-sizes 1,4] [--max-new-tokens 64]
                              [--runners auto,paged,hf] [--no-extras]

Models: --target/--draft, else the project's trained pair (specdec_fast.pair.demo_pair()) when
present, else random-weight Llama configs (the draft = the target's first layer: some
alignment, low acceptance; the numbers then measure the machinery, not a useful pair).
Each configuration: one warm-up, then the median of --repeats timed runs, taken in rounds over
all configurations. Tokens/s counts
new tokens of all rows. Writes bench/results/e2e_<device>.json (device, versions, commit).
Not a test: pytest collects nothing here.
"""
import argparse
import copy
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def random_pair(vocab: int, hidden: int, layers: int, seed: int = 0, init_std: float = 0.02):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                         num_attention_heads=max(hidden // 64, 1), num_key_value_heads=max(hidden // 64, 1),
                         max_position_embeddings=2048, initializer_range=init_std, eos_token_id=None)
    target = LlamaForCausalLM(config).float().eval()
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    desc = f"random-weight Llama (vocab {vocab}, hidden {hidden}, init std {init_std}): target {layers} layers, draft = its first layer"
    return target, draft, None, desc


def load_models(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir = args.target, args.draft
    if target_dir is None:
        try:
            from specdec_fast.pair import demo_pair, tokenizer_dir

            target_dir, draft_dir = demo_pair()
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
        except (ImportError, FileNotFoundError):
            return random_pair(args.vocab, args.hidden, args.layers)
    else:
        tokenizer = None
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    return target, draft, tokenizer, f"target {target_dir}, draft {draft_dir}"


def make_prompts(tokenizer, batch: int, vocab: int, length: int, seed: int):
    """Left-padded input_ids, attention_mask [batch, <= length]."""
    if tokenizer is not None:
        from specdec_fast.pair import held_out_prompts

        texts = (held_out_prompts() * batch)[:batch]
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=length)
        return enc.input_ids, enc.attention_mask
    gen = torch.Generator().manual_seed(seed)
    lengths = [length - 7 * (i % 3) for i in range(batch)]
    ids = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, length - n :] = torch.randint(3, vocab, (n,), generator=gen)
        mask[row, length - n :] = 1
    return ids, mask


def timed_once(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def configurations(args, target, draft, ids, mask, common):
    """[(method, k, runner, fn)] in the order they are reported."""
    from specdec_fast.api import generate

    def hf(**kw):
        def fn():
            with torch.inference_mode():
                return target.generate(ids, attention_mask=mask, eos_token_id=None, **common, **kw)
        return fn

    def ours(runner, **kw):
        mode = dict(common, runner=None if runner == "auto" else runner)
        return lambda: generate(target, ids, mask, return_stats=True, seed=0, **mode, **kw)

    configs = [("hf_generate", None, None, hf())]
    if ids.shape[0] == 1:  # transformers' assisted generation supports batch size 1 only
        configs.append(("hf_assisted", None, None, hf(assistant_model=draft)))
    for runner in args.runners:
        tag = "" if runner == "auto" else f"[{runner}]"
        configs.append(("specdec_plain" + tag, 0, runner, ours(runner)))
        for k in args.ks:
            configs.append(("specdec_draft" + tag, k, runner, ours(runner, assistant_model=draft, num_assistant_tokens=k)))
        if not args.no_extras:
            configs.append(("specdec_prompt_lookup" + tag, args.lookup_k, runner,
                            ours(runner, prompt_lookup_num_tokens=args.lookup_k)))
            # Draft = target: alpha = 1 and c ~ 1, so Theorem 3.8 predicts (K+1)/(K+1) = 1x: a check of the model.
            configs.append(("specdec_self_draft" + tag, 4, runner, ours(runner, assistant_model=target, num_assistant_tokens=4)))
    return configs


def run(args):
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    target, draft, tokenizer, models_desc = load_models(args)
    target, draft = target.to(device), draft.to(device)
    target.generation_config.eos_token_id = None  # full length: every configuration makes the same tokens
    pad = 0
    vocab = target.config.vocab_size
    results = []
    for batch in args.batch_sizes:
        ids, mask = make_prompts(tokenizer, batch, vocab, args.prompt_len, seed=batch)
        ids, mask = ids.to(device), mask.to(device)
        new = args.max_new_tokens
        common = dict(do_sample=False, max_new_tokens=new, pad_token_id=pad)
        configs = configurations(args, target, draft, ids, mask, common)
        for *_, fn in configs:
            fn()  # warm-up
        # Rounds over all configurations (not repeats of one, then the next): load drift on a
        # shared box then hits every configuration alike.
        times, outputs = [[] for _ in configs], [None] * len(configs)
        for _ in range(args.repeats):
            for i, (*_, fn) in enumerate(configs):
                seconds, outputs[i] = timed_once(fn, device)
                times[i].append(seconds)
        reference = outputs[0]
        plain = {}
        for (name, k, runner, _), seconds, out in zip(configs, times, outputs):
            out, stats = out if isinstance(out, tuple) else (out, None)
            median = statistics.median(seconds)
            row = dict(batch=batch, method=name, k=k, runner=runner, seconds=median, seconds_all=seconds,
                       tokens_per_s=batch * new / median, exact_vs_hf_plain=bool(torch.equal(out, reference)))
            if stats is not None:
                row.update(alpha=stats.alpha, mean_accepted_length=stats.mean_accepted_length, cost_ratio=stats.cost_ratio,
                           predicted_speedup=stats.predicted_speedup, acceptance_per_position=stats.acceptance_per_position,
                           iterations=stats.iterations)
            if k == 0:
                plain[runner] = row
            elif k is not None:
                row["measured_speedup_vs_specdec_plain"] = row["tokens_per_s"] / plain[runner]["tokens_per_s"]
                row["measured_speedup_vs_hf_generate"] = row["tokens_per_s"] / hf_rate
            if name == "hf_generate":
                hf_rate = row["tokens_per_s"]
            results.append(row)
            print(f"B={batch:2d} {name:29s} K={k!s:4s} {row['tokens_per_s']:9.1f} tok/s  exact={row['exact_vs_hf_plain']}"
                  + (f"  alpha={stats.alpha:.3f} c={stats.cost_ratio:.3f} pred={stats.predicted_speedup:.2f}x" if stats and stats.k else ""),
                  flush=True)
    return device, models_desc, results


def environment(device: torch.device) -> dict:
    import transformers

    import specdec_fast

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    return dict(device=str(device), device_name=name, cpu_threads=torch.get_num_threads(), torch=torch.__version__,
                transformers=transformers.__version__, triton=triton_version, specdec_fast=specdec_fast.__version__,
                python=platform.python_version(), commit=commit)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--device")
    ap.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=list(range(1, 9)))
    ap.add_argument("--lookup-k", type=int, default=4)
    ap.add_argument("--runners", type=lambda s: s.split(","), default=["auto"],
                    help="comma list of auto (paged where supported, else hf), paged, hf: every specdec row per runner")
    ap.add_argument("--no-extras", action="store_true", help="skip the prompt-lookup and self-draft rows")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (default 1: stable on a shared box)")
    ap.add_argument("--vocab", type=int, default=2048, help="random-weight fallback only")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--out", help="default bench/results/e2e_<device>.json")
    args = ap.parse_args(argv)
    if args.target is not None and args.draft is None:
        ap.error("--target needs --draft")
    if not set(args.runners) <= {"auto", "paged", "hf"}:
        ap.error(f"--runners takes auto, paged, hf; got {args.runners}")
    device, models_desc, results = run(args)
    env = environment(device)
    tag = "cpu" if device.type == "cpu" else env["device_name"].lower().replace(" ", "_")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"e2e_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out",)}
    out.write_text(json.dumps(dict(environment=env, models=models_desc, settings=settings, decoding="greedy",
                                   results=results), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
