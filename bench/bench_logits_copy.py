"""What the loop saved by keeping logits in the runners' dtype (issue 16 point 1): the verify step
used to call chain_verify on ``target.score(...).float()`` and on draft logits cast to float32 one
step at a time; now both stay bf16 (the kernels read bf16 and standardise in float32 inside).

Per verify call, 8B-shaped vocabulary (V = 128256), K = 4 drafts, batch 1 / 8 / 32:
    old   target [B, K+1, V].float() + K draft [B, V].float() + stack (float32) + verify(float32)
    new   stack (bf16) + verify(bf16)
Median of --calls calls after one warm-up, greedy and T = 1 sampling, the engine's prepared
verify (kernels.verify.prepared_impls: C++ on CPU, Triton on CUDA).

    python bench/bench_logits_copy.py [--device cpu|cuda] [--batches 1,8,32] [--calls 20] [--threads 1] [--out FILE]

Writes bench/results/logits_copy_<device>.json. Not a test.
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

VOCAB, K = 128256, 4


def timed(fn, device, calls: int) -> float:
    """Median seconds of fn() over ``calls`` calls after one warm-up."""
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
    return statistics.median(times)


def run(args) -> dict:
    from specdec_fast.kernels.sampling_params import make_sampling_tensors
    from specdec_fast.kernels.verify import prepared_impls

    device = torch.device(args.device)
    verify = prepared_impls(None, device)[0]
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        gen = torch.Generator(device=device).manual_seed(batch)
        target = torch.randn(batch, K + 1, VOCAB, generator=gen, device=device).to(torch.bfloat16)
        steps = [torch.randn(batch, VOCAB, generator=gen, device=device).to(torch.bfloat16) for _ in range(K)]
        drafts = torch.randint(0, VOCAB, (batch, K), generator=gen, device=device)
        for mode, sampling in (("greedy", dict(temperature=0.0)), ("sampling T=1", dict(temperature=1.0))):
            params = make_sampling_tensors(batch, device, seed=0, **sampling)

            def old():
                draft = torch.stack([s.float() for s in steps], 1)
                return verify(target.float(), draft, drafts, params)

            def new():
                return verify(target, torch.stack(steps, 1), drafts, params)

            def cast_only():
                target.float()
                torch.stack([s.float() for s in steps], 1)

            same = all(torch.equal(a, b) for a, b in zip(old(), new()))
            row = dict(batch=batch, mode=mode, old_s=timed(old, device, args.calls), new_s=timed(new, device, args.calls),
                       float_copies_s=timed(cast_only, device, args.calls), same_tokens=same,
                       float32_bytes_written=4 * batch * (2 * K + 1) * VOCAB)
            row["saved_s"] = row["old_s"] - row["new_s"]
            rows.append(row)
            print(f"B={batch:3d} {mode:13s} old {row['old_s'] * 1e3:8.2f} ms  new {row['new_s'] * 1e3:8.2f} ms  "
                  f"(float32 copies alone {row['float_copies_s'] * 1e3:7.2f} ms, {row['float32_bytes_written'] / 1e6:.0f} MB)  "
                  f"same tokens: {same}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return dict(device=name, threads=torch.get_num_threads(), vocab=VOCAB, k=K, versions=versions(), rows=rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run(args)
    out = Path(args.out or ROOT / "bench" / "results" / f"logits_copy_{args.device}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
