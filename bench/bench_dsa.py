"""DeepSeek Sparse Attention's step on the paged MLA runner (runners/sparse_mla.py: the indexer's choice of
index_topk keys, then the absorbed attention over the chosen latents, torch ops) against the dense MLA
attention over every key of the same rows, for one layer.

    python bench/bench_dsa.py --gpu [--budget-s S] [--out bench/results/dsa_<device>.json]
        DeepSeek-V3.2's widths (128 heads, a latent of 512 + 64; an indexer of 64 heads of 128, index_topk
        2048), bf16, B 1 / 8 rows of 4k / 16k tokens, N 1 (decode) and 4 (a verify of K = 3): CUDA-graph
        replay us of choose + chosen_attention, of choose alone, and of the MLA Triton kernel over all L
        entries (what the dense path runs); the bytes the sparse step must read (each row's indexer keys
        over its block table, B x S x 128 x 2, and the chosen entries, B x N x 2048 x 576 x 2) as GB/s and
        their share of the HBM ceiling. Predicted before any run: the torch ops write and read the float32
        index scores [B, N, 64, S] (64x the keys' bytes), so the sparse step is bound by them, several
        times the dense kernel at 4k and nearer it at 16k, where the dense kernel reads 8x the chosen latents.
    python bench/bench_dsa.py --cpu [--out ...]
        16 heads, an indexer of 8 heads, B 1 / 4, L 4096 / 8192, fp32, median of 5 calls (this machine's
        numbers: not a GPU's); the dense path the C++ attention.
    python bench/bench_dsa.py --smoke --out F
        Tiny shapes on the CPU with index_topk >= L (every key chosen): the sparse output equals the dense
        attention's (max_abs_diff), so the device run is not broken on arrival.
"""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import check_mode, mode_parser, results_path  # noqa: E402
from machine import versions  # noqa: E402

GPU = dict(heads=128, rank=512, rope=64, index_heads=64, index_dim=128, topk=2048, batches=(1, 8),
           lengths=(4096, 16384), queries=(1, 4), block_size=16, hidden=7168, q_rank=1536)
CPU = dict(heads=16, rank=512, rope=64, index_heads=8, index_dim=128, topk=2048, batches=(1, 4),
           lengths=(4096, 8192), queries=(1, 4), block_size=16, hidden=1024, q_rank=256)
SMOKE = dict(heads=4, rank=32, rope=8, index_heads=4, index_dim=16, topk=64, batches=(1, 2), lengths=(40,),
             queries=(1, 3), block_size=4, hidden=48, q_rank=24)


def _inputs(s: dict, batch: int, length: int, n: int, dtype, device, gen) -> dict:
    """One layer's call: the latent and indexer-key planes of B rows of L tokens (blocks shuffled), the
    block table, the call's n tokens a row (their hidden states, q_resid, rotation, absorbed queries)."""
    from specdec_fast.runners.sparse_mla import Indexer

    def rand(*shape, scale=0.5):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    bs, width = s["block_size"], s["rank"] + s["rope"]
    per_row = -(-length // bs)
    table = torch.randperm(batch * per_row, generator=gen).view(batch, per_row).to(torch.int32).to(device)
    total = batch * n
    ix = Indexer(rand(s["index_heads"] * s["index_dim"], s["q_rank"], scale=s["q_rank"] ** -0.5),
                 rand(s["index_dim"], s["hidden"], scale=s["hidden"] ** -0.5),
                 (torch.ones(s["index_dim"], dtype=dtype, device=device),
                  torch.zeros(s["index_dim"], dtype=dtype, device=device), 1e-6),
                 rand(s["index_heads"], s["hidden"], scale=s["hidden"] ** -0.5), s["index_heads"])
    angles = torch.arange(total, dtype=torch.float32)[:, None] * torch.rand(s["rope"] // 2, generator=gen)
    rotation = tuple(torch.cat((f, f), -1).to(dtype).to(device) for f in (angles.cos(), angles.sin()))
    cu = (torch.arange(batch + 1, dtype=torch.int32) * n).to(device)
    positions = (torch.arange(n).repeat(batch) + length - n).to(device)
    return dict(ix=ix, latent=rand(batch * per_row, bs, 1, width), keys=rand(batch * per_row, bs, 1, s["index_dim"]),
                table=table, h=rand(total, s["hidden"]), q_resid=rand(total, s["q_rank"]), rotation=rotation,
                q=rand(total, s["heads"], width), cu=cu, positions=positions,
                seq_lens=torch.full((batch,), length, dtype=torch.int32, device=device))


def _row_index(cu: torch.Tensor, total: int, n: int) -> tuple:
    """PagedRunnerBase._row_index for a call of n tokens in every row."""
    count = cu[1:] - cu[:-1]
    step = torch.arange(n, device=cu.device)
    real = step[None, :] >= (n - count)[:, None]
    return torch.where(real, cu[:-1, None].long() + step[None, :] - (n - count)[:, None], total), real


def main(argv=None) -> int:
    args = mode_parser(__doc__, "dsa", gpu="DeepSeek-V3.2's widths on the GPU", cpu="smaller widths on this CPU",
                       smoke="tiny shapes on the CPU, every key chosen; needs --out").parse_args(argv)
    check_mode(args)
    from gpu_timing import RowBudget

    from specdec_fast.kernels.attention import mla_attention
    from specdec_fast.kernels.llama_ops.reference import rotate_half_apply
    from specdec_fast.runners.sparse_mla import choose, chosen_attention, row_slots

    if args.gpu:
        from gpu_timing import graph_timer, hbm_ceiling_bandwidth
        from specdec_fast.kernels.attention.triton_mla import mla_attention_triton

        s, device, dtype, name, timed = GPU, "cuda", torch.bfloat16, torch.cuda.get_device_name(), graph_timer
        ceiling = hbm_ceiling_bandwidth(torch.device(device))
    else:
        s, device, dtype, ceiling = (CPU, "cpu", torch.float32, None) if args.cpu else (SMOKE, "cpu", torch.float32, None)
        name = "cpu" if args.cpu else "cpu (smoke)"

        def timed(fn, reps=1 if args.smoke else 5):
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                fn()
                times.append(1e6 * (time.perf_counter() - start))
            return statistics.median(times)
    out = results_path(args.out, "dsa", name)
    out.parent.mkdir(parents=True, exist_ok=True)
    rank, width, scale = s["rank"], s["rank"] + s["rope"], (128 + s["rope"]) ** -0.5
    rows, budget, gen = [], RowBudget(args.budget_s), torch.Generator().manual_seed(0)
    for batch in s["batches"]:
        for length in s["lengths"]:
            for n in s["queries"]:
                if not budget.allows(f"B={batch} L={length} N={n}"):
                    continue
                x = _inputs(s, batch, length, n, dtype, device, gen)
                rows_of = _row_index(x["cu"], batch * n, n)
                slots = row_slots(x["table"], s["block_size"])

                def pick():
                    return choose(x["ix"], x["h"], x["q_resid"], x["rotation"], rotate_half_apply, x["keys"], slots,
                                  rows_of, x["positions"], s["topk"])

                def sparse():
                    return chosen_attention(x["q"], x["latent"], slots, rows_of, pick(), scale, rank)

                def dense():
                    if args.gpu:
                        return mla_attention_triton(x["q"], x["latent"], x["table"], x["seq_lens"], x["cu"], rank=rank,
                                                    max_query_len=n, scale=scale)
                    return mla_attention(x["q"], x["latent"], x["table"], x["seq_lens"], x["cu"], rank=rank,
                                         max_query_len=n, scale=scale, backend="cpp" if args.cpu else "torch",
                                         check=False)

                k = min(s["topk"], slots.shape[1])
                read = batch * slots.shape[1] * s["index_dim"] * x["keys"].element_size() + \
                    batch * n * k * width * x["latent"].element_size()
                row = {"B": batch, "L": length, "N": n, "topk": s["topk"], "sparse_us": timed(sparse),
                       "choose_us": timed(pick), "dense_us": timed(dense), "sparse_read_MB": read / 1e6}
                row["sparse_GBps"] = read / row["sparse_us"] / 1e3
                if ceiling is not None:
                    row["sparse_of_hbm_ceiling"] = row["sparse_GBps"] * 1e9 / ceiling["ceiling_Bps"]
                if s["topk"] >= length:  # every key chosen: the two paths compute the same attention
                    row["max_abs_diff"] = float((sparse().float() - dense().float()).abs().max())
                rows.append(row)
                print(json.dumps(row), flush=True)
                out.write_text(json.dumps({"device": name, **versions(), "shape": {k: v for k, v in s.items()},
                                           "hbm_ceiling": ceiling, "rows": rows, "not_run": budget.not_run},
                                          indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
