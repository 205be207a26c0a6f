"""The engine's graph code path over a (K, batch) table, both drafters, paged runners, Triton kernels:
for each cell, eager vs cuda_graphs="static" (the CPU twin: every graph-safety check, Triton
specialisation keys included) or cuda_graphs=True (real CUDA graphs), tokens compared.

    python bench/graph_capture_table.py --device cpu --batches 1,3,8 --out bench/results/graph_capture_table_cpu.json
    python bench/graph_capture_table.py --device cuda --batches 1,3,8,32,64 --mode graphs --out ...

On CPU the Triton kernels run through the interpreter (set here before triton is imported).
Writes one JSON record per cell: ok, the error if any, iterations, graph replays, seconds.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # tests.* (the tiny models)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ks", default="1-8", help="a range lo-hi or a comma list")
    parser.add_argument("--batches", default="1,3,8")
    parser.add_argument("--mode", choices=["static", "graphs"], default="static")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    import specdec_fast.api as api
    from machine import cpu_model, versions
    from tests.conftest import on_device
    from tests.engine.models import left_padded_prompts, make_draft
    from tests.engine.test_paged_runner import tiny

    torch.set_num_threads(1)
    lo, _, hi = args.ks.partition("-")
    ks = list(range(int(lo), int(hi) + 1)) if hi else [int(k) for k in args.ks.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    target = tiny("llama", layers=1)
    target, draft = on_device(args.device, target, make_draft(target, noise=0.1))
    mode = "static" if args.mode == "static" else True
    records = []
    for k in ks:
        for batch in batches:
            lengths = [(3 + 5 * row) % 11 + 2 for row in range(batch)]
            ids, mask = on_device(args.device, *left_padded_prompts(lengths, vocab=96, seed=k * 100 + batch))
            for drafter in ("model", "lookup"):
                extra = (dict(assistant_model=draft, num_assistant_tokens=k) if drafter == "model"
                         else dict(prompt_lookup_num_tokens=k))
                common = dict(max_new_tokens=2 * k + 4, pad_token_id=0, do_sample=True, temperature=0.9, top_k=20,
                              seed=k, backend="triton", runner="paged", return_stats=True, **extra)
                t0 = time.perf_counter()
                record = dict(k=k, batch=batch, drafter=drafter, mode=args.mode)
                try:
                    eager, _ = api.generate(target, ids, mask, cuda_graphs=False, **common)
                    graphed, stats = api.generate(target, ids, mask, cuda_graphs=mode, **common)
                    record.update(ok=bool(torch.equal(eager, graphed)), iterations=stats.iterations,
                                  replays=stats.graph_replays, error=None)
                except Exception as exc:  # a failing cell is a result: record it and go on
                    record.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
                record["seconds"] = round(time.perf_counter() - t0, 2)
                records.append(record)
                print(json.dumps(record), flush=True)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_model()
    summary = dict(cells=len(records), failed=sum(not r["ok"] for r in records), device=device_name,
                   versions=versions(), records=records)
    print(f"{summary['failed']} of {summary['cells']} cells failed")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
