"""Command line: `specdec-fast generate ...` / `python -m specdec_fast generate ...`, and `demo`.

    specdec-fast generate --target DIR [--draft DIR | --draft-head DIR | --prompt-lookup N | --early-exit N]
        (--prompt TEXT | --prompts FILE.jsonl --output OUT.jsonl [--batch-size N] [--on-error skip|fail])
        [--chat] [--dtype D] [--max-new-tokens N] [--k K | --tree [N|static|dynamic]] [--temperature T] [--top-k N] [--top-p P]
        [--min-p P] [--seed S] [--repetition-penalty R] [--min-new-tokens N] [--stop TEXT ...]
        [--num-return-sequences N] [--device DEV] [--tokenizer DIR] [--backend B] [--plain] [--threads N]
        [--tp N [--tp-draft replicated|sharded] [--tp-timeout S]]
    specdec-fast demo [demo options]   (specdec_fast.demo.run_demo)
    specdec-fast build-cpu             compile the C++ CPU kernels now (cli_build.py)
    specdec-fast env                   the versions, devices and backends (cli_env.py)
    torchrun --nproc-per-node N -m specdec_fast generate ... --tp N   tensor parallelism (cli_tp.py)

--prompts runs a data set (specdec_fast/cli_dataset.py: the file formats, bad lines, batches).

A wrong path or value ends with one line on stderr, `specdec-fast: error: ...`, and exit status
2 (argparse's own usage errors too); the tokenizer comes from --tokenizer, else the target's
directory.
"""
import argparse
import math
import os
import sys
import time

from .cli_build import add_build_parser, run_build_cpu
from .cli_env import add_env_parser, run_env
from .cli_errors import CliError, first_line
from .cli_tp import TensorParallelRun, add_tp_flags, check_tp_args


def k_option(text: str):
    """--k: an int (draft tokens per iteration) or "adaptive" (engine/schedule.py chooses before each iteration)."""
    if text == "adaptive":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or 'adaptive', got {text!r}") from None


def tree_option(text: str):
    """--tree's value: a node count (2-64), "static" or "dynamic" (generate(tree=...))."""
    if text in ("static", "dynamic"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a node count, 'static' or 'dynamic', got {text!r}") from None


def _generate_parser(sub):
    ap = sub.add_parser("generate", help="complete a prompt with speculative decoding and print the stats")
    ap.add_argument("--target", required=True, help="target model directory (transformers from_pretrained)")
    ap.add_argument("--draft", help="draft model directory (same vocabulary as the target)")
    ap.add_argument("--draft-head", metavar="DIR", help="a draft head that reads the target's hidden states (an EAGLE-3, "
                    "DFlash or DFlash2 head in its published layout: config.json + model.safetensors / "
                    "pytorch_model.bin)")
    ap.add_argument("--prompt-lookup", type=int, metavar="N", help="prompt-lookup drafting with N tokens (no draft model)")
    ap.add_argument("--early-exit", type=int, metavar="N", help="draft with the target's own first N layers, its final "
                    "norm and LM head (transformers' assistant_early_exit: checkpoints trained to exit early, LayerSkip)")
    ap.add_argument("--mtp", action="store_true", help="draft with the target's own multi-token-prediction layer, read "
                    "from its checkpoint (transformers' use_mtp: GLM-4.5 / 4.6 / 4.7, DeepSeek-V3; also Qwen3-Next, "
                    "Qwen3.5)")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="one prompt: print its completion and the stats")
    source.add_argument("--prompts", metavar="FILE", help='a JSONL data set, one {"prompt": ...} object per line')
    ap.add_argument("--output", metavar="FILE", help="with --prompts: the JSONL results, written as each batch finishes")
    ap.add_argument("--batch-size", type=int, default=8, help="with --prompts: rows per generate() call (default 8)")
    ap.add_argument("--on-error", choices=["skip", "fail"], default="fail",
                    help="with --prompts: a bad line or a refused row is skipped (reported by line number) or ends "
                         "the run (default)")
    ap.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to each prompt")
    ap.add_argument("--dtype", choices=DTYPES, default=None,
                    help="load the models in this dtype (default: transformers' default; auto: the checkpoint's)")
    ap.add_argument("--tokenizer", help="tokenizer directory (default: the target's)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=k_option, default=None, help="draft tokens per iteration (default 4; 1 with --mtp; a DFlash "
                    "drafter's block - 1), or 'adaptive': the engine chooses before each iteration "
                    "(num_assistant_tokens_schedule='adaptive'; a draft model, an early exit, an EAGLE-3 head, an MTP "
                    "layer or a DFlash block drafter)")
    ap.add_argument("--tree", type=tree_option, nargs="?", const=True, default=None, metavar="N|static|dynamic",
                    help="draft a token tree per iteration instead of a chain of --k tokens (a draft model or an EAGLE-3 "
                         "head): the recommended tree for the sampling mode, or one of N nodes (2-64), or the default "
                         "static / dynamic tree (generate(tree=...)); it pays on a GPU, where scoring a tree costs "
                         "about what a chain does: on a CPU a chain is faster (README, token trees)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repetition-penalty", type=float, default=None, help="transformers' repetition_penalty (1 = off)")
    ap.add_argument("--min-new-tokens", type=int, default=None, help="no EOS before this many new tokens")
    ap.add_argument("--stop", action="append", default=None, metavar="TEXT",
                    help="a stop string (repeatable): a row ends at the token that completes it")
    ap.add_argument("--num-return-sequences", type=int, default=1,
                    help="completions per prompt (sampling: --temperature > 0)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--backend", choices=["triton", "cpp", "torch"], default=None, help="verify kernel backend")
    ap.add_argument("--plain", action="store_true",
                    help="also time plain decoding (K=0) for the measured speedup (both ways warmed up first)")
    # Small models on a busy CPU: OpenMP threads that wait on each other cost more than they
    # give (the demo pair, 2 threads on a loaded 2-core box: 8 tok/s against 94 with 1 thread).
    ap.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (default 0 = torch's default)")
    add_tp_flags(ap)
    return ap


DTYPES = ("auto", "float32", "float16", "bfloat16")  # from_pretrained(dtype=...): "auto" = the checkpoint's
# Any one of these marks a folder that holds a tokenizer (fast, sentencepiece, BPE or WordPiece files).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


_first_line = first_line


def check_args(args) -> None:
    """Everything that can be checked before loading a model; raises CliError naming the flag."""
    for flag, path in (("--target", args.target), ("--draft", args.draft), ("--draft-head", args.draft_head),
                       ("--tokenizer", args.tokenizer)):
        if path is not None and not os.path.isdir(path):
            raise CliError(f"no such directory: {path} ({flag})")
    mtp = True if args.mtp else None
    if sum(x is not None for x in (args.draft, args.draft_head, args.prompt_lookup, args.early_exit, mtp)) > 1:
        raise CliError("give one of --draft, --draft-head, --prompt-lookup, --early-exit and --mtp")
    if args.prompts is not None:
        if not os.path.isfile(args.prompts):
            raise CliError(f"no such file: {args.prompts} (--prompts)")
        if args.output is None:
            raise CliError("--prompts needs --output FILE (the JSONL results)")
        out_dir = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(out_dir):
            raise CliError(f"no such directory: {out_dir} (--output)")
        if os.path.abspath(args.output) == os.path.abspath(args.prompts):
            raise CliError("--output must differ from --prompts")
        if args.plain:
            raise CliError("--plain times a single --prompt; not with --prompts")
    elif args.output is not None:
        raise CliError("--output goes with --prompts FILE")
    if args.batch_size < 1:
        raise CliError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.threads < 0:
        raise CliError(f"--threads must be >= 0 (0 = torch's default), got {args.threads}")
    if args.k == "adaptive" and (args.prompt_lookup or (args.draft is None and args.draft_head is None
                                                         and args.early_exit is None and not args.mtp)):
        why = ("prompt lookup drafts its --prompt-lookup N tokens" if args.prompt_lookup
               else "without one the CLI decodes plainly, with no K")
        raise CliError("--k adaptive chooses the K of a draft model (--draft, --early-exit), an EAGLE-3 head or a DFlash "
                       f"block drafter (--draft-head) or an MTP layer (--mtp); {why}")
    if args.tree is not None:
        if args.draft is None and args.draft_head is None and args.early_exit is None and not args.mtp:
            raise CliError("--tree needs a drafter that expands the tree: --draft, --early-exit, an EAGLE-3 --draft-head "
                           "or --mtp")
        if args.k is not None:
            raise CliError("--tree sets the drafts by its shape; not with --k")
        from .drafters.token_tree import MAX_NODES

        if not isinstance(args.tree, bool) and isinstance(args.tree, int) and not 2 <= args.tree <= MAX_NODES:
            raise CliError(f"--tree N must be in [2, {MAX_NODES}] (nodes, the root included), got {args.tree}")
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--k", None if args.k == "adaptive" else args.k),
                        ("--prompt-lookup", args.prompt_lookup), ("--early-exit", args.early_exit)):
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
    if args.repetition_penalty is not None and not (math.isfinite(args.repetition_penalty) and args.repetition_penalty > 0):
        raise CliError(f"--repetition-penalty must be > 0 (1 = off), got {args.repetition_penalty}")
    if args.min_new_tokens is not None and args.min_new_tokens < 0:
        raise CliError(f"--min-new-tokens must be >= 0, got {args.min_new_tokens}")
    if args.num_return_sequences < 1:
        raise CliError(f"--num-return-sequences must be >= 1, got {args.num_return_sequences}")
    if args.num_return_sequences > 1 and args.temperature == 0:
        raise CliError("--num-return-sequences > 1 needs sampling (--temperature > 0): greedy gives one completion")
    if args.num_return_sequences > 1 and args.prompts is not None:
        raise CliError("--num-return-sequences goes with a single --prompt")
    if args.stop is not None and any(not text for text in args.stop):
        raise CliError("--stop needs a non-empty string")
    check_tp_args(args)


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


def _load_model(path: str, flag: str, device, dtype=None):
    from transformers import AutoModelForCausalLM

    try:
        kwargs = {} if dtype is None else {"dtype": dtype}
        return AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device).eval()
    except Exception as exc:  # noqa: BLE001 - a folder that is not a model: say which and why, in one line
        raise CliError(f"could not load a model from {path} ({flag}): {_first_line(exc)}") from None


def _load_head(path: str, device, dtype=None):
    from .heads import load_draft_head

    try:
        return load_draft_head(path, device=device, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - a folder that is not a head: say which and why, in one line
        raise CliError(f"could not load a draft head from {path} (--draft-head): {_first_line(exc)}") from None


def _generate_kwargs(args, tokenizer, draft, head=None) -> dict:
    """generate()'s keyword arguments from the flags (the sampling mode, the drafter)."""
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0, seed=args.seed, backend=args.backend,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    if args.tp is not None and args.tp_draft == "sharded":
        kwargs["shard_draft"] = True
    if args.temperature > 0:
        kwargs.update(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    if args.repetition_penalty is not None:
        kwargs.update(repetition_penalty=args.repetition_penalty)
    if args.min_new_tokens is not None:
        kwargs.update(min_new_tokens=args.min_new_tokens)
    if args.stop:
        kwargs.update(stop_strings=list(args.stop), tokenizer=tokenizer)
    if args.num_return_sequences > 1:
        kwargs.update(num_return_sequences=args.num_return_sequences)
    if args.tree is not None:
        k = dict(tree=args.tree)
    elif args.k == "adaptive":
        k = dict(num_assistant_tokens_schedule="adaptive")
    else:
        k = dict(num_assistant_tokens=args.k)
    if draft is not None:
        kwargs.update(assistant_model=draft, **k)
    elif head is not None:
        kwargs.update(draft_head=head, **k)
    elif args.prompt_lookup:
        kwargs.update(prompt_lookup_num_tokens=args.prompt_lookup)
    elif args.early_exit is not None:
        kwargs.update(assistant_early_exit=args.early_exit, **k)
    elif args.mtp:
        kwargs.update(use_mtp=True, **k)
    return kwargs


def run_generate(args) -> int:
    check_args(args)
    if args.tp is None:
        return _run_generate(args, None)
    run = TensorParallelRun(args)
    try:
        return _run_generate(args, run)
    finally:
        run.close()


def _run_generate(args, tp) -> int:
    """One process's run; tp: this rank's TensorParallelRun under --tp (else None)."""
    import torch

    from . import cli_dataset
    from ._hf_output import quiet_transformers
    from .api import generate

    try:  # a data set's bad lines are found (and under --on-error fail reported) before any model loads
        rows = cli_dataset.read_rows(args.prompts, args.on_error) if args.prompts is not None else None
        device = tp.device if tp is not None else torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if args.threads:
            torch.set_num_threads(args.threads)
        with quiet_transformers():
            tokenizer = _load_tokenizer(args)
            if args.chat and not getattr(tokenizer, "chat_template", None):
                raise CliError(f"--chat: the tokenizer ({args.tokenizer or args.target}) has no chat template")
            if rows is not None:
                rows = cli_dataset.encode_rows(rows, tokenizer, args)
            if tp is None:
                target = _load_model(args.target, "--target", device, args.dtype)
                draft = _load_model(args.draft, "--draft", device, args.dtype) if args.draft else None
            else:  # this rank's slices of the target (and of the draft with --tp-draft sharded)
                target = tp.load(args.target, "--target", args.dtype)
                draft = tp.load(args.draft, "--draft", args.dtype, args.tp_draft == "sharded") if args.draft else None
            head = None
            if args.draft_head:  # in the target's dtype (the head's checkpoint may be stored in another)
                head = _load_head(args.draft_head, device, next(target.parameters()).dtype)
        kwargs = _generate_kwargs(args, tokenizer, draft, head)
        if rows is not None:
            def generate_batch(ids, mask, seed, max_new_tokens=args.max_new_tokens):
                return generate(target, ids, mask, return_stats=True, **{**kwargs, "seed": seed,
                                                                          "max_new_tokens": max_new_tokens})

            if tp is not None and not tp.main:
                args.output = tp.output_path(args.output)
                return cli_dataset.run_rows(args, rows, tokenizer, generate_batch, device, quiet=True)
            return cli_dataset.run_rows(args, rows, tokenizer, generate_batch, device)
    except cli_dataset.DatasetError as exc:
        raise CliError(str(exc)) from None
    ids = torch.tensor([cli_dataset.encode(tokenizer, args.prompt, args.chat)], dtype=torch.long, device=device)
    spec = {name: kwargs.pop(name) for name in ("assistant_model", "draft_head", "num_assistant_tokens",
                                                 "num_assistant_tokens_schedule", "prompt_lookup_num_tokens",
                                                 "assistant_early_exit", "use_mtp", "tree")
            if name in kwargs}
    try:
        plain_tps = None
        if args.plain:
            # The ratio compares two warm calls: a first call compiles the kernels (Triton, or the
            # C++ CPU ones) and builds and captures its engine, and timed first, plain decoding
            # would pay the target's share of that for both and overstate the speedup. Two new
            # tokens each, as the demo warms up (an engine the timed call outgrows is rebuilt in
            # both timed calls alike).
            warm = {**kwargs, "max_new_tokens": min(2, args.max_new_tokens)}
            generate(target, ids, **warm)
            generate(target, ids, **warm, **spec)
            _, plain_stats = generate(target, ids, return_stats=True, **kwargs)
            plain_tps = plain_stats.tokens_per_s
        start = time.perf_counter()
        out, stats = generate(target, ids, return_stats=True, **kwargs, **spec)
        seconds = time.perf_counter() - start
    except ValueError as exc:  # generate's argument checks (vocab mismatch, too long a prompt, ...) name the cause
        raise CliError(_first_line(exc)) from None
    stats.plain_tokens_per_s = plain_tps
    for i, row in enumerate(out):
        if len(out) > 1:
            print(f"--- completion {i + 1} of {len(out)} ---")
        print(tokenizer.decode(row, skip_special_tokens=True))
    drafter = "head" if args.draft_head else "draft" if args.draft else "mtp" if args.mtp else None
    # a draft model or head: replicated or sharded (--tp-draft); a target's MTP layer: read in slices by every rank
    shared = "" if drafter is None else ", mtp layer in slices" if args.mtp else f", {drafter} {args.tp_draft}"
    where = device if tp is None else f"{device}, tensor parallel over {tp.size} ranks{shared}"
    print(f"\n--- stats ({where}, {seconds:.2f} s) ---")
    print(stats.format())
    return 0


def main(argv=None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away (`specdec-fast generate ... | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout at exit
        return 1


def _main(argv) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="specdec-fast", description="speculative decoding with fused kernels")
    sub = ap.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    sub.add_parser("demo", help="the shipped demo (options: specdec-fast demo --help)", add_help=False)
    add_build_parser(sub)
    add_env_parser(sub)
    if argv[:1] == ["demo"]:
        try:
            from .demo import run_demo
        except ImportError as exc:
            print(f"the demo is not available in this installation (specdec_fast.demo: {exc})", file=sys.stderr)
            return 2
        return run_demo(argv[1:])
    args = ap.parse_args(argv)
    if args.command == "build-cpu":
        return run_build_cpu()
    if args.command == "env":
        return run_env()
    from .distributed import TensorParallelError

    try:
        return run_generate(args)
    except CliError as exc:
        print(f"specdec-fast: error: {exc}", file=sys.stderr)
        return 2
    except TensorParallelError as exc:  # another rank failed (its line), or the ranks disagreed
        print(f"specdec-fast: error: {first_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
