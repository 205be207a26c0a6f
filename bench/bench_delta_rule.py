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
    python bench/bench_delta_rule.py --gpu [--budget-s S] [--out bench/results/delta_rule_<device>.json]
        Qwen3-Next-80B's layer widths (16 key heads, 32 value heads of 128), one layer on the GPU: prefills of
        1k / 4k / 16k tokens (synchronised ms, median of 3) and score calls of 5 tokens at B 1 / 8 / 32 (CUDA-graph
        replay us of each way), with the outputs' largest difference; the score rows also time the Triton path's
        _score_fused (kernels/causal_conv's and kernels/recurrent's launches: the convolution, the rule and every
        snapshot in two, against the block's ~45 with its convolution's). Never run yet: whether the score block's fewer ops pay where
        launches cost, and the chunked prefill's time. Predicted for the fused way: <= 0.3x the block at B = 1
        (launch-bound: 2 launches against ~45), <= 0.7x at B = 32 (the snapshots written once from registers, where
        the block writes a [B, n, Hv, Dk, Dv] temporary and scatters it: ~2.6x fewer state bytes moved). The prefill
        rows also time the Triton path's (fused_*: kernels/chunk_scan's one launch carries the state over the chunks
        where the torch loop takes ~8 a chunk; "tf32x3" products for float32 states, fused_tf32_* "tf32" for a bf16
        model's). Predicted: fused <= 0.5x chunked at 4k and 16k tokens (~500 / ~2000 launches gone, the chunks'
        batched terms unchanged), fused_tf32 below fused (one product a dot, not three).
    python bench/bench_delta_rule.py --smoke --out F
        Tiny widths and lengths: not a measurement, a check that the script runs (the fused way too, interpreted,
        where TRITON_INTERPRET=1).
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import check_mode, mode_device, mode_parser, results_path, triton_runs  # noqa: E402
from machine import versions  # noqa: E402

CPU = dict(nk=4, nv=8, dk=128, dv=128, lengths=(64, 256, 1024), batches=(1, 8), queries=5, reps=3)
GPU = dict(nk=16, nv=32, dk=128, dv=128, lengths=(1024, 4096, 16384), batches=(1, 8, 32), queries=5, reps=3)
SMOKE = dict(nk=2, nv=4, dk=8, dv=12, lengths=(5, 70), batches=(1, 3), queries=3, reps=1)


def _layer(shape: dict, device="cpu"):
    """A Qwen3NextGatedDeltaNet module of these widths (random weights) and the runner half that runs it."""
    import transformers as tf
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    from specdec_fast.runners.paged_qwen3_next import PagedQwen3NextRunner, _DeltaNet
    from specdec_fast.runners.paged_recurrent import RecurrentStates

    torch.manual_seed(0)
    config = tf.Qwen3NextConfig(hidden_size=256, linear_num_key_heads=shape["nk"], linear_num_value_heads=shape["nv"],
                                linear_key_head_dim=shape["dk"], linear_value_head_dim=shape["dv"], num_hidden_layers=1,
                                layer_types=["linear_attention"])
    net = _DeltaNet.of(Qwen3NextGatedDeltaNet(config, 0).eval().to(device))
    runner = PagedQwen3NextRunner.__new__(PagedQwen3NextRunner)  # only its two rules are timed: no model needed
    runner._prefilling = True
    runner.device = torch.device(device)
    shapes = ((net.channels, net.kernel - 1), (net.nv, net.dk, net.dv))
    return runner, net, lambda length, rows=1, **kw: RecurrentStates(*shapes, rows, length, kw.get("dtype", torch.float32),
                                                                     device, fused=kw.get("fused", False))


def _compare(ours, reference, reps: int, sync=lambda: None, graphs: bool = False) -> tuple:
    """(ms of ours, ms of the reference: medians of reps after a warm-up, or with graphs CUDA-graph replay times),
    max |ours - reference|."""
    from gpu_timing import median_ms

    with torch.no_grad():
        timings = [median_ms(fn, reps, sync, graphs) for fn in (ours, reference)]
        return timings, float((ours() - reference()).abs().max())


def main(argv=None) -> int:
    parser = mode_parser(__doc__, "delta_rule", cpu="the widths above on this CPU",
                         gpu="Qwen3-Next-80B's widths on the GPU", smoke="tiny widths; needs --out")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    check_mode(args)
    from gpu_timing import RowBudget

    from specdec_fast.runners.paged_recurrent import RowLayout

    shape = SMOKE if args.smoke else GPU if args.gpu else CPU
    device, name, sync = mode_device(args)
    torch.set_num_threads(args.threads)
    out = results_path(args.out, "delta_rule", name)
    runner, net, states = _layer(shape, device)
    rows, gen, budget = [], torch.Generator().manual_seed(1), RowBudget(args.budget_s)

    def on(*tensors):
        return [t.to(device) for t in tensors]

    def write():  # after every row: a later row's failure keeps these
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"device": "cpu (smoke)" if args.smoke else name, "threads": args.threads,
                                   **versions(), "widths": {k: shape[k] for k in ("nk", "nv", "dk", "dv")},
                                   "rows": rows, "not_run": budget.not_run}, indent=2) + "\n")

    for length in shape["lengths"]:
        if not budget.allows(f"prefill {length}"):
            continue
        by_row, beta, g = on(torch.randn(1, length, net.channels, generator=gen), torch.rand(1, length, net.nv, generator=gen),
                             -torch.rand(1, length, net.nv, generator=gen))
        real, slot, start = on(torch.ones(1, length, dtype=torch.bool), torch.arange(length)[None], torch.full((1,), -1))

        def chunked():
            return runner._prefill_chunks(net, states(1), by_row, beta, g)

        def steps():
            return runner._steps(net, states(length), by_row, beta, g, RowLayout(None, real, slot, start))

        timings, diff = _compare(chunked, steps, shape["reps"], sync)
        row = {"call": "prefill", "B": 1, "tokens": length, "chunked_ms": timings[0], "steps_ms": timings[1],
               "chunked_vs_steps": timings[0] / timings[1], "max_abs_diff": diff}
        if args.gpu or (args.smoke and triton_runs(device)):  # the Triton path's carry (kernels/chunk_scan): one launch
            # float32 states: the kernel's "tf32x3" products; a bf16 model's states: "tf32" (RecurrentStates.chunk_scan)
            for key, dtype in (("fused", torch.float32), ("fused_tf32", torch.bfloat16)):

                def fused(dtype=dtype):
                    return runner._prefill_chunks(net, states(1, fused=True, dtype=dtype), by_row, beta, g)

                (fused_ms, _), fused_diff = _compare(fused, chunked, shape["reps"], sync)
                row.update({f"{key}_ms": fused_ms, f"{key}_vs_chunked": fused_ms / timings[0],
                            f"{key}_max_abs_diff": fused_diff})
        rows.append(row)
        print(json.dumps(row), flush=True)
        write()
    runner._prefilling = False
    n = shape["queries"]
    for batch in shape["batches"]:  # a score call of n tokens a row from a nonzero state
        if not budget.allows(f"score B={batch}"):
            continue
        by_row, beta, g = on(torch.randn(batch, n, net.channels, generator=gen), torch.rand(batch, n, net.nv, generator=gen),
                             -torch.rand(batch, n, net.nv, generator=gen))
        real, slot, start = on(torch.ones(batch, n, dtype=torch.bool), torch.arange(n).expand(batch, -1).contiguous(),
                               torch.full((batch,), -1))
        st = states(n, batch)
        st.rec.copy_(torch.randn(st.rec.shape, generator=gen))
        st.conv.copy_(torch.randn(st.conv.shape, generator=gen))

        def block():
            return runner._score_block(net, st, by_row, beta, g, RowLayout(None, real, slot, start))

        def steps():
            return runner._steps(net, st, by_row, beta, g, RowLayout(None, real, slot, start))

        timings, diff = _compare(block, steps, shape["reps"], sync, graphs=args.gpu)
        row = {"call": "score", "B": batch, "tokens": n, "block_ms": timings[0], "steps_ms": timings[1],
               "block_vs_steps": timings[0] / timings[1], "max_abs_diff": diff}
        if args.gpu or (args.smoke and triton_runs(device)):  # the Triton path's one launch (interpreted in --smoke)
            rows_ = RowLayout(None, real, slot, start)

            def fused():
                return runner._score_fused(net, st, by_row, beta, g, rows_)

            (fused_ms, _), fused_diff = _compare(fused, block, shape["reps"], sync, graphs=args.gpu)
            row.update(fused_ms=fused_ms, fused_vs_block=fused_ms / timings[0], fused_max_abs_diff=fused_diff)
        rows.append(row)
        print(json.dumps(row), flush=True)
        write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
