"""Triton paged attention for N new queries per row (decode, a chain of K+1, or a token tree).

Kernel 1 (_paged_attn_split): one program per (row b, KV head, query tile, KV split). The rows
of its tile are (new query x query head of the GQA group), so each K/V page of that KV head is
loaded once per step for all N*G query rows: scoring K+1 positions reads what one decode step
reads. Chunks wholly inside the prefix run with no mask; only chunks that overlap the new tokens
apply the causal AND tree masks (BLOCK_MASK: no causal limit among a row's new tokens, DFlash's
draft block; causal launches keep their key: the constexpr is passed only when set). With a
sliding window (HAS_WINDOW) a tile's walk starts at the chunk of its first row's window and the
chunks below its last row's window start apply the window's mask too (_masked_chunks, the one
masked loop); chunked attention (Llama 4: CHUNKED with HAS_WINDOW, the chunk size in `window`)
is the same walk with each row's first key at its chunk's start, (prefix + i) // chunk * chunk
(a tree's node: prefix + its depth, its ancestors' bits below that chunk dropped);
soft-capping (HAS_SOFTCAP) caps every score; sinks (HAS_SINKS) enter split 0's softmax sum. The
KV sequence is split over programs (flash-decoding); each split writes its normalised partial
output and log-sum-exp, and kernel 2 (_merge_splits) combines them -- or, with MERGE_IN_KERNEL
(a plan's merge_in_kernel), the split of each (row, KV head, query tile) that takes the group's
last ticket combines them in the same launch (_combine_splits; tickets in a caller's
KernelWorkspace, put back to zero by their winner). With a single split kernel 1 writes the
output directly.

Grid sizes come only from static shapes (T, max_query_len, block_table width): seq_lens and
cu_query_lens are read inside the kernels, so there is no host sync and the call can be
captured in a CUDA graph.

Any head_dim up to 512: the head dimension is padded to HEAD_DIM_P2 = max(16, next power of 2)
with masked loads and stores (Llama-family models use 64/128, others 80/96/112, Gemma 3 256, Gemma 4's
full layers 512; tests use 12).

Launch shape (choose_splits): enough KV splits for ~4 programs per SM, each of at least
MIN_SPLIT_TOKENS tokens of the block table, whichever merge runs; a table of at most
MIN_SPLIT_TOKENS runs one split, the output written directly (one launch, no merge). Short
tables split too (H200, graph replays, B = 1 / 8 at 1k tokens: 4 splits and the merge launch
10.8 / 14.0 us against one split's 23.4 / 24.6; 8k and up unchanged: 57-88% of roofline at 32k
on an H100).

Compiled variants: a prompt of any length past 16 tokens takes the largest query tile, the ints
that follow lengths and capacity are not specialised, and the merge's split tile is at least 64
wide, so a new prompt length or an engine grown to longer rows compiles nothing new beyond the
first split variant (tests/kernels/test_compile_variants.py).

Stride arguments of _paged_attn_split (element strides; every last-dim stride is 1):
    s_qt, s_qh     q [T, Hq, D]: token and head strides (q may be a view into a fused qkv
                   product, whose token stride is (Hq + 2 Hkv) * D, not Hq * D)
    s_kb, s_kt, s_kh  k_cache AND v_cache [num_blocks, page, Hkv, D]: block, slot and head strides
                   (the two caches share one layout; the wrapper makes them agree)
    s_bt           block_table [B, max_blocks]: row stride (unit column stride)
The output [T, Hq, D] and the split partials (o [splits, T, Hq, D] float32, lse [splits, T, Hq]
float32) are allocated here, contiguous: their strides follow from T, Hq and HEAD_DIM_P2 and
are computed in the kernels (earlier versions passed 19 strides; each argument costs Python
launch time).
"""
from functools import lru_cache
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._backend import canonical_device, triton_interpreting
from .._launch import tile_of
from .._triton_compat import gdc_launch_dependents, gdc_wait, pdl_options
from .._triton_sync import last_program_of
from .._workspace import KernelWorkspace

LOG2E = 1.4426950408889634


@triton.jit
def _soft_cap(s, cap):
    """cap * tanh(s / cap), elementwise (Gemma 2's attention soft-capping, here in the kernel's
    log2 units: cap = softcap * log2(e)), from one exp2: tanh|x| = (1 - e) / (1 + e), e = 2^(-2|x| log2 e)."""
    x = s / cap
    e = tl.math.exp2(-2.0 * 1.4426950408889634 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t) * cap


@triton.jit
def _scores(q, kt, softcap_log2, HAS_SOFTCAP: tl.constexpr, IEEE_DOT: tl.constexpr):
    """q [M, D] . kt [D, N] in log2 units (q carries the scale), soft-capped where HAS_SOFTCAP."""
    if IEEE_DOT:
        s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    if HAS_SOFTCAP:
        s = _soft_cap(s, softcap_log2)
    return s


@triton.jit
def _accumulate(acc, alpha, p, v, IEEE_DOT: tl.constexpr):
    """The online softmax's output after one chunk: acc rescaled by alpha [M], plus p [M, N] . v [N, D]."""
    if IEEE_DOT:
        return acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)


@triton.jit
def _popcount64(bits):
    """The set bits of each int64 (bit 63 included), as int64: a SWAR count whose arithmetic shifts
    only ever bring a sign bit into lanes the masks clear."""
    x = bits - ((bits >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    x = x + (x >> 8)
    x = x + (x >> 16)
    x = x + (x >> 32)
    return x & 0x7F


@triton.jit
def _masked_chunks(q, m_i, l_i, acc, start_lo, start_hi, hi, prefix, qi, key_first, tree_bits, bt_row, k_head, v_head,
                   s_kb, s_kt, softcap_log2, d, d_ok, n_off,
                   BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_TREE: tl.constexpr, BLOCK_MASK: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, IEEE_DOT: tl.constexpr):
    """The online softmax over the chunks [start_lo, start_hi) of keys below ``hi``, with every
    mask: the causal (or block) mask among the new tokens, the tree's bits, and the window or
    the attention chunk (row r sees no key before key_first[r]) -> (m_i, l_i, acc)."""
    for start in range(start_lo, start_hi, BLOCK_N):
        pos = start + n_off
        in_seq = pos < hi
        page = tl.load(bt_row + pos // PAGE_SIZE, mask=in_seq, other=0).to(tl.int64)
        slot = pos % PAGE_SIZE
        kt = tl.load(k_head + page[None, :] * s_kb + slot[None, :] * s_kt + d[:, None],
                     mask=in_seq[None, :] & d_ok[:, None], other=0.0)
        s = _scores(q, kt, softcap_log2, HAS_SOFTCAP, IEEE_DOT)
        j = pos - prefix  # index among the new tokens (< 0: prefix)
        if BLOCK_MASK:
            visible = in_seq[None, :] & (qi[:, None] >= 0)
        else:
            visible = in_seq[None, :] & (j[None, :] <= qi[:, None])
        if HAS_TREE:
            jc = tl.minimum(tl.maximum(j, 0), 63).to(tl.int64)
            bit = (tree_bits[:, None] >> jc[None, :]) & 1
            visible = visible & ((j[None, :] < 0) | (bit != 0))
        if HAS_WINDOW:
            visible = visible & (pos[None, :] >= key_first[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + page[:, None] * s_kb + slot[:, None] * s_kt + d[None, :],
                    mask=in_seq[:, None] & d_ok[None, :], other=0.0)
        acc = _accumulate(acc, alpha, p, v, IEEE_DOT)
        m_i = m_new
    return m_i, l_i, acc


# Ints that follow lengths and the engine's row capacity are not specialised (1 / multiple of 16):
# each new class would compile a variant inside a user's call (tests/kernels/test_compile_variants.py).
@triton.jit(do_not_specialize=["num_splits", "min_split_chunks", "num_tokens", "window"])
def _paged_attn_split(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, cu_ptr, tree_ptr, sinks_ptr,
    out_ptr, part_o_ptr, part_lse_ptr, ticket_ptr,
    qk_scale, num_splits, min_split_chunks, num_tokens, window, softcap_log2,
    s_qt, s_qh,
    s_kb, s_kt, s_kh,
    s_bt,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    QUERIES_PER_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_TREE: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    BLOCK_MASK: tl.constexpr = False,
    HAS_WINDOW: tl.constexpr = False,
    HAS_SOFTCAP: tl.constexpr = False,
    HAS_SINKS: tl.constexpr = False,
    CHUNKED: tl.constexpr = False,
    MERGE_LAST: tl.constexpr = False,
    FENCE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    if PDL:  # a programmatic dependent launch: nothing the kernel before wrote is read before the wait
        gdc_wait()
        gdc_launch_dependents()
    pid_bh = tl.program_id(0)
    tile = tl.program_id(1)
    split = tl.program_id(2)
    b = pid_bh // NUM_KV_HEADS
    kvh = pid_bh % NUM_KV_HEADS

    q_start = tl.load(cu_ptr + b)
    n_q = tl.load(cu_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    prefix = seq_len - n_q
    first_q = tile * QUERIES_PER_TILE
    if first_q < n_q:
        # tile rows: r -> (query qi, head kvh*GROUP + hh)
        r = tl.arange(0, BLOCK_M)
        qi = first_q + r // GROUP_P2
        hh = r % GROUP_P2
        row_ok = (qi < n_q) & (hh < GROUP) & (r < QUERIES_PER_TILE * GROUP_P2)
        t = (q_start + qi).to(tl.int64)
        head = kvh * GROUP + hh
        d = tl.arange(0, HEAD_DIM_P2)
        d_ok = d < HEAD_DIM  # all true unless the head dim is padded
        PAD_D: tl.constexpr = HEAD_DIM_P2 != HEAD_DIM
        HQ: tl.constexpr = NUM_KV_HEADS * GROUP
        q = tl.load(q_ptr + t[:, None] * s_qt + head[:, None] * s_qh + d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0)
        q = (q.to(tl.float32) * qk_scale).to(q_ptr.dtype.element_ty)

        # keys this tile can see: up to its last query's position (causal); all (the block mask)
        last_q = tl.minimum(first_q + QUERIES_PER_TILE, n_q) - 1
        if BLOCK_MASK:
            kv_end = seq_len
        else:
            kv_end = tl.minimum(seq_len, prefix + last_q + 1)
        if HAS_TREE:
            tree_bits = tl.load(tree_ptr + t, mask=row_ok, other=0)
        else:
            tree_bits = qi  # unread
        # a sliding window: row r sees keys from key_first[r] (its position - window + 1; under a
        # tree its position is prefix + depth); the tile's walk starts at the chunk of its first
        # row's, and chunks before the chunk of its last row's apply the window's mask. CHUNKED
        # (with HAS_WINDOW; `window` holds the chunk size): key_first[r] is the start of the row's
        # attention chunk, (its position) // chunk * chunk. What follows reads only the tile's least
        # and greatest key_first and masks each row's keys below its own
        if HAS_WINDOW:
            if CHUNKED:
                if HAS_TREE:  # a node at prefix + its depth; its ancestors at prefix + theirs (not their slots)
                    depth = (_popcount64(tree_bits) - 1).to(tl.int32)
                    key_first = (prefix + depth) // window * window
                    # the ancestors of depth below key_first - prefix are hidden: the row's lowest set
                    # bits (BFS order: an ancestor's slot grows with its depth) are dropped, that many
                    drop = tl.where(row_ok, key_first - prefix, 0)
                    for _ in range(0, tl.max(drop, 0)):
                        tree_bits = tl.where(drop > 0, tree_bits & (tree_bits - 1), tree_bits)
                        drop -= 1
                else:
                    key_first = (prefix + qi) // window * window
            else:
                if HAS_TREE:
                    offset = (_popcount64(tree_bits) - 1).to(tl.int32)
                else:
                    offset = qi
                key_first = prefix + offset - window + 1
            kv_start = tl.maximum(tl.min(tl.where(row_ok, key_first, kv_end), 0), 0) // BLOCK_N * BLOCK_N
        else:
            key_first = qi  # unread
            kv_start = 0
        # this row's own keys are divided over the splits (at least min_split_chunks chunks
        # each, so short rows use fewer splits and the rest exit at once): a block table
        # reserved far beyond the row's length does not thin out the work per program
        chunks_per_split = tl.maximum(tl.cdiv(tl.cdiv(kv_end - kv_start, BLOCK_N), num_splits), min_split_chunks)
        lo = kv_start + split * chunks_per_split * BLOCK_N
        hi = tl.minimum(lo + chunks_per_split * BLOCK_N, kv_end)
        # chunks [lo, mid) lie wholly in the prefix: no causal or tree mask
        mid = tl.maximum(tl.minimum(hi, (prefix // BLOCK_N) * BLOCK_N), lo)
        # chunks [lo, w_end) reach below some row's window start: the window's mask (lo..lo without one)
        if HAS_WINDOW:
            w_last = tl.max(tl.where(row_ok, key_first, 0), 0)
            w_end = tl.maximum(tl.minimum(hi, tl.cdiv(w_last, BLOCK_N) * BLOCK_N), lo)
        else:
            w_end = lo

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_P2], tl.float32)
        n_off = tl.arange(0, BLOCK_N)
        bt_row = bt_ptr + b.to(tl.int64) * s_bt
        k_head = k_ptr + kvh.to(tl.int64) * s_kh
        v_head = v_ptr + kvh.to(tl.int64) * s_kh

        if HAS_WINDOW:
            m_i, l_i, acc = _masked_chunks(q, m_i, l_i, acc, lo, w_end, hi, prefix, qi, key_first, tree_bits, bt_row,
                                           k_head, v_head, s_kb, s_kt, softcap_log2, d, d_ok, n_off, BLOCK_N, PAGE_SIZE,
                                           HAS_TREE, BLOCK_MASK, HAS_WINDOW, HAS_SOFTCAP, IEEE_DOT)
        for start in range(w_end, mid, BLOCK_N):
            pos = start + n_off
            page = tl.load(bt_row + pos // PAGE_SIZE).to(tl.int64)
            slot = pos % PAGE_SIZE
            if PAD_D:
                kt = tl.load(k_head + page[None, :] * s_kb + slot[None, :] * s_kt + d[:, None], mask=d_ok[:, None], other=0.0)
            else:
                kt = tl.load(k_head + page[None, :] * s_kb + slot[None, :] * s_kt + d[:, None])  # [D, N]
            s = _scores(q, kt, softcap_log2, HAS_SOFTCAP, IEEE_DOT)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if PAD_D:
                v = tl.load(v_head + page[:, None] * s_kb + slot[:, None] * s_kt + d[None, :], mask=d_ok[None, :], other=0.0)
            else:
                v = tl.load(v_head + page[:, None] * s_kb + slot[:, None] * s_kt + d[None, :])  # [N, D]
            acc = _accumulate(acc, alpha, p, v, IEEE_DOT)
            m_i = m_new

        m_i, l_i, acc = _masked_chunks(q, m_i, l_i, acc, tl.maximum(mid, w_end), hi, hi, prefix, qi, key_first, tree_bits,
                                       bt_row, k_head, v_head, s_kb, s_kt, softcap_log2, d, d_ok, n_off, BLOCK_N,
                                       PAGE_SIZE, HAS_TREE, BLOCK_MASK, HAS_WINDOW, HAS_SOFTCAP, IEEE_DOT)

        if HAS_SINKS:  # GPT-OSS: one more logit per query head, counted once (by split 0), weighing no value
            if split == 0:
                sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0) * 1.4426950408889634
                top = tl.maximum(m_i, sink)
                keep = tl.math.exp2(m_i - top)
                l_i = l_i * keep + tl.math.exp2(sink - top)
                acc = acc * keep[:, None]
                m_i = top
        has_mass = l_i > 0.0
        o = acc / tl.where(has_mass, l_i, 1.0)[:, None]
        # out [T, HQ, HEAD_DIM] and part_o [splits, T, HQ, HEAD_DIM_P2], part_lse [splits, T, HQ]: contiguous
        if DIRECT_OUT:
            tl.store(out_ptr + (t[:, None] * HQ + head[:, None]) * HEAD_DIM + d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        else:
            lse = tl.where(has_mass, m_i + tl.math.log2(tl.where(has_mass, l_i, 1.0)), float("-inf"))
            row = (split * num_tokens + t) * HQ + head  # int64 (t is)
            tl.store(part_o_ptr + row[:, None] * HEAD_DIM_P2 + d[None, :], o, mask=row_ok[:, None])
            tl.store(part_lse_ptr + row, lse, mask=row_ok)
            if MERGE_LAST:  # the split that finishes last merges the tile's rows: no merge launch
                if last_program_of(ticket_ptr + pid_bh * tl.num_programs(1) + tile, num_splits, FENCE):
                    res = _combine_splits(part_o_ptr, part_lse_ptr, t * HQ + head, row_ok, d, num_splits,
                                          num_tokens * HQ, HEAD_DIM_P2)
                    tl.store(out_ptr + (t[:, None] * HQ + head[:, None]) * HEAD_DIM + d[None, :],
                             res.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _combine_splits(part_o_ptr, part_lse_ptr, rows, row_ok, d, num_splits, split_rows, HEAD_DIM_P2: tl.constexpr):
    """The in-kernel merge of rows [M] (t * HQ + head) from every split's partials, as _merge_splits
    computes it: out = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m), m = max_s lse_s; splits with
    lse = -inf weigh 0 and their partial output is not read. Other programs wrote the partials:
    they are read through L2 (.cg), after last_program_of's fence. -> [M, HEAD_DIM_P2] float32."""
    m = tl.full(rows.shape, float("-inf"), tl.float32)
    for s in range(0, num_splits):
        m = tl.maximum(m, tl.load(part_lse_ptr + s * split_rows + rows, mask=row_ok, other=float("-inf"),
                                  cache_modifier=".cg"))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([rows.shape[0], HEAD_DIM_P2], tl.float32)
    total = tl.zeros(rows.shape, tl.float32)
    for s in range(0, num_splits):
        row = s * split_rows + rows
        lse = tl.load(part_lse_ptr + row, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        w = tl.math.exp2(lse - m_safe)  # 0 where lse = -inf
        o = tl.load(part_o_ptr + row[:, None] * HEAD_DIM_P2 + d[None, :], mask=(row_ok & (lse > float("-inf")))[:, None],
                    other=0.0, cache_modifier=".cg")
        acc += w[:, None] * o
        total += w
    return acc / tl.maximum(total, 1e-30)[:, None]


@triton.jit(do_not_specialize=["num_splits", "num_tokens"])
def _merge_splits(
    part_o_ptr, part_lse_ptr, out_ptr, num_splits, num_tokens,
    NUM_HEADS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """out[t, h] = sum_s 2^(lse_s - lse) * o_s / sum_s 2^(lse_s - lse) (log2 units); splits
    with lse = -inf (no key of theirs visible) weigh 0 and their partial output is not read.
    The [D] accumulator is looped over splits: a [splits, D] tile spills at 64+ splits."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    split_rows = num_tokens * NUM_HEADS  # partial rows per split: lse [splits, T, H], o [splits, T, H, D_P2]
    sp = tl.arange(0, SPLITS_P2)
    lse_all = tl.load(part_lse_ptr + sp * split_rows + t * NUM_HEADS + h, mask=sp < num_splits, other=float("-inf"))
    m = tl.max(lse_all, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    d = tl.arange(0, HEAD_DIM_P2)
    acc = tl.zeros([HEAD_DIM_P2], tl.float32)
    total = tl.sum(tl.math.exp2(lse_all - m_safe), 0)
    for s in range(0, num_splits):
        row = s * split_rows + t * NUM_HEADS + h
        lse = tl.load(part_lse_ptr + row)
        if lse > float("-inf"):
            w = tl.math.exp2(lse - m_safe)
            acc += w * tl.load(part_o_ptr + row * HEAD_DIM_P2 + d)
    res = acc / tl.maximum(total, 1e-30)
    tl.store(out_ptr + (t * NUM_HEADS + h) * HEAD_DIM + d, res.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def tile_shared_bytes(block_m: int, block_n: int, head_dim: int, element_size: int) -> int:
    """An upper bound on the split kernel's shared memory (bytes) for a [block_m, head_dim] query
    tile over [block_n, head_dim] K and V chunks, double-buffered (num_stages=2): the compiled
    kernels for sm_86 took 49152-65536 (bf16, 128 x 64, D = 128), 98304 with block masks and a
    direct output (this bound exactly), 164352 (fp32, 128 x 64), 114944 (fp32, 64 x 64), 73984
    (fp32, 64 x 32); no planned tile above it (bench/results/compile_other_gpus.md)."""
    return element_size * head_dim * (4 * block_n + block_m)


def choose_tiling(max_query_len: int, group: int, head_dim: int, element_size: int = 2,
                  shared_limit: int | None = None) -> tuple[int, int, int]:
    """(queries per tile, tile rows BLOCK_M, KV chunk BLOCK_N) from static sizes. Up to 128
    rows (the flash-attention forward tile; 8 warps hold its fp32 [128, D<=128] accumulator),
    so K+1 <= 16 queries x a GQA group of 8 still read each KV page once. Calls of more than 16
    tokens (prefill) all take the largest tile: one compiled variant for every prompt length.
    shared_limit: the device's shared memory a block (None: no limit, e.g. the interpreter): the
    chunk (down to 32) and then the rows halve until tile_shared_bytes fits it (fp32 tiles on an
    RTX 30xx / 40xx, 99 KB a block, where an H100 has 227 KB: a launch over the limit fails);
    chunks of 16 where even 16 rows over 32 do not fit. The rows stay at 16 or more (tl.dot's
    least M). An H100 / H200 plans what it did before the limit was read."""
    group_p2 = _next_pow2(group)
    # Heads over 256 wide (Gemma 4's 512): 16 rows, whose fp32 accumulator [16, 512] fits 4 warps' registers --
    # compiled for sm_90a (tests/kernels/aot_compile_attention.py): 64 rows spilled 6-7 KB a thread, 16 rows
    # 104-176 bytes (untimed on a GPU)
    rows_cap = 128 if head_dim <= 128 else 64 if head_dim <= 256 else 16
    block_n = 64 if head_dim <= 128 else 32
    if shared_limit is not None:
        while block_n > 32 and tile_shared_bytes(rows_cap, block_n, head_dim, element_size) > shared_limit:
            block_n //= 2
        while rows_cap > 16 and tile_shared_bytes(rows_cap, block_n, head_dim, element_size) > shared_limit:
            rows_cap //= 2
        if tile_shared_bytes(rows_cap, block_n, head_dim, element_size) > shared_limit:
            block_n = 16  # the last resort (fp32, head_dim 256 on 99 KB): tl.dot's least K
    queries = tile_of(max_query_len, max(1, rows_cap // group_p2))  # prefill: the largest (one variant)
    block_m = max(16, queries * group_p2)  # tl.dot needs M >= 16
    return queries, block_m, block_n


# The merge's split tile: at least this wide, so engines of 2k-16k tokens per row (4-64 splits)
# share one compiled merge.
MERGE_SPLITS_P2 = 64
MIN_SPLIT_TOKENS = 256  # below this a split costs more (partial writes, merge) than it gains
# Short tables split like long ones. Until 2026-11-27 a table of <= 1024 tokens ran ONE split
# (no partials, no merge launch), from an H100 timing of 93 us at B=1 / 1k that was the eager
# Python launch cost. The H200's graph replays (bench/bench_attention.py --gpu --quick, forced
# split counts, bf16, 32 q / 8 kv heads, D = 128) measured at 1k tokens, B = 1: 1 split 23.4 us,
# 2 splits 15.3, 4 splits 10.8 (SDPA flash on dense K/V: 11.2); B = 8: 24.6 / 17.2 / 14.0; N = 5
# alike (29.4 -> 12.7 at B = 1). One program per KV head walking the whole table leaves the SMs
# idle; the merge launch costs less than that. A row much shorter than its table pays for it
# (the kernel divides the row's actual length over the splits the table chose): a 128-token row
# in a 1k / 8k table took 8.7 / 9.8 us against 6.6 with one split (H200, B = 1, N = 1,
# bench_attention's short_row rows, bench/results/h200_2026-11-27b). Kept: the split count is
# static for graph capture, and rows grow.
MAX_HEAD_DIM = 512  # (paged_base.head_dim_reason says the same to the runners)
# Where the split partials are merged: False, a second launch (_merge_splits); True, inside the
# split launch by the split that finishes last (_combine_splits after a ticket,
# kernels/_triton_sync.py; the tickets in a KernelWorkspace stay zero between calls). Measured on
# an H200 (graph replays, the same split counts both ways, N = 1 / 5): in-kernel over the launch
# at 1k tokens, 4 splits: 12.8 / 14.4 vs 10.8 / 12.7 us (B = 1), 15.6 / 18.3 vs 14.0 / 17.4
# (B = 8); at 8k, B = 1, 32 splits: 27.9 / 32.4 vs 15.9 / 19.0; at 8k, B = 8, 9 splits: 75.1 /
# 102.9 vs 79.3 / 95.1. Slower in 7 of 8: its GPU-scope fence and ticket per program and the last
# program's serial merge cost more than the launch they save. Off.
MERGE_IN_KERNEL = False


def head_dim_padded(head_dim: int) -> int:
    """The kernel's head dimension: the next power of 2, at least 16 (tl.dot's minimum)."""
    return max(16, _next_pow2(head_dim))


def choose_splits(num_sms: int | None, programs: int, capacity: int, block_n: int) -> tuple[int, int]:
    """(number of KV splits, minimum tokens per split) from static shapes only, for either merge.
    No SM count (interpreter / CPU): one split. Otherwise enough splits for ~4 programs per SM,
    each of >= MIN_SPLIT_TOKENS tokens of the block table; the kernel divides each row's actual
    length over the splits."""
    if num_sms is None:
        return 1, block_n
    want = max(1, -(-4 * num_sms // max(programs, 1)))
    min_tokens = -(-MIN_SPLIT_TOKENS // block_n) * block_n
    return max(1, min(want, -(-capacity // min_tokens))), min_tokens


@lru_cache(maxsize=None)
def _num_sms_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_sms(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return _num_sms_of(device.index if device.index is not None else torch.cuda.current_device())


@lru_cache(maxsize=None)
def _shared_limit_of(index: int) -> int | None:
    """CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as Triton reads it for its own launch
    check (OutOfResources), else torch's device property of that name (None where neither says)."""
    try:
        from triton.runtime import driver

        return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except (ImportError, AttributeError, KeyError, RuntimeError):
        return getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", None)


def _shared_limit(device: torch.device) -> int | None:
    """The shared memory one block may use on ``device`` (CUDA's opt-in limit), None off CUDA (or
    where no GPU answers: a plan made on a CPU machine for a CUDA device, as the tests do)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return _shared_limit_of(canonical_device(device).index)


class LaunchPlan(NamedTuple):
    """The static launch shape of one paged_attention_triton call (see plan_launch)."""

    queries: int  # query positions per tile
    block_m: int  # tile rows (queries x padded GQA group)
    block_n: int  # KV tokens per inner step
    num_tiles: int
    num_splits: int
    min_split_chunks: int
    head_dim_p2: int
    num_warps: int
    merge_in_kernel: bool = False  # with num_splits > 1: the last split merges (no second launch)


def plan_launch(device: torch.device, batch: int, num_kv_heads: int, group: int, head_dim: int, max_query_len: int,
                capacity: int, num_splits: int | None = None, min_split_tokens: int | None = None,
                merge_in_kernel: bool | None = None, element_size: int = 2) -> LaunchPlan:
    """Tiling and split count from static shapes (the runner caches it per call shape).
    merge_in_kernel: None takes MERGE_IN_KERNEL. element_size: bytes a value of q and the caches
    (the tiles fit the device's shared memory: choose_tiling)."""
    merge_in_kernel = MERGE_IN_KERNEL if merge_in_kernel is None else bool(merge_in_kernel)
    head_dim_p2 = head_dim_padded(head_dim)
    queries, block_m, block_n = choose_tiling(max_query_len, group, head_dim_p2, element_size, _shared_limit(device))
    num_tiles = -(-max_query_len // queries)
    if num_splits is None:
        num_splits, min_split = choose_splits(_num_sms(device), batch * num_kv_heads * num_tiles, capacity, block_n)
    else:
        min_split = block_n if min_split_tokens is None else min_split_tokens
        if num_splits < 1 or min_split < block_n or min_split % block_n:
            raise ValueError(f"num_splits >= 1 and min_split_tokens a positive multiple of {block_n}, "
                             f"got {num_splits}, {min_split_tokens}")
    return LaunchPlan(queries, block_m, block_n, num_tiles, num_splits, min_split // block_n, head_dim_p2,
                      8 if block_m >= 128 else 4, merge_in_kernel)


def paged_attention_triton(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, *,
                           max_query_len: int, tree_mask=None, scale: float, num_splits: int | None = None,
                           min_split_tokens: int | None = None, plan: LaunchPlan | None = None, causal: bool = True,
                           merge_in_kernel: bool | None = None, workspace: KernelWorkspace | None = None,
                           pdl: bool = False, window: int | None = None, softcap: float | None = None, sinks=None,
                           chunk: int | None = None):
    """Validated inputs (see kernels/attention/__init__.py). num_splits (with min_split_tokens,
    a multiple of the KV chunk, default one chunk) overrides the automatic flash-decoding split,
    e.g. for tests and the benchmark's sweep; merge_in_kernel (None: MERGE_IN_KERNEL) where the
    splits are merged; plan (from plan_launch) skips choosing again and carries both.
    workspace: the caller's KernelWorkspace for the in-kernel merge's tickets (one sequence of
    calls on one stream, e.g. a runner's layers); without one a split call zero-fills its tickets.
    pdl: on CUDA, each launch is a programmatic dependent launch (the GEMV layer's chain,
    runners/paged_llama.py GEMV_PDL): it waits for the kernel before it at its first line and
    lets the next PDL launch start at once. window, softcap, sinks, chunk: a sliding window, attention
    soft-capping, attention sinks ([Hq] float32) and chunked attention as kernels/attention/__init__.py
    defines them, each a constexpr passed only when set (the launches without them keep their compiled
    variants); chunk takes no window (the kernel passes it as its window argument)."""
    if chunk is not None and window is not None:
        raise ValueError("chunk takes no window (the kernel passes the chunk as its window)")
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    group = Hq // Hkv
    B = block_table.shape[0]
    page_size = k_cache.shape[1]
    out = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    if T == 0 or B == 0:
        return out
    if plan is None:
        plan = plan_launch(q.device, B, Hkv, group, D, max_query_len, block_table.shape[1] * page_size, num_splits,
                           min_split_tokens, merge_in_kernel, max(q.element_size(), k_cache.element_size()))
    if v_cache.stride() != k_cache.stride():  # the kernel takes one set of cache strides
        k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    if block_table.stride(1) != 1 and block_table.shape[1] > 1:  # the kernel takes a unit column stride
        block_table = block_table.contiguous()
    splits = plan.num_splits
    direct = splits == 1
    merge_last = plan.merge_in_kernel and not direct
    tickets = seq_lens  # not read unless merge_last
    # constexprs passed only when set: the launches of the default forms keep their keys
    pdl_kw = pdl_options(pdl, q.device)
    if direct:
        part_o = part_lse = out
    else:
        part_o = torch.empty(splits, T, Hq, plan.head_dim_p2, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(splits, T, Hq, dtype=torch.float32, device=q.device)
        if merge_last:  # one ticket per (row, KV head, query tile): zero at rest
            groups = B * Hkv * plan.num_tiles
            tickets = (workspace.counters(groups, q.device) if workspace is not None
                       else torch.zeros(groups, dtype=torch.int32, device=q.device))
    _paged_attn_split[(B * Hkv, plan.num_tiles, splits)](
        q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, seq_lens if tree_mask is None else tree_mask,
        seq_lens if sinks is None else sinks, out, part_o, part_lse, tickets,
        float(scale) * LOG2E, splits, plan.min_split_chunks, T, int(chunk or window or 0),
        float(softcap or 1.0) * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0),
        NUM_KV_HEADS=Hkv, GROUP=group, GROUP_P2=_next_pow2(group),
        QUERIES_PER_TILE=plan.queries, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        HEAD_DIM=D, HEAD_DIM_P2=plan.head_dim_p2, PAGE_SIZE=page_size,
        HAS_TREE=tree_mask is not None, DIRECT_OUT=direct,
        # fp32 inputs: exact (not tf32) dots. The interpreter's tl.dot on bf16 returns garbage
        # (triton 3.6: measured 2.6e10 error on a 16x16 product), so there bf16 dots run in fp32.
        IEEE_DOT=q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and q.device.type != "cuda"),
        num_warps=plan.num_warps, num_stages=2,
        **({} if causal else {"BLOCK_MASK": True}),
        **({} if window is None and chunk is None else {"HAS_WINDOW": True}),
        **({} if chunk is None else {"CHUNKED": True}),  # the chunk in `window`, HAS_WINDOW's walk
        **({} if softcap is None else {"HAS_SOFTCAP": True}),
        **({} if sinks is None else {"HAS_SINKS": True}),
        **({"MERGE_LAST": True, "FENCE": not triton_interpreting()} if merge_last else {}),
        **pdl_kw,
    )
    if not direct and not merge_last:
        _merge_splits[(T, Hq)](
            part_o, part_lse, out, splits, T,
            NUM_HEADS=Hq, SPLITS_P2=max(MERGE_SPLITS_P2, _next_pow2(splits)), HEAD_DIM=D, HEAD_DIM_P2=plan.head_dim_p2,
            num_warps=4 if plan.head_dim_p2 >= 128 else 2, **pdl_kw,
        )
    return out
