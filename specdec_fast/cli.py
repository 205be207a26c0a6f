"""Command line: `specdec-fast generate ...` / `python -m specdec_fast generate ...`, and `demo`.

    specdec-fast generate --target DIR [--draft DIR | --prompt-lookup N] --prompt TEXT
        [--max-new-tokens N] [--k K] [--temperature T] [--top-k N] [--top-p P] [--min-p P]
        [--seed S] [--device DEV] [--tokenizer DIR] [--backend B] [--plain]
    specdec-fast demo [demo options]   (specdec_fast.demo.run_demo)
"""
import argparse
import os
import sys
import time


def _generate_parser(sub):
    ap = sub.add_parser("generate", help="complete a prompt with speculative decoding and print the stats")
    ap.add_argument("--target", required=True, help="target model directory (transformers from_pretrained)")
    ap.add_argument("--draft", help="draft model directory (same vocabulary as the target)")
    ap.add_argument("--prompt-lookup", type=int, metavar="N", help="prompt-lookup drafting with N tokens (no draft model)")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--tokenizer", help="tokenizer directory (default: the target's, else ../tokenizer beside it)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=None, help="draft tokens per iteration (default 4)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--backend", choices=["triton", "cpp", "torch"], default=None, help="verify kernel backend")
    ap.add_argument("--plain", action="store_true", help="also time plain decoding (K=0) for the measured speedup")
    return ap


def _load_tokenizer(args):
    from transformers import AutoTokenizer

    candidates = [args.tokenizer] if args.tokenizer else [args.target, os.path.join(os.path.dirname(os.path.abspath(args.target)), "tokenizer")]
    errors = []
    for path in candidates:
        try:
            return AutoTokenizer.from_pretrained(path)
        except Exception as exc:  # noqa: BLE001 - report every candidate tried
            errors.append(f"{path}: {exc}")
    raise SystemExit("could not load a tokenizer; pass --tokenizer DIR\n" + "\n".join(errors))


def run_generate(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from .api import generate

    if args.draft and args.prompt_lookup:
        raise SystemExit("give --draft or --prompt-lookup, not both")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = _load_tokenizer(args)
    target = AutoModelForCausalLM.from_pretrained(args.target).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft).to(device).eval() if args.draft else None
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to(device)
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0, seed=args.seed, backend=args.backend,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    if args.temperature > 0:
        kwargs.update(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    plain_tps = None
    if args.plain:
        _, plain_stats = generate(target, ids, return_stats=True, **kwargs)
        plain_tps = plain_stats.tokens_per_s
    if draft is not None:
        kwargs.update(assistant_model=draft, num_assistant_tokens=args.k)
    elif args.prompt_lookup:
        kwargs.update(prompt_lookup_num_tokens=args.prompt_lookup)
    start = time.perf_counter()
    out, stats = generate(target, ids, return_stats=True, **kwargs)
    seconds = time.perf_counter() - start
    stats.plain_tokens_per_s = plain_tps
    print(tokenizer.decode(out[0], skip_special_tokens=True))
    print(f"\n--- stats ({device}, {seconds:.2f} s) ---")
    print(stats.format())
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="specdec-fast", description="speculative decoding with fused kernels")
    sub = ap.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    sub.add_parser("demo", help="the shipped demo (options: specdec-fast demo --help)", add_help=False)
    if argv[:1] == ["demo"]:
        try:
            from .demo import run_demo
        except ImportError as exc:
            print(f"the demo is not available in this installation (specdec_fast.demo: {exc})", file=sys.stderr)
            return 2
        return run_demo(argv[1:])
    args = ap.parse_args(argv)
    return run_generate(args)


if __name__ == "__main__":
    sys.exit(main())
