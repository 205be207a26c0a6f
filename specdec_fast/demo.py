"""The demo: complete held-out code prompts with the shipped pair, four (five) ways side by side.

    python -m specdec_fast demo [--prompts 3] [--max-new-tokens 96] [-k 4] [--temperature 0] [--threads 1] [--head]

For each prompt: speculative decoding with specdec_fast.generate (streamed with
transformers.TextStreamer), then what a user would have run otherwise: specdec_fast without
the draft, transformers' generate, and transformers' assisted generation with the same draft
(on stderr: a live token counter on a terminal, else one line at the start and one at the end
of each). With --head (the default only where the pair's EAGLE-3 head pays: HEAD_PAYS below), a
fifth line: specdec_fast with the shipped head (specdec_fast/assets/pair/eagle3: a one-layer head
that reads the target's hidden states, drafters/eagle3.py) at the same K. A table gives each one's
tokens/s and how much faster the speculative run was. At
the end: the four pooled over all prompts, the stats (acceptance per position, mean accepted
length, Leviathan Theorem 3.8's predicted speedup beside the measured one) and, where the
prediction overshoots, one line saying which phase cost what (specdec_fast/engine/phase_costs.py).
"""
import argparse
import sys
import time

import torch

from ._hf_output import quiet_transformers
from .pair import eagle3_head_dir, held_out_prompts, load_demo_pair


# Whether the demo shows the shipped EAGLE-3 head (a fifth line) by default: only when it pays,
# i.e. decodes the demo pair faster than the shipped draft model, both at their best K. It does
# not: CPU (AMD EPYC, AVX-512), 1 thread, load average 0.6-0.9, 8 held-out prompts x 96 tokens,
# best of 7 passes (bench/bench_heads.py --k 2 3 4 5 --repeats 7:
# bench/results/heads_demo_head_cpu_avx512.json), both best at K = 4:
#   greedy    head 3.48 tokens/iteration, 0.89 ms draft/iteration, 1478 tok/s (median 1409)
#             draft model 3.59, 0.91 ms, 1580 tok/s (median 1507); plain 1466
#   sampling  head 3.20, 1.18 ms, 1226 tok/s; draft model 3.60, 1.07 ms, 1401 tok/s; plain 1389
# (the 1.02M-parameter head: draft vocabulary 1024, bench/results/eagle3_training.json). Set it
# True, with the new numbers, when a head that beats the draft model ships.
HEAD_PAYS = False


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="specdec-fast demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=3, help="how many held-out prompts (default 3)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("-k", "--num-assistant-tokens", type=int, default=4, help="draft tokens per step (K)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    # One thread by default: the pair is too small for intra-op parallelism to pay, and on a
    # busy 2-core box OpenMP threads that wait on each other made the whole demo 68 s instead of 7.5 s.
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (default 1; 0 = torch's default)")
    ap.add_argument("--head", action=argparse.BooleanOptionalAction, default=None,
                    help="also decode with the pair's shipped EAGLE-3 head (a fifth line); default: "
                         + ("on" if HEAD_PAYS else "off") + ", as it " + ("pays" if HEAD_PAYS else "does not pay")
                         + " on this pair (measured on a CPU)")
    args = ap.parse_args(argv)
    if args.head is None:
        args.head = HEAD_PAYS and eagle3_head_dir() is not None
    elif args.head and eagle3_head_dir() is None:
        ap.error("--head: the pair ships no EAGLE-3 head (specdec_fast/assets/pair/eagle3)")
    if args.prompts < 1:
        ap.error("--prompts must be >= 1")
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    if args.num_assistant_tokens < 1:
        ap.error("-k/--num-assistant-tokens must be >= 1")
    if args.threads < 0:
        ap.error("--threads must be >= 0")
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0:
        ap.error("need --temperature >= 0, 0 < --top-p <= 1, --top-k >= 0")
    return args


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        return False


class ProgressCounter:
    """A transformers streamer for a timed phase on `stream`. On a terminal: a live
    `label: n/total tokens` counter, rewritten in place with "\\r". Otherwise (CI logs, pipes,
    where every "\\r" update would pile up on one giant line): one line when the phase starts
    and one when it ends. live=None decides by stream.isatty()."""

    def __init__(self, label: str, total: int, stream=None, live: bool | None = None):
        self.label, self.total = label, total
        self.stream = sys.stderr if stream is None else stream  # looked up at call time (pytest swaps it)
        self.live = _is_terminal(self.stream) if live is None else live
        self.count, self._prompt_seen = 0, False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first puts the prompt
            self._prompt_seen = True
            if not self.live:
                self.stream.write(f"  {self.label}: started\n")
                self.stream.flush()
            return
        self.count += value.numel()
        if self.live:
            self.stream.write(f"\r  {self.label}: {self.count}/{self.total} tokens")
            self.stream.flush()

    def end(self) -> None:
        if self.live:
            self.stream.write("\r" + " " * (len(self.label) + 32) + "\r")
        else:
            self.stream.write(f"  {self.label}: {self.count}/{self.total} tokens, done\n")
        self.stream.flush()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def transformers_generate(target, input_ids, args, tokenizer, streamer=None, assistant=None) -> tuple[torch.Tensor, float]:
    """Target decoding with transformers' own generate: plain, or its assisted generation with
    ``assistant`` (its own defaults, as a user would call it). Returns (ids [1, prompt+new], seconds)."""
    sampling = args.temperature > 0
    kwargs = dict(do_sample=sampling, max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id, streamer=streamer)
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    if sampling:
        kwargs.update(temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p)
        torch.manual_seed(args.seed)
    else:
        kwargs.update(temperature=None, top_k=None, top_p=None)
    _sync(input_ids.device)
    start = time.perf_counter()
    with torch.inference_mode(), quiet_transformers():
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    _sync(input_ids.device)
    return out, time.perf_counter() - start


def engine_generate(target, input_ids, args, tokenizer, draft=None, streamer=None, head=None):
    """specdec_fast.generate, speculative with the draft (or the EAGLE-3 head) or plain without
    either: (ids, seconds, stats)."""
    from .api import generate  # the engine; imported here so the rest of the demo loads without it

    _sync(input_ids.device)
    start = time.perf_counter()
    out, stats = generate(
        target, input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft, draft_head=head,
        max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        num_assistant_tokens=args.num_assistant_tokens if draft is not None or head is not None else None,
        streamer=streamer, seed=args.seed, return_stats=True,
    )
    _sync(input_ids.device)
    return out, time.perf_counter() - start, stats


# The four ways to decode, in the order of the table: what a user would have run otherwise first.
METHODS = ("transformers generate", "transformers assisted", "specdec_fast plain", "specdec_fast speculative")
HEAD_METHOD = "specdec_fast EAGLE-3 head"  # the fifth line, where the pair ships its head
COUNT_WORDS = {4: "four", 5: "five"}


def method_labels(k: int) -> dict:
    return {"transformers generate": "transformers generate (target only)",
            "transformers assisted": "transformers assisted generation (same draft)",
            "specdec_fast plain": "specdec_fast plain (target only)",
            "specdec_fast speculative": f"specdec_fast speculative (K = {k})",
            HEAD_METHOD: f"specdec_fast EAGLE-3 head (K = {k})"}


def comparison_table(tokens: dict, seconds: dict, k: int) -> str:
    """Tokens/s of each method (those in ``tokens``, in METHODS order, the head last) and how much
    faster specdec_fast speculative is than each."""
    labels = method_labels(k)
    names = [name for name in METHODS + (HEAD_METHOD,) if name in tokens]
    width = max(len(labels[name]) for name in names)
    spec_s = seconds["specdec_fast speculative"]
    lines = [f"{'':{width}}  tokens  seconds    tok/s  speculative is"]
    for name in names:
        rate = tokens[name] / seconds[name]
        vs = "" if name == "specdec_fast speculative" else f"{seconds[name] / spec_s:.2f}x as fast"
        lines.append(f"{labels[name]:{width}}  {tokens[name]:6d}  {seconds[name]:7.2f}  {rate:7.1f}  {vs}")
    return "\n".join(lines)


def run_demo(argv=None) -> int:
    """Entry point of `python -m specdec_fast demo`; returns the process exit code."""
    from transformers import TextStreamer

    from .engine.phase_costs import merge_stats, phase_costs

    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    threads = f", {torch.get_num_threads()} thread(s)" if device.type == "cpu" else ""
    print(f"loading the demo pair on {device}{threads} ...", flush=True)
    with quiet_transformers():  # no "Loading weights" bars
        tokenizer, target, draft = load_demo_pair(device)
    head = None
    if args.head:
        from .heads import load_draft_head

        head = load_draft_head(eagle3_head_dir(), device=device, dtype=next(target.parameters()).dtype)
    methods = METHODS + ((HEAD_METHOD,) if head is not None else ())
    sizes = {name: sum(p.numel() for p in m.parameters()) for name, m in (("target", target), ("draft", draft))}
    head_size = "" if head is None else f", EAGLE-3 head {sum(p.numel() for p in head.parameters()) / 1e6:.2f}M params"
    print(f"  target {sizes['target'] / 1e6:.2f}M params, draft {sizes['draft'] / 1e6:.2f}M params{head_size}, "
          f"loaded in {time.perf_counter() - t0:.1f}s")
    k = args.num_assistant_tokens
    mode = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top-k {args.top_k}, top-p {args.top_p}"
    print(f"  decoding: {mode}, K = {k}, up to {args.max_new_tokens} new tokens; each prompt decoded "
          f"{COUNT_WORDS[len(methods)]} ways:\n"
          f"  transformers' generate and its assisted generation (what you would run without this package),\n"
          f"  then specdec_fast without and with the draft" + (" and with the EAGLE-3 head" if head is not None else "")
          + "\n")
    if head is None and eagle3_head_dir() is not None and not HEAD_PAYS:
        print("  (the pair's EAGLE-3 head is left out: on this pair it does not beat the draft model; "
              "--head adds it as a fifth line)\n")

    # The first engine call builds the C++ CPU kernels (or compiles the Triton ones), the first
    # transformers calls warm their own paths: keep all of that out of the timings.
    print("warming up (the first call compiles the kernels; can take a minute) ...", flush=True)
    t0 = time.perf_counter()
    warm_args = argparse.Namespace(**{**vars(args), "max_new_tokens": 2})
    warm_ids = tokenizer("import os\n", return_tensors="pt").input_ids.to(device)
    engine_generate(target, warm_ids, warm_args, tokenizer, draft)
    engine_generate(target, warm_ids, warm_args, tokenizer, None)
    if head is not None:
        engine_generate(target, warm_ids, warm_args, tokenizer, head=head)
    transformers_generate(target, warm_ids, warm_args, tokenizer, assistant=draft)
    print(f"  ready in {time.perf_counter() - t0:.1f}s\n", flush=True)

    tokens, seconds = dict.fromkeys(methods, 0), dict.fromkeys(methods, 0.0)
    spec_stats, plain_stats, head_stats = [], [], []
    labels = method_labels(k)
    for i, prompt in enumerate(held_out_prompts(args.prompts), 1):
        input_ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
        n = input_ids.shape[1]
        print(f"=== prompt {i}/{args.prompts} (held-out stdlib code) ===")
        print(prompt, end="", flush=True)
        print("\n--- speculative completion (streamed) ---", flush=True)
        outs, secs = {}, {}
        outs["specdec_fast speculative"], secs["specdec_fast speculative"], stats = engine_generate(
            target, input_ids, args, tokenizer, draft, TextStreamer(tokenizer, skip_prompt=True))
        print(flush=True)
        progress = lambda name: ProgressCounter(labels[name], args.max_new_tokens)  # noqa: E731
        outs["specdec_fast plain"], secs["specdec_fast plain"], plain = engine_generate(
            target, input_ids, args, tokenizer, None, progress("specdec_fast plain"))
        outs["transformers generate"], secs["transformers generate"] = transformers_generate(
            target, input_ids, args, tokenizer, progress("transformers generate"))
        outs["transformers assisted"], secs["transformers assisted"] = transformers_generate(
            target, input_ids, args, tokenizer, progress("transformers assisted"), assistant=draft)
        if head is not None:
            outs[HEAD_METHOD], secs[HEAD_METHOD], with_head = engine_generate(
                target, input_ids, args, tokenizer, None, progress(HEAD_METHOD), head=head)
            head_stats.append(with_head)
        new = {name: out.shape[1] - n for name, out in outs.items()}
        for name in methods:
            tokens[name] += new[name]
            seconds[name] += secs[name]
        spec_stats.append(stats)
        plain_stats.append(plain)
        print("\n" + comparison_table(new, secs, k))
        if args.temperature == 0:
            reference = outs["transformers generate"]
            same = [name for name in methods[1:] if outs[name].shape == reference.shape and bool((outs[name] == reference).all())]
            verdict = f"yes, all {COUNT_WORDS[len(methods)]}" if len(same) == len(methods) - 1 else \
                "NO: only " + (", ".join(same) or "none")
            print(f"greedy output identical to transformers generate: {verdict}")
        print(f"alpha {stats.alpha:.2f}, mean accepted length {stats.mean_accepted_length:.2f}, "
              f"predicted speedup {stats.predicted_speedup:.2f}x over plain (Leviathan Thm 3.8)"
              + ("" if head is None else f"; EAGLE-3 head: alpha {with_head.alpha:.2f}, mean accepted length "
                 f"{with_head.mean_accepted_length:.2f}") + "\n")

    print(f"=== all {args.prompts} prompt(s), {device}{threads} ===")
    print(comparison_table(tokens, seconds, k))
    merged, merged_plain = merge_stats(spec_stats), merge_stats(plain_stats)
    merged.plain_tokens_per_s = merged_plain.tokens_per_s
    print("\nspeculative decoding stats, all prompts pooled:")
    print(merged.format())
    if head_stats:
        with_head = merge_stats(head_stats)
        print(f"EAGLE-3 head, all prompts pooled: alpha {with_head.alpha:.2f}, mean accepted length "
              f"{with_head.mean_accepted_length:.2f}, acceptance per position "
              f"{', '.join(f'{a:.2f}' for a in with_head.acceptance_per_position)}")
    costs = phase_costs(merged, merged_plain)
    if costs is not None and costs.gap_is_large():
        print(costs.explain())
    return 0


if __name__ == "__main__":
    sys.exit(run_demo())
