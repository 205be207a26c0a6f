"""Triton attention over a latent paged cache: multi-head latent attention (MLA, DeepSeek-V3) with
the query and output projections absorbed (runners/paged_mla.py).

Each cached entry is [c, k_rot]: the latent c [R] (kv_lora_rank) and the rotated key k_rot [DR]
(qk_rope_head_dim), one for every query head (Hkv = 1). Query head h's absorbed query is
[q_lat_h, q_rot_h] [R + DR]; it scores an entry by q_lat_h . c + q_rot_h . k_rot, and its output is
sum_j p_j c_j [R] (the value is the entry's first R dims). What kernels/attention/triton.py would
do with D = R + DR (576 for DeepSeek-V3) it cannot: its tile holds every head of a KV group (128
here) and pads D to 1024. Here:

Kernel (_mla_attn_split): one program per (row b, tile of QUERIES x BLOCK_H (query, head) rows,
KV split). Its rows share each entry it loads: an entry chunk [BLOCK_N, R] is loaded once and is
both the keys (transposed) and the values of the step, with k_rot [BLOCK_N, DR] beside it. The
accumulator is [BLOCK_M, R] float32 (BLOCK_M = 16 rows by default: 32 KB at R = 512, 64 registers
a thread over 4 warps; TILES lists the wider tiles that compile without spills). Heads beyond BLOCK_H take more tiles, each reading the same entries (from L2 after
the first). Causal among a row's new tokens, or a token tree's bits; no window, soft-capping or
sinks (no MLA model has them). The KV sequence splits over programs as in triton.py
(choose_splits), merged by its _merge_splits with HEAD_DIM = R. No host sync: graph safe.

Timed on an H200 (2026-11-30, bench/results/h200_2026-11-30/mla_nvidia_h200.json; DeepSeek-V3's 128
heads, bf16, graph replays): the wide tile, 32 rows over chunks of 32 entries and 8 warps (WIDE_TILE), took
63.2 / 71.6 / 243.1 us where 16 rows over 16 entries and 4 warps took 91.2 / 100.9 / 329.5 (B = 1: L = 4096
N = 4, L = 16384 N = 1 and N = 4; B = 8 L = 1024: 34.2 against 42.6), and lost 1.4-2.0 us at B = 1 L = 1024
(N = 1 and 4) and L = 4096 N = 1 (31.5 / 32.1 / 33.4 against 29.5 / 30.4 / 32.0). plan_mla takes it for 16-bit
latents of 512 dims and at least 32 heads (a whole wide tile of heads; timed at 128 only, so Kimi Linear's 32 is an
extrapolation); fp32 at R = 512 spills 6 KB with it (ptxas), and 20 heads (GLM-4.7-Flash) were not timed.
FlashMLA's tile is 64 heads per warpgroup; 64 rows here spill.
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .triton import LOG2E, MERGE_SPLITS_P2, _merge_splits, _next_pow2, _num_sms, choose_splits

MAX_RANK = 512  # the latent widths the kernel takes (R padded to a power of 2): DeepSeek-V3 / GLM-4.7-Flash's 512
MAX_ROPE = 128  # and the rotated dims (their 64)
# Tile rows (query, head) by default: tl.dot's least M; the [16, R] float32 accumulator. The tiles that
# compile for sm_90a at R = 512 in bf16 without spills (ptxas -v): (rows, entries a chunk, warps) =
# (16, 16, 4): 195 registers, 38.9 KB shared; (32, 16, 8): 201, 61.4 KB; (32, 32, 8): 252, 86 KB. Rows of
# 64 spill (276 bytes at 8 warps), as do chunks of 32 at 16 rows over 4 warps (96). Wider tiles read each
# chunk for more heads (128 heads: 4 tiles instead of 8); which is faster waits for a GPU
# (bench/bench_mla.py sweeps TILES).
BLOCK_M = 16
TILES = ((16, 16, 4), (32, 16, 8), (32, 32, 8))
WIDE_TILE = (32, 32, 8)  # the default for 16-bit latents of 512 dims and >= 32 heads (the module's docstring)


@triton.jit(do_not_specialize=["num_splits", "min_split_chunks", "num_tokens"])
def _mla_attn_split(
    q_ptr, c_ptr, bt_ptr, seq_lens_ptr, cu_ptr, tree_ptr,
    out_ptr, part_o_ptr, part_lse_ptr,
    qk_scale, num_splits, min_split_chunks, num_tokens,
    s_qt, s_qh, s_cb, s_ct, s_bt,
    NUM_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_TILES: tl.constexpr,
    QUERIES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RANK: tl.constexpr,
    RANK_P2: tl.constexpr,
    ROPE: tl.constexpr,
    ROPE_P2: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_TREE: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    IEEE_DOT: tl.constexpr,
):
    b = tl.program_id(0)
    tile = tl.program_id(1)
    split = tl.program_id(2)
    q_tile, h_tile = tile // HEAD_TILES, tile % HEAD_TILES

    q_start = tl.load(cu_ptr + b)
    n_q = tl.load(cu_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    prefix = seq_len - n_q
    first_q = q_tile * QUERIES
    if first_q < n_q:
        r = tl.arange(0, BLOCK_M)  # row r -> (query qi, head)
        qi = first_q + r // BLOCK_H
        head = h_tile * BLOCK_H + r % BLOCK_H
        row_ok = (qi < n_q) & (head < NUM_HEADS) & (r < QUERIES * BLOCK_H)
        t = (q_start + qi).to(tl.int64)
        dc = tl.arange(0, RANK_P2)
        dr = tl.arange(0, ROPE_P2)
        c_ok = dc < RANK
        r_ok = dr < ROPE
        q_row = q_ptr + t[:, None] * s_qt + head[:, None] * s_qh
        q_lat = tl.load(q_row + dc[None, :], mask=row_ok[:, None] & c_ok[None, :], other=0.0)
        q_rot = tl.load(q_row + RANK + dr[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)
        q_lat = (q_lat.to(tl.float32) * qk_scale).to(q_ptr.dtype.element_ty)
        q_rot = (q_rot.to(tl.float32) * qk_scale).to(q_ptr.dtype.element_ty)

        last_q = tl.minimum(first_q + QUERIES, n_q) - 1
        kv_end = tl.minimum(seq_len, prefix + last_q + 1)
        if HAS_TREE:
            tree_bits = tl.load(tree_ptr + t, mask=row_ok, other=0)
        else:
            tree_bits = qi  # unread
        chunks_per_split = tl.maximum(tl.cdiv(tl.cdiv(kv_end, BLOCK_N), num_splits), min_split_chunks)
        lo = split * chunks_per_split * BLOCK_N
        hi = tl.minimum(lo + chunks_per_split * BLOCK_N, kv_end)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, RANK_P2], tl.float32)
        n_off = tl.arange(0, BLOCK_N)
        bt_row = bt_ptr + b.to(tl.int64) * s_bt
        for start in range(lo, hi, BLOCK_N):
            pos = start + n_off
            in_seq = pos < hi
            page = tl.load(bt_row + pos // PAGE_SIZE, mask=in_seq, other=0).to(tl.int64)
            entry = c_ptr + page * s_cb + (pos % PAGE_SIZE) * s_ct
            c = tl.load(entry[:, None] + dc[None, :], mask=in_seq[:, None] & c_ok[None, :], other=0.0)  # [N, R]
            k_rot = tl.load(entry[:, None] + RANK + dr[None, :], mask=in_seq[:, None] & r_ok[None, :], other=0.0)
            if IEEE_DOT:
                s = tl.dot(q_lat.to(tl.float32), tl.trans(c.to(tl.float32)), input_precision="ieee")
                s += tl.dot(q_rot.to(tl.float32), tl.trans(k_rot.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q_lat, tl.trans(c))
                s += tl.dot(q_rot, tl.trans(k_rot))
            j = pos - prefix  # index among the new tokens (< 0: prefix)
            visible = in_seq[None, :] & (j[None, :] <= qi[:, None])
            if HAS_TREE:
                jc = tl.minimum(tl.maximum(j, 0), 63).to(tl.int64)
                visible = visible & ((j[None, :] < 0) | (((tree_bits[:, None] >> jc[None, :]) & 1) != 0))
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_safe)
            p = tl.math.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE_DOT:
                acc = acc * alpha[:, None] + tl.dot(p, c.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
            m_i = m_new

        has_mass = l_i > 0.0
        o = acc / tl.where(has_mass, l_i, 1.0)[:, None]
        # out [T, NUM_HEADS, RANK]; part_o [splits, T, NUM_HEADS, RANK_P2], part_lse [splits, T, NUM_HEADS]
        if DIRECT_OUT:
            tl.store(out_ptr + (t[:, None] * NUM_HEADS + head[:, None]) * RANK + dc[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & c_ok[None, :])
        else:
            lse = tl.where(has_mass, m_i + tl.math.log2(tl.where(has_mass, l_i, 1.0)), float("-inf"))
            row = (split * num_tokens + t) * NUM_HEADS + head
            tl.store(part_o_ptr + row[:, None] * RANK_P2 + dc[None, :], o, mask=row_ok[:, None])
            tl.store(part_lse_ptr + row, lse, mask=row_ok)


class MlaPlan(NamedTuple):
    """The static launch shape of one mla_attention_triton call (plan_mla)."""

    block_m: int  # tile rows (query, head)
    block_h: int  # heads per tile
    head_tiles: int
    queries: int  # query positions per tile
    query_tiles: int
    block_n: int  # entries per inner step
    num_splits: int
    min_split_chunks: int
    num_warps: int


def plan_mla(device: torch.device, batch: int, num_heads: int, rank: int, max_query_len: int, capacity: int,
             num_splits: int | None = None, tile: tuple | None = None, dtype: torch.dtype | None = None) -> MlaPlan:
    """Tiling and split count from static shapes (a runner caches it per call shape): BLOCK_M = 16
    rows of (query, head) -- up to 16 heads of one query, or several queries of fewer heads -- and
    chunks of 32 entries (16 at R = 512: a [16, 512] bf16 chunk double-buffered, with k_rot, in 40 KB
    of shared memory), 4 warps; WIDE_TILE where the latents (``dtype``) are 16-bit, 512 wide, and the
    heads are at least 32 (an H200 timed it faster there). tile: (rows, entries a chunk, warps) instead
    (TILES: the benchmark's sweep); num_splits overrides the automatic flash-decoding split (tests)."""
    if tile is None and dtype in (torch.bfloat16, torch.float16) and _next_pow2(rank) >= 512 and num_heads >= 32:
        tile = WIDE_TILE
    elif tile is None:
        tile = (BLOCK_M, 16 if _next_pow2(rank) >= 512 else 32, 4)
    block_m, block_n, num_warps = tile
    block_h = min(block_m, _next_pow2(num_heads))
    queries = block_m // block_h
    head_tiles, query_tiles = -(-num_heads // block_h), -(-max_query_len // queries)
    if num_splits is None:
        num_splits, min_split = choose_splits(_num_sms(device), batch * head_tiles * query_tiles, capacity, block_n)
    else:
        min_split = block_n
    return MlaPlan(block_m, block_h, head_tiles, queries, query_tiles, block_n, max(1, num_splits), min_split // block_n,
                   num_warps)


def mla_attention_triton(q, latent_cache, block_table, seq_lens, cu_query_lens, *, rank: int, max_query_len: int,
                         tree_mask=None, scale: float, plan: MlaPlan | None = None, num_splits: int | None = None,
                         tile: tuple | None = None):
    """q [T, Hq, R + DR] (absorbed queries; stride(-1) 1), latent_cache [num_blocks, page, 1, R + DR]
    (one plane: [c, k_rot] per entry), block_table [B, max_blocks] int32, seq_lens [B] int32 (new
    entries included), cu_query_lens [B+1] int32, tree_mask [T] int64 or None -> out [T, Hq, R] in
    q's dtype: softmax(scale * q . entry) over each query's visible entries, times their first R dims
    (kernels/attention/__init__.py mla_attention: the checked entry point)."""
    T, Hq, width = q.shape
    rope = width - rank
    B, page_size = block_table.shape[0], latent_cache.shape[1]
    out = torch.empty((T, Hq, rank), dtype=q.dtype, device=q.device)
    if T == 0 or B == 0:
        return out
    if plan is None:
        plan = plan_mla(q.device, B, Hq, rank, max_query_len, block_table.shape[1] * page_size, num_splits, tile,
                        q.dtype)
    if block_table.stride(1) != 1 and block_table.shape[1] > 1:
        block_table = block_table.contiguous()
    splits, rank_p2 = plan.num_splits, max(16, _next_pow2(rank))
    direct = splits == 1
    if direct:
        part_o = part_lse = out
    else:
        part_o = torch.empty(splits, T, Hq, rank_p2, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(splits, T, Hq, dtype=torch.float32, device=q.device)
    _mla_attn_split[(B, plan.query_tiles * plan.head_tiles, splits)](
        q, latent_cache, block_table, seq_lens, cu_query_lens, seq_lens if tree_mask is None else tree_mask,
        out, part_o, part_lse,
        float(scale) * LOG2E, splits, plan.min_split_chunks, T,
        q.stride(0), q.stride(1), latent_cache.stride(0), latent_cache.stride(1), block_table.stride(0),
        NUM_HEADS=Hq, BLOCK_H=plan.block_h, HEAD_TILES=plan.head_tiles, QUERIES=plan.queries, BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n, RANK=rank, RANK_P2=rank_p2, ROPE=rope, ROPE_P2=max(16, _next_pow2(rope)),
        PAGE_SIZE=page_size, HAS_TREE=tree_mask is not None, DIRECT_OUT=direct,
        # fp32: exact dots; the interpreter's bf16 tl.dot is wrong (triton.py), so there bf16 runs in fp32
        IEEE_DOT=q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and q.device.type != "cuda"),
        num_warps=plan.num_warps, num_stages=2,
    )
    if not direct:
        _merge_splits[(T, Hq)](part_o, part_lse, out, splits, T, NUM_HEADS=Hq,
                               SPLITS_P2=max(MERGE_SPLITS_P2, _next_pow2(splits)), HEAD_DIM=rank, HEAD_DIM_P2=rank_p2,
                               num_warps=4)
    return out
