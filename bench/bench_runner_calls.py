"""Per-call cost of the runners: one score(N tokens) + commit on a 100-token context, HFRunner vs
the paged runner of the model's family (PagedLlamaRunner, or PagedGPT2Runner for GPT-2), for the demo
pair's target and draft (or --target/--draft dirs).

    python bench/bench_runner_calls.py [--ns 1,2,5] [--calls 60] [--out FILE]

Median over --calls calls (one warm-up call first); each call commits one token and then calls
compact() with the exact bound, as the engine's poll does.
Writes bench/results/runner_calls_<device>.json. Not a test.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_e2e import environment  # noqa: E402


def time_calls(runner, n: int, calls: int, context: int, vocab: int, device) -> float:
    gen = torch.Generator().manual_seed(n)
    runner.prefill(torch.randint(3, vocab, (1, context), generator=gen).to(device), None)
    tokens = torch.randint(3, vocab, (1, n), generator=gen).to(device)
    keep = torch.ones(1, dtype=torch.long, device=device)
    times = []
    for i in range(calls + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        runner.score(tokens)
        runner.commit(keep)
        runner.compact(context + i + 1)  # as the engine does at each poll (HFRunner reclaims its holes)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--device")
    ap.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 5])
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from specdec_fast.runners import HFRunner
    from specdec_fast.runners.registry import paged_runner_class

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if args.target is None:
        from specdec_fast.pair import demo_pair

        args.target, args.draft = demo_pair()
    rows = []
    for role, path in (("target", args.target), ("draft", args.draft)):
        if path is None:
            continue
        model = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
        vocab = model.config.vocab_size
        for n in args.ns:
            budget = args.calls + 2  # max_new_tokens: one committed token per call
            make = {"hf": lambda: HFRunner(model),
                    "paged": lambda: paged_runner_class(model)(model, max_new_tokens=budget, num_draft_tokens=max(args.ns) - 1)}
            ms = {name: 1e3 * time_calls(factory(), n, args.calls, args.context, vocab, device) for name, factory in make.items()}
            rows.append(dict(model=role, n=n, hf_ms=ms["hf"], paged_ms=ms["paged"], paged_over_hf=ms["paged"] / ms["hf"]))
            print(f"{role:6s} N={n}: hf {ms['hf']:.2f} ms  paged {ms['paged']:.2f} ms  ({ms['paged'] / ms['hf']:.2f}x)", flush=True)
    env = environment(device)
    tag = "cpu" if device.type == "cpu" else env["device_name"].lower().replace(" ", "_")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"runner_calls_{tag}.json"
    out.write_text(json.dumps(dict(environment=env, settings={k: v for k, v in vars(args).items() if k != "out"},
                                   results=rows), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
