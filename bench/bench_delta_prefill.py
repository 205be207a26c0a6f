"""A Gated DeltaNet layer's prefill (runners/paged_qwen3_next.py) on the CPU: the chunked delta rule the
prefill runs against the token-by-token rule score calls run, over the same inputs, with the outputs'
largest difference.

    python bench/bench_delta_prefill.py --cpu [--threads N] [--out bench/results/delta_prefill_cpu.json]
        Qwen3-Next's layer widths cut to 8 value heads (4 key heads of 128, value heads of 128, a
        convolution of 4 over 3072 channels), float32, one row of 64 / 256 / 1024 tokens: ms of each way
        (median of 3 after a warm-up), and chunked / step.
        Predicted: the step loop costs ~15 small ops a token, the chunked one a few batched products and a
        64 x 64 triangular solve a chunk, so the chunked way wins by an order of magnitude from a few
        hundred tokens, less at 64 (one chunk, its solve for few tokens). Measured (this 2-core EPYC, 1
        thread, delta_prefill_cpu.json): 12-14x at every length, 64 included.
    python bench/bench_delta_prefill.py --smoke --out F
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
CPU = dict(nk=4, nv=8, dk=128, dv=128, lengths=(64, 256, 1024), reps=3)
SMOKE = dict(nk=2, nv=4, dk=8, dv=12, lengths=(5, 70), reps=1)


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
    return runner, net, lambda length: _States(net, 1, length, torch.float32, "cpu")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cpu", action="store_true", help="the widths above on this CPU")
    mode.add_argument("--smoke", action="store_true", help="tiny widths; needs --out")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="JSON path (default bench/results/delta_prefill_cpu.json)")
    args = parser.parse_args(argv)
    if args.smoke and not args.out:
        sys.exit("--smoke needs --out (a smoke run is not a measurement for bench/results)")
    shape = SMOKE if args.smoke else CPU
    torch.set_num_threads(args.threads)
    out = Path(args.out or ROOT / "bench/results/delta_prefill_cpu.json")
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

        with torch.no_grad():
            timings = {}
            for name, fn in (("chunked", chunked), ("steps", steps)):
                fn()  # warm-up
                times = []
                for _ in range(shape["reps"]):
                    begin = time.perf_counter()
                    fn()
                    times.append(1e3 * (time.perf_counter() - begin))
                timings[name] = statistics.median(times)
            diff = float((chunked() - steps()).abs().max())
        row = {"tokens": length, "chunked_ms": timings["chunked"], "steps_ms": timings["steps"],
               "chunked_vs_steps": timings["chunked"] / timings["steps"], "max_abs_diff": diff}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": "cpu (smoke)" if args.smoke else "cpu", "threads": args.threads, **versions(),
                               "widths": {k: shape[k] for k in ("nk", "nv", "dk", "dv")}, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
