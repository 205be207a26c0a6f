"""A Mamba2 layer (runners/mamba2.py: Nemotron-H's, Granite 4.0-H's, Falcon-H1's) the ways the paged runners run
it, over the same inputs, with the outputs' largest difference:
  - a prefill (the scan in chunks of PREFILL_CHUNK from a zero state) against transformers' own mixer forward
    (NemotronHMamba2Mixer on its torch path: mamba2_chunk_scan);
  - a score call of N tokens from each row's state at once (one block of the scan, every snapshot written) against
    the same N tokens one call each (N blocks of one token, each from the last one's snapshot).

    python bench/bench_mamba2.py --cpu [--threads N] [--out bench/results/mamba2_cpu.json]
        Nemotron-H 8B's Mamba2 widths cut to 32 heads (heads of 64, 8 groups of state 128, kernel 4; hidden 1024),
        float32: prefills of one row of 256 / 1024 tokens; score calls of N = 5 (a verify of K = 4) at B 1 / 8.
        ms of each way (median of 3 after a warm-up).
        Predicted: the prefill within 2x of transformers' (the same chunked algebra; ours gathers rows and casts
        more); the score block ahead of 5 single-token calls by the launches it saves (~20 ops a call),
        less at B = 8 where the arithmetic grows. Measured (this 2-core EPYC, 1 thread, mamba2_cpu.json): prefill
        1.04x / 0.96x transformers' time at 256 / 1024 tokens; the score block 0.40x the five calls' time at B = 1,
        0.78x at B = 8; outputs within 2.2e-6.
    python bench/bench_mamba2.py --gpu [--budget-s S] [--out bench/results/mamba2_<device>.json]
        Nemotron-H 8B's widths (128 heads of 64, 8 groups of state 128; hidden 4096), bf16: prefills of 1k / 4k
        tokens (synchronised ms) and score calls of 5 tokens at B 1 / 8 / 32 (CUDA-graph replay us), the score rows also
        the Triton path's two launches (kernels/causal_conv, kernels/recurrent: q = C, k = B over the [P, N] state),
        the prefill rows the Triton path's (fused_*: kernels/chunk_scan carries the state over the chunks in one launch,
        where the torch loop takes ~8 a chunk of 64; tf32 products for this bf16 layer). Never run yet. Predicted for
        the fused prefill: <= 0.5x ours at 4k tokens (64 chunks' ~500 launches gone; the chunks' batched terms stay).
        Predicted for the fused score call: <= 0.5x the block at B = 1 (launch-bound), <= 0.7x at B = 32 (the
        snapshots from registers, no [B, n, H, P, N] temporary).
    python bench/bench_mamba2.py --smoke --out F
        Tiny widths: not a measurement, a check that the script runs and the ways agree (the fused way interpreted,
        where TRITON_INTERPRET=1).
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import check_mode, mode_device, mode_parser, results_path, triton_runs  # noqa: E402
from machine import versions  # noqa: E402

CPU = dict(hidden=1024, heads=32, head_dim=64, groups=8, state=128, lengths=(256, 1024), batches=(1, 8), queries=5,
           reps=3, dtype=torch.float32)
GPU = dict(hidden=4096, heads=128, head_dim=64, groups=8, state=128, lengths=(1024, 4096), batches=(1, 8, 32), queries=5,
           reps=3, dtype=torch.bfloat16)
SMOKE = dict(hidden=32, heads=4, head_dim=8, groups=2, state=8, lengths=(5, 40), batches=(1, 3), queries=3, reps=1,
             dtype=torch.float32)


def _mixer(shape: dict, device):
    """transformers' NemotronHMamba2Mixer of these widths (random weights, dt_bias / A_log / D drawn) and the runners'
    Mamba2 view of it."""
    import transformers as tf
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    from specdec_fast.runners.mamba2 import Mamba2

    torch.manual_seed(0)
    config = tf.NemotronHConfig(hidden_size=shape["hidden"], layers_block_type=["linear_attention"],
                                mamba_num_heads=shape["heads"], mamba_head_dim=shape["head_dim"], n_groups=shape["groups"],
                                ssm_state_size=shape["state"], conv_kernel=4, initializer_range=0.05)
    mixer = NemotronHMamba2Mixer(config, layer_idx=0).eval()
    with torch.no_grad():
        mixer.dt_bias.normal_(0, 0.5)
        mixer.A_log.normal_(0, 0.5)
        mixer.D.normal_(1, 0.3)
    mixer = mixer.to(device=device, dtype=shape["dtype"])
    return mixer, Mamba2(mixer)


def main(argv=None) -> int:
    parser = mode_parser(__doc__, "mamba2", cpu="the widths above on this CPU", gpu="Nemotron-H 8B's widths on the GPU",
                         smoke="tiny widths; needs --out")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    check_mode(args)
    from gpu_timing import RowBudget, median_ms

    from specdec_fast.runners.mamba2 import mamba2_forward
    from specdec_fast.runners.paged_recurrent import RecurrentStates, RowLayout

    shape = SMOKE if args.smoke else GPU if args.gpu else CPU
    device, name, sync = mode_device(args)
    torch.set_num_threads(args.threads)
    out = results_path(args.out, "mamba2", name)
    mixer, net = _mixer(shape, device)
    rows, gen, budget = [], torch.Generator().manual_seed(1), RowBudget(args.budget_s)

    def states(batch: int, tentative: int):
        return RecurrentStates(*net.shapes, batch, tentative, shape["dtype"], device)

    def layout(batch: int, n: int, start: int):
        """rows as PagedRecurrentRunner._row_layout gives them: every token real, snapshots 0..n-1 after ``start``."""
        index = torch.arange(batch * n, device=device).view(batch, n)
        real = torch.ones(batch, n, dtype=torch.bool, device=device)
        slot = (torch.arange(n, device=device) + start + 1).expand(batch, -1).contiguous()
        return RowLayout(index, real, slot, torch.full((batch,), start, device=device))

    def write():  # after every row: a later row's failure keeps these
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"device": "cpu (smoke)" if args.smoke else name, "threads": args.threads,
                                   **versions(), "widths": {k: v for k, v in shape.items() if k != "dtype"},
                                   "dtype": str(shape["dtype"]), "rows": rows, "not_run": budget.not_run}, indent=2) + "\n")

    with torch.no_grad():
        for length in shape["lengths"]:
            if not budget.allows(f"prefill {length}"):
                continue
            h = (torch.randn(length, shape["hidden"], generator=gen) * 0.5).to(device=device, dtype=shape["dtype"])

            def ours():
                return mamba2_forward(net, states(1, 1), h, layout(1, length, -1), prefilling=True)

            def theirs():
                return mixer(h[None])[0]

            ours_ms, theirs_ms = median_ms(ours, shape["reps"], sync, False), median_ms(theirs, shape["reps"], sync, False)
            row = {"call": "prefill", "B": 1, "tokens": length, "ours_ms": ours_ms, "transformers_ms": theirs_ms,
                   "ours_vs_transformers": ours_ms / theirs_ms,
                   "max_abs_diff": float((ours().float() - theirs().float()).abs().max())}
            if args.gpu or (args.smoke and triton_runs(device)):  # the Triton path: the carry in one launch

                def fused():
                    st = RecurrentStates(*net.shapes, 1, 1, shape["dtype"], device, fused=True)
                    return mamba2_forward(net, st, h, layout(1, length, -1), prefilling=True)

                fused_ms = median_ms(fused, shape["reps"], sync, False)
                row.update(fused_ms=fused_ms, fused_vs_ours=fused_ms / ours_ms,
                           fused_max_abs_diff=float((fused().float() - ours().float()).abs().max()))
            rows.append(row)
            print(json.dumps(row), flush=True)
            write()
        n = shape["queries"]
        for batch in shape["batches"]:  # a score call of n tokens a row from a nonzero state
            if not budget.allows(f"score B={batch}"):
                continue
            h = (torch.randn(batch * n, shape["hidden"], generator=gen) * 0.5).to(device=device, dtype=shape["dtype"])
            st = states(batch, n)
            st.rec.copy_(torch.randn(st.rec.shape, generator=gen) * 0.1)
            st.conv.copy_(torch.randn(st.conv.shape, generator=gen))
            rows_block = layout(batch, n, -1)
            singles = [(h.view(batch, n, -1)[:, t].contiguous(), layout(batch, 1, t - 1)) for t in range(n)]

            def block():
                return mamba2_forward(net, st, h, rows_block, prefilling=False).view(batch, n, -1)

            def one_at_a_time():
                return torch.stack([mamba2_forward(net, st, x, r, prefilling=False) for x, r in singles], dim=1)

            block_ms = median_ms(block, shape["reps"], sync, args.gpu)
            steps_ms = median_ms(one_at_a_time, shape["reps"], sync, args.gpu)
            row = {"call": "score", "B": batch, "tokens": n, "block_ms": block_ms, "one_token_calls_ms": steps_ms,
                   "block_vs_calls": block_ms / steps_ms,
                   "max_abs_diff": float((block().float() - one_at_a_time().float()).abs().max())}
            if args.gpu or (args.smoke and triton_runs(device)):  # the Triton path's one launch (interpreted in --smoke)
                fused_st = RecurrentStates(*net.shapes, batch, n, shape["dtype"], device, fused=True)
                fused_st.rec.copy_(st.rec)
                fused_st.conv.copy_(st.conv)

                def fused():
                    return mamba2_forward(net, fused_st, h, rows_block, prefilling=False).view(batch, n, -1)

                fused_ms = median_ms(fused, shape["reps"], sync, args.gpu)
                row.update(fused_ms=fused_ms, fused_vs_block=fused_ms / block_ms,
                           fused_max_abs_diff=float((fused().float() - block().float()).abs().max()))
            rows.append(row)
            print(json.dumps(row), flush=True)
            write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
