"""What the logits processors (specdec_fast/processing/) cost per call, per step.

Per call on logits [B, N, V] (N = 5 positions: K = 4 drafts), V = 32000, a 1024-token prefix
(seq buffer 1024 + N + 1 wide), batch 1 and 8, float32, median and min of --calls after one warm-up (the two standardise rows alternated):
    standardise        kernels/verify/reference.py's standardise (temperature, top_k 50, top_p 0.9)
    standardise_all    the same + typical_p 0.9 + epsilon_cutoff 3e-4 + eta_cutoff 1e-3; and the
                       same + top_h 0.4 alone (its top-100 and entropy pass before top_k)
    one built-in processor at a time (LogitsProcessing.apply_), the chat-template combination
    (repetition_penalty + no_repeat_ngram_size 3 + min_new_tokens + suppress_tokens) and an
    identity user logits_processor (the eager host loop).

    python bench/bench_processing.py [--device cpu|cuda] [--batches 1,8] [--calls 10] [--threads N] [--out FILE]

Writes bench/results/processing_<device>.json. Not a test.
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

from machine import cpu_model, versions  # noqa: E402

VOCAB, N, CONTEXT, PROMPT = 32000, 5, 1024, 512
PROCESSORS = {
    "sequence_bias": dict(sequence_bias=[[[t], 0.5] for t in range(0, 200, 7)] + [[[t, t + 1, t + 2], 1.0] for t in range(50)]),
    "no_repeat_ngram_size=3": dict(no_repeat_ngram_size=3),
    "bad_words_ids": dict(bad_words_ids=[[t] for t in range(100, 150)] + [[t, t + 1] for t in range(50)]),
    "min_new_tokens+suppress+begin": dict(min_new_tokens=10, suppress_tokens=list(range(20)), begin_suppress_tokens=[5]),
    "penalties (in order, torch)": dict(repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2),
    "chat: repetition+ngram+min_new+suppress": dict(repetition_penalty=1.2, no_repeat_ngram_size=3, min_new_tokens=10,
                                                    suppress_tokens=[7, 9]),
}


def timed(fn, device, calls: int) -> tuple:
    """(median, min) seconds of fn() over ``calls`` calls after one warm-up (the min: this shared
    2-core machine's neighbours inflate single calls many-fold)."""
    times = []
    for i in range(calls + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def timed_pair(fa, fb, device, calls: int) -> tuple:
    """((median, min) of fa, (median, min) of fb), the two calls alternated so that the machine's
    load drifts hit both alike."""
    times = ([], [])
    for i in range(calls + 1):
        for k, fn in enumerate((fa, fb)):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i:
                times[k].append(time.perf_counter() - start)
    return tuple((statistics.median(t), min(t)) for t in times)


def run(args) -> dict:
    from specdec_fast.kernels.sampling_params import make_sampling_tensors
    from specdec_fast.kernels.verify.reference import standardise
    from specdec_fast.processing import LogitsProcessing, standardise_all

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for batch in args.batches:
        gen = torch.Generator().manual_seed(batch)
        logits = (torch.randn(batch, N, VOCAB, generator=gen) * 3).to(device)
        seq = torch.randint(0, VOCAB, (batch, CONTEXT + N + 1), generator=gen).to(device)
        end = torch.full((batch,), CONTEXT, dtype=torch.long, device=device)
        drafts = torch.randint(0, VOCAB, (batch, N - 1), generator=gen).to(device)
        start = torch.zeros(batch, dtype=torch.long, device=device)
        params = make_sampling_tensors(batch, device, temperature=0.8, top_k=50, top_p=0.9)
        work = logits.clone()

        def row(name, fn, measured=None):
            median, best = (t * 1e3 for t in (measured or timed(fn, device, args.calls)))
            rows.append(dict(batch=batch, name=name, median_ms=round(median, 3), min_ms=round(best, 3)))
            print(f"B={batch:2d}  {name:44s} median {median:8.2f} ms   min {best:8.2f} ms", flush=True)

        plain, every = timed_pair(
            lambda: standardise(logits, params),
            lambda: standardise_all(logits, params, typical_p=0.9, epsilon_cutoff=3e-4, eta_cutoff=1e-3),
            device, args.calls)
        row("standardise (top_k + top_p)", None, plain)
        row("standardise_all (+ typical + epsilon + eta)", None, every)
        row("standardise_all (+ top_h 0.4)", lambda: standardise_all(logits, params, top_h=0.4))
        row("logits.clone() (one [B, N, V] copy)", lambda: logits.clone())
        for name, options in PROCESSORS.items():
            processing = LogitsProcessing(vocab_size=VOCAB, prompt_width=PROMPT, device=device, eos_token_id=2,
                                          **options)
            row(name, lambda p=processing: p.apply_(work.copy_(logits), seq, end, drafts, start=start))
        user = LogitsProcessing(vocab_size=VOCAB, prompt_width=PROMPT, device=device,
                                logits_processor=[lambda ids, scores: scores])
        row("identity user logits_processor (eager)", lambda: user.apply_(work.copy_(logits), seq, end, drafts))
    return dict(device=str(device), machine=cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(),
                threads=torch.get_num_threads(), vocab=VOCAB, positions=N, context=CONTEXT, dtype="float32",
                calls=args.calls, rows=rows, **versions())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--calls", default=10, type=int)
    parser.add_argument("--threads", default=0, type=int)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = run(args)
    out = Path(args.out or ROOT / "bench" / "results" / f"processing_{torch.device(args.device).type}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
