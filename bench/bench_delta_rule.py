"""A Gated DeltaNet layer's delta rule (runners/paged_qwen3_next.py) on the CPU, each way the runner runs
it against the token-by-token rule (_steps, the reference), over the same inputs, with the outputs'
largest difference: a prefill's chunks, and a score call's tokens at once.

    python bench/bench_delta_rule.py --cpu [--threads N] [--out bench/results/delta_rule_cpu.json]
        Qwen3-Next's layer widths cut to 8 value heads (4 key heads of 128, value heads of 128, a
        convolution of 4 over 3072 channels), float32. Prefill rows: one row of 64 / 256 / 1024 tokens,
        _prefill_chunks against _steps. Score rows: B 1 / 8 rows of N = 5 tokens (a verify of K = 4)
        from a state, _score_block against _steps. ms of each way (median of 3 after a warm-up).
        Predicted for the score rows: ~20 batched ops against ~15 a token, so ~3-4x at N = 5, B = 1
        (launch-bound), less at B = 8 (the ops grow with B, the count does not).
        Predicted for the prefill rows: the step loop costs ~15 small ops a token, the chunked one a few batched products and a
        64 x 64 triangular solve a chunk, so the chunked way wins by an order of magnitude from a few
        hundred tokens, less at 64 (one chunk, its solve for few tokens). Measured (this 2-core EPYC, 1
        thread, delta_rule_cpu.json): prefill 10-16x at every length, 64 included; score 1.6x at B = 1,
        1.0x at B = 8 (the arithmetic dominates on a CPU at these widths).
    python bench/bench_delta_rule.py --smoke --out F
        Tiny widths and lengths: not a measurement, a check that the script runs.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import versions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CPU = dict(nk=4, nv=8, dk=128, dv=128, lengths=(64, 256, 1024), batches=(1, 8), queries=5, reps=3)
SMOKE = dict(nk=2, nv=4, dk=8, dv=12, lengths=(5, 70), batches=(1, 3), queries=3, reps=1)


def _layer(shape: dict):
    """A Qwen3NextGatedDeltaNet module of these widths (random weights) and the runner half that runs it."""
    import transformers as tf
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    from specdec_fast.runners.paged_qwen3_next import PagedQwen3NextRunner, _DeltaNet, _States

    torch.manual_seed(0)
    config = tf.Qwen3NextConfig(hidden_size=256, linear_num_key_heads=shape["nk"], linear_num_value_heads=shape["nv"],
                                linear_key_head_dim=shape["dk"], linear_value_head_dim=shape["dv"], num_hidden_layers=1,
                                layer_types=["linear_attention"])
    net = _DeltaNet.of(Qwen3NextGatedDeltaNet(config, 0).eval())
    runner = PagedQwen3NextRunner.__new__(PagedQwen3NextRunner)  # only its two rules are timed: no model needed
    runner._prefilling = True
    return runner, net, lambda length, rows=1: _States(net, rows, length, torch.float32, "cpu")


def _compare(ours, reference, reps: int) -> tuple:
    """(ms of ours, ms of the reference: medians of reps after a warm-up), max |ours - reference|."""
    timings = []
    with torch.no_grad():
        for fn in (ours, reference):
            fn()  # warm-up
            times = []
            for _ in range(reps):
                begin = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - begin))
            timings.append(statistics.median(times))
        return timings, float((ours() - reference()).abs().max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cpu", action="store_true", help="the widths above on this CPU")
    mode.add_argument("--smoke", action="store_true", help="tiny widths; needs --out")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="JSON path (default bench/results/delta_rule_cpu.json)")
    args = parser.parse_args(argv)
    if args.smoke and not args.out:
        sys.exit("--smoke needs --out (a smoke run is not a measurement for bench/results)")
    shape = SMOKE if args.smoke else CPU
    torch.set_num_threads(args.threads)
    out = Path(args.out or ROOT / "bench/results/delta_rule_cpu.json")
    runner, net, states = _layer(shape)
    rows, gen = [], torch.Generator().manual_seed(1)
    for length in shape["lengths"]:
        by_row = torch.randn(1, length, net.channels, generator=gen)
        beta = torch.rand(1, length, net.nv, generator=gen)
        g = -torch.rand(1, length, net.nv, generator=gen)
        real = torch.ones(1, length, dtype=torch.bool)
        slot = torch.arange(length)[None]
        start = torch.full((1,), -1)

        def chunked():
            return runner._prefill_chunks(net, states(1), by_row, beta, g)

        def steps():
            return runner._steps(net, states(length), by_row, beta, g, real, slot, start)

        timings, diff = _compare(chunked, steps, shape["reps"])
        row = {"call": "prefill", "B": 1, "tokens": length, "chunked_ms": timings[0], "steps_ms": timings[1],
               "chunked_vs_steps": timings[0] / timings[1], "max_abs_diff": diff}
        rows.append(row)
        print(json.dumps(row), flush=True)
    runner._prefilling = False
    n = shape["queries"]
    for batch in shape["batches"]:  # a score call of n tokens a row from a nonzero state
        by_row = torch.randn(batch, n, net.channels, generator=gen)
        beta = torch.rand(batch, n, net.nv, generator=gen)
        g = -torch.rand(batch, n, net.nv, generator=gen)
        real = torch.ones(batch, n, dtype=torch.bool)
        slot = torch.arange(n).expand(batch, -1)
        start = torch.full((batch,), -1)
        st = states(n, batch)
        st.rec.normal_(generator=gen)
        st.conv.normal_(generator=gen)

        def block():
            return runner._score_block(net, st, by_row, beta, g, real, slot, start)

        def steps():
            return runner._steps(net, st, by_row, beta, g, real, slot, start)

        timings, diff = _compare(block, steps, shape["reps"])
        row = {"call": "score", "B": batch, "tokens": n, "block_ms": timings[0], "steps_ms": timings[1],
               "block_vs_steps": timings[0] / timings[1], "max_abs_diff": diff}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": "cpu (smoke)" if args.smoke else "cpu", "threads": args.threads, **versions(),
                               "widths": {k: shape[k] for k in ("nk", "nv", "dk", "dv")}, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
