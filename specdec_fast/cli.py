"""Command line: `specdec-fast generate ...` / `python -m specdec_fast generate ...`, and `demo`.

    specdec-fast generate --target DIR [--draft DIR | --prompt-lookup N] --prompt TEXT
        [--max-new-tokens N] [--k K] [--temperature T] [--top-k N] [--top-p P] [--min-p P]
        [--seed S] [--device DEV] [--tokenizer DIR] [--backend B] [--plain] [--threads N]
    specdec-fast demo [demo options]   (specdec_fast.demo.run_demo)

A wrong path or value ends with one line on stderr, `specdec-fast: error: ...`, and exit status
2 (argparse's own usage errors too); the tokenizer comes from --tokenizer, else the target's
directory.
"""
import argparse
import math
import os
import sys
import time


def _generate_parser(sub):
    ap = sub.add_parser("generate", help="complete a prompt with speculative decoding and print the stats")
    ap.add_argument("--target", required=True, help="target model directory (transformers from_pretrained)")
    ap.add_argument("--draft", help="draft model directory (same vocabulary as the target)")
    ap.add_argument("--prompt-lookup", type=int, metavar="N", help="prompt-lookup drafting with N tokens (no draft model)")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--tokenizer", help="tokenizer directory (default: the target's)")
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
    # Small models on a busy CPU: OpenMP threads that wait on each other cost more than they
    # give (the demo pair, 2 threads on a loaded 2-core box: 8 tok/s against 94 with 1 thread).
    ap.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (default 0 = torch's default)")
    return ap


# Any one of these marks a folder that holds a tokenizer (fast, sentencepiece, BPE or WordPiece files).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


class CliError(Exception):
    """A user error: printed as the one line `specdec-fast: error: ...`, exit status 2."""


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def check_args(args) -> None:
    """Everything that can be checked before loading a model; raises CliError naming the flag."""
    for flag, path in (("--target", args.target), ("--draft", args.draft), ("--tokenizer", args.tokenizer)):
        if path is not None and not os.path.isdir(path):
            raise CliError(f"no such directory: {path} ({flag})")
    if args.draft and args.prompt_lookup is not None:
        raise CliError("give --draft or --prompt-lookup, not both")
    if args.threads < 0:
        raise CliError(f"--threads must be >= 0 (0 = torch's default), got {args.threads}")
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--k", args.k), ("--prompt-lookup", args.prompt_lookup)):
        if value is not None and value < 1:
            raise CliError(f"{flag} must be >= 1, got {value}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise CliError(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k < 0:
        raise CliError(f"--top-k must be >= 0 (0 = off), got {args.top_k}")
    if not 0 < args.top_p <= 1:
        raise CliError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not 0 <= args.min_p <= 1:
        raise CliError(f"--min-p must be in [0, 1], got {args.min_p}")


def _load_tokenizer(args):
    """--tokenizer, else the target's directory (Hugging Face's convention), else a `tokenizer`
    folder beside it (the layout of older exports)."""
    from transformers import AutoTokenizer

    if args.tokenizer:
        candidates = [(args.tokenizer, "--tokenizer")]
    else:
        candidates = [(args.target, "the --target directory")]
        sibling = os.path.join(os.path.dirname(os.path.abspath(args.target)), "tokenizer")
        if os.path.isdir(sibling):
            candidates.append((sibling, "the tokenizer folder beside --target"))
    errors = []
    for path, where in candidates:
        if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
            errors.append(f"no tokenizer in {path} ({where} holds none of {', '.join(TOKENIZER_FILES)})")
            continue
        try:
            return AutoTokenizer.from_pretrained(path)
        except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ...: report the first
            errors.append(f"could not load the tokenizer in {path} ({where}): {_first_line(exc)}")
    hint = "" if args.tokenizer else "; pass --tokenizer DIR"
    raise CliError(errors[0] + hint)


def _load_model(path: str, flag: str, device):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path).to(device).eval()
    except Exception as exc:  # noqa: BLE001 - a folder that is not a model: say which and why, in one line
        raise CliError(f"could not load a model from {path} ({flag}): {_first_line(exc)}") from None


def run_generate(args) -> int:
    check_args(args)
    import torch

    from ._hf_output import quiet_transformers
    from .api import generate

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    with quiet_transformers():
        tokenizer = _load_tokenizer(args)
        target = _load_model(args.target, "--target", device)
        draft = _load_model(args.draft, "--draft", device) if args.draft else None
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to(device)
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0, seed=args.seed, backend=args.backend,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    if args.temperature > 0:
        kwargs.update(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    if draft is not None:
        spec_kwargs = dict(assistant_model=draft, num_assistant_tokens=args.k)
    elif args.prompt_lookup:
        spec_kwargs = dict(prompt_lookup_num_tokens=args.prompt_lookup)
    else:
        spec_kwargs = {}
    try:
        plain_tps = None
        if args.plain:
            _, plain_stats = generate(target, ids, return_stats=True, **kwargs)
            plain_tps = plain_stats.tokens_per_s
        start = time.perf_counter()
        out, stats = generate(target, ids, return_stats=True, **kwargs, **spec_kwargs)
        seconds = time.perf_counter() - start
    except ValueError as exc:  # generate's argument checks (vocab mismatch, too long a prompt, ...) name the cause
        raise CliError(_first_line(exc)) from None
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
    try:
        return run_generate(args)
    except CliError as exc:
        print(f"specdec-fast: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
