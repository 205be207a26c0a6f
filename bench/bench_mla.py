"""Multi-head latent attention on a GPU: the MLA Triton kernel (kernels/attention/triton_mla.py) against
SDPA over the same latents laid out densely, and the bytes it reads against the HBM ceiling.

    python bench/bench_mla.py --gpu [--budget-s S] [--out bench/results/mla_<device>.json]
        DeepSeek-V3's attention (128 heads, a latent of 512 + 64) and GLM-4.7-Flash's (20 heads), bf16,
        B 1 / 8 / 32 rows of 1k / 4k / 16k entries, N 1 (decode) and 4 (a verify of K = 3): CUDA-graph
        replay us of mla_attention_triton with its automatic split count, for each tile of
        triton_mla.TILES (rows, entries a chunk, warps; the row's us is plan_mla's default tile's), the GB/s of the latents it must read
        (B x L x 576 x 2 bytes) and their share of the measured HBM ceiling, and SDPA's us on the dense
        latents (q [B, H, N, 576] over one key head [B, 1, L, 576], the value its first 512 dims:
        enable_gqa) with the max abs difference between the two outputs.
        Predicted before any run (a first tile: 16 (query, head) rows, chunks of 16 entries, 195
        registers, 2 blocks an SM): 128 heads read each chunk 8 times, from L2 after the first, so
        decode at B = 1 is bound by L2 and split count, not HBM -- expect well under half the HBM
        ceiling at 1k, rising with L; 20 heads (2 tiles) nearer the ceiling.
    python bench/bench_mla.py --smoke --out F
        The same code on the CPU (tiny shapes, the kernel interpreted when TRITON_INTERPRET=1, else
        the torch backend; one timing per row): not a measurement, a check that the device run is not
        broken on arrival.
"""
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import check_mode, mode_parser, results_path  # noqa: E402
from machine import versions  # noqa: E402

GPU = dict(models={"deepseek_v3": 128, "glm4_moe_lite": 20}, rank=512, rope=64, batches=(1, 8, 32),
           lengths=(1024, 4096, 16384), queries=(1, 4), block_size=16)
SMOKE = dict(models={"tiny": 4}, rank=32, rope=8, batches=(1, 2), lengths=(40,), queries=(1, 3), block_size=4,
             tiles=((16, 32, 4), (32, 32, 8)))


def _inputs(heads, rank, rope, batch, length, n, block_size, dtype, device, gen):
    """q [B n, H, R + DR], the latent plane [blocks, page, 1, R + DR] (rows' blocks shuffled), the
    block table, seq_lens (L each, the n new entries included), cu_query_lens."""
    width = rank + rope
    per_row = -(-length // block_size)
    blocks = torch.randperm(batch * per_row, generator=gen)
    latent = (torch.randn(batch * per_row, block_size, 1, width, generator=gen) * 0.5).to(dtype).to(device)
    table = blocks.view(batch, per_row).to(torch.int32).to(device)
    q = (torch.randn(batch * n, heads, width, generator=gen) * 0.5).to(dtype).to(device)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device=device)
    cu = (torch.arange(batch + 1, dtype=torch.int32) * n).to(device)
    return q, latent, table, seq_lens, cu


def _dense(latent, table, batch, length):
    """[B, 1, L, R + DR]: each row's entries in order."""
    return latent[table.long()].flatten(1, 2)[:, :length].transpose(1, 2)


def _sdpa(q, dense, batch, n, rank, scale):
    """SDPA over the dense latents, causal among each row's n new entries -> [B n, H, R]."""
    heads, length = q.shape[1], dense.shape[2]
    qb = q.view(batch, n, heads, -1).transpose(1, 2)  # [B, H, n, R + DR]
    mask = torch.arange(length, device=q.device)[None, :] <= (length - n + torch.arange(n, device=q.device))[:, None]
    out = F.scaled_dot_product_attention(qb, dense, dense[..., :rank], attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(batch * n, heads, rank)


def main(argv=None) -> int:
    args = mode_parser(__doc__, "mla", gpu="the shapes above on the GPU",
                       smoke="tiny shapes on the CPU; needs --out").parse_args(argv)
    check_mode(args)
    from gpu_timing import RowBudget

    from specdec_fast.kernels._backend import triton_interpreting
    from specdec_fast.kernels.attention import mla_attention
    from specdec_fast.kernels.attention.triton_mla import TILES, mla_attention_triton, plan_mla

    if args.smoke:
        shape, device, dtype, name = SMOKE, "cpu", torch.float32, "cpu (smoke)"
        backend = "triton" if triton_interpreting() else "torch"

        def timed(fn):
            start = time.perf_counter()
            fn()
            return 1e6 * (time.perf_counter() - start)
        ceiling = None
    else:
        from gpu_timing import graph_timer, hbm_ceiling_bandwidth

        shape, device, dtype, name, backend = GPU, "cuda", torch.bfloat16, torch.cuda.get_device_name(), "triton"
        timed = graph_timer
        ceiling = hbm_ceiling_bandwidth(torch.device(device))
    out = results_path(args.out, "mla", name)
    out.parent.mkdir(parents=True, exist_ok=True)
    rank, rope = shape["rank"], shape["rope"]
    scale = (128 + rope) ** -0.5
    rows, budget, gen = [], RowBudget(args.budget_s), torch.Generator().manual_seed(0)
    for model, heads in shape["models"].items():
        for batch in shape["batches"]:
            for length in shape["lengths"]:
                for n in shape["queries"]:
                    if not budget.allows(f"{model} B={batch} L={length} N={n}"):
                        continue
                    q, latent, table, seq_lens, cu = _inputs(heads, rank, rope, batch, length, n, shape["block_size"],
                                                             dtype, device, gen)

                    def ours(tile=None):
                        if backend != "triton":
                            return mla_attention(q, latent, table, seq_lens, cu, rank=rank, max_query_len=n,
                                                 scale=scale, backend=backend, check=False)
                        return mla_attention_triton(q, latent, table, seq_lens, cu, rank=rank, max_query_len=n,
                                                    scale=scale, tile=tile)

                    dense = _dense(latent, table, batch, length)
                    try:  # SDPA over a 576-dim head may take its math path, which expands the key head: it may not fit
                        reference = _sdpa(q, dense, batch, n, rank, scale).float()
                        sdpa_us = timed(lambda: _sdpa(q, dense, batch, n, rank, scale))
                    except torch.OutOfMemoryError:
                        reference = sdpa_us = None
                        torch.cuda.empty_cache()
                    row = {"model": model, "heads": heads, "B": batch, "L": length, "N": n, "backend": backend,
                           "sdpa_dense_us": sdpa_us, "tiles": {}}
                    latent_bytes = batch * length * (rank + rope) * latent.element_size()
                    for tile in (shape.get("tiles", TILES) if backend == "triton" else (None,)):
                        us = timed(lambda: ours(tile))
                        diff = None if reference is None else float((ours(tile).float() - reference).abs().max())
                        entry = {"us": us, "max_abs_diff": diff, "latent_GBps": latent_bytes / us / 1e3}
                        if ceiling is not None:
                            entry["of_hbm_ceiling"] = entry["latent_GBps"] * 1e9 / ceiling["ceiling_Bps"]
                        row["tiles"]["default" if tile is None else "x".join(map(str, tile))] = entry
                    first = next(iter(row["tiles"].values()))  # the default plan's tile, where the sweep timed it
                    if backend == "triton":
                        plan = plan_mla(q.device, batch, heads, rank, n, table.shape[1] * shape["block_size"],
                                        dtype=dtype)
                        row["default_tile"] = f"{plan.block_m}x{plan.block_n}x{plan.num_warps}"
                        first = row["tiles"].get(row["default_tile"], first)
                    diffs = [t["max_abs_diff"] for t in row["tiles"].values() if t["max_abs_diff"] is not None]
                    row.update(us=first["us"], max_abs_diff=max(diffs) if diffs else None, latent_GBps=first["latent_GBps"])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    out.write_text(json.dumps({"device": name, **versions(), "rank": rank, "rope": rope,
                                               "hbm_ceiling": ceiling, "rows": rows, "not_run": budget.not_run},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
