"""The demo: complete held-out code prompts with the shipped pair, plain vs speculative.

    python -m specdec_fast demo [--prompts 3] [--max-new-tokens 96] [-k 4] [--temperature 0] [--threads 1]

For each prompt: speculative decoding with specdec_fast.generate (streamed with
transformers.TextStreamer), then the target alone through the same engine and through
transformers' generate (on stderr: a live token counter on a terminal, else one line at the
start and one at the end of each phase), the wall times, and the run's stats
(acceptance per position, mean accepted length, Leviathan Theorem 3.8's predicted speedup
beside the measured one).
"""
import argparse
import sys
import time

import torch

from .pair import held_out_prompts, load_demo_pair


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
    args = ap.parse_args(argv)
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


def transformers_generate(target, input_ids, args, tokenizer, streamer=None) -> tuple[torch.Tensor, float]:
    """Target-only decoding with transformers' own generate: (ids [1, prompt+new], seconds)."""
    sampling = args.temperature > 0
    kwargs = dict(do_sample=sampling, max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id, streamer=streamer)
    if sampling:
        kwargs.update(temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p)
        torch.manual_seed(args.seed)
    else:
        kwargs.update(temperature=None, top_k=None, top_p=None)
    _sync(input_ids.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    _sync(input_ids.device)
    return out, time.perf_counter() - start


def engine_generate(target, input_ids, args, tokenizer, draft=None, streamer=None):
    """specdec_fast.generate, speculative with the draft or plain without it: (ids, seconds, stats)."""
    from .api import generate  # the engine; imported here so the rest of the demo loads without it

    _sync(input_ids.device)
    start = time.perf_counter()
    out, stats = generate(
        target, input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft,
        max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        num_assistant_tokens=args.num_assistant_tokens if draft is not None else None,
        streamer=streamer, seed=args.seed, return_stats=True,
    )
    _sync(input_ids.device)
    return out, time.perf_counter() - start, stats


def _rate(ids: torch.Tensor, prompt_len: int, seconds: float) -> str:
    new = ids.shape[1] - prompt_len
    return f"{new:4d} tokens in {seconds:6.2f}s ({new / seconds:7.1f} tok/s)"


def run_demo(argv=None) -> int:
    """Entry point of `python -m specdec_fast demo`; returns the process exit code."""
    from transformers import TextStreamer

    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    threads = f", {torch.get_num_threads()} thread(s)" if device.type == "cpu" else ""
    print(f"loading the demo pair on {device}{threads} ...", flush=True)
    if not _is_terminal(sys.stderr):  # transformers' loading bars would also pile "\r" updates on one line
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    tokenizer, target, draft = load_demo_pair(device)
    sizes = {name: sum(p.numel() for p in m.parameters()) for name, m in (("target", target), ("draft", draft))}
    print(f"  target {sizes['target'] / 1e6:.2f}M params, draft {sizes['draft'] / 1e6:.2f}M params, "
          f"loaded in {time.perf_counter() - t0:.1f}s")
    mode = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top-k {args.top_k}, top-p {args.top_p}"
    print(f"  decoding: {mode}, K = {args.num_assistant_tokens}, up to {args.max_new_tokens} new tokens\n")

    # The first engine call builds the C++ CPU kernels (or compiles the Triton ones): keep
    # that out of the timings.
    print("warming up (the first call compiles the kernels; can take a minute) ...", flush=True)
    t0 = time.perf_counter()
    warm_args = argparse.Namespace(**{**vars(args), "max_new_tokens": 2})
    warm_ids = tokenizer("import os\n", return_tensors="pt").input_ids.to(device)
    engine_generate(target, warm_ids, warm_args, tokenizer, draft)
    engine_generate(target, warm_ids, warm_args, tokenizer, None)
    print(f"  ready in {time.perf_counter() - t0:.1f}s\n", flush=True)

    totals = {"transformers": 0.0, "plain": 0.0, "speculative": 0.0}
    for i, prompt in enumerate(held_out_prompts(args.prompts), 1):
        input_ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
        n = input_ids.shape[1]
        print(f"=== prompt {i}/{args.prompts} (held-out stdlib code) ===")
        print(prompt, end="", flush=True)
        print("\n--- speculative completion (streamed) ---", flush=True)
        spec_ids, spec_s, stats = engine_generate(target, input_ids, args, tokenizer, draft, TextStreamer(tokenizer, skip_prompt=True))
        plain_ids, plain_s, _ = engine_generate(target, input_ids, args, tokenizer, None,
                                                ProgressCounter("plain decoding (target only)", args.max_new_tokens))
        hf_ids, hf_s = transformers_generate(target, input_ids, args, tokenizer,
                                             ProgressCounter("transformers generate (target only)", args.max_new_tokens))
        for name, seconds in (("transformers", hf_s), ("plain", plain_s), ("speculative", spec_s)):
            totals[name] += seconds
        print(f"\ntransformers generate, target only: {_rate(hf_ids, n, hf_s)}")
        print(f"specdec_fast plain, target only:    {_rate(plain_ids, n, plain_s)}")
        print(f"specdec_fast speculative, K = {args.num_assistant_tokens}:   {_rate(spec_ids, n, spec_s)}")
        if args.temperature == 0:
            same = all(o.shape == spec_ids.shape and bool((o == spec_ids).all()) for o in (plain_ids, hf_ids))
            print(f"greedy output identical to plain decoding: {'yes' if same else 'NO'}")
        stats.plain_tokens_per_s = (plain_ids.shape[1] - n) / plain_s
        print(stats.format())
        print()
    print("all prompts: " + ", ".join(f"{name} {s:.2f}s" for name, s in totals.items())
          + f"; speculative vs plain {totals['plain'] / totals['speculative']:.2f}x on {device}")
    return 0


if __name__ == "__main__":
    sys.exit(run_demo())
