"""Launch 1 of the verify step for large vocabularies (V > CAP): ONE streaming pass over every
distribution, spread over NCHUNK programs per row, that also gathers the values the exact
thresholds depend on (finished by _triton_select_finish.py). Glossary: _triton_common.py.

grid (R, NCHUNK), R = B * NPOS distributions, one row and one vocab chunk per program:
  1. rows with top-k / top-p / min-p read a small sample of their row and place four rungs
     tau0 >= th_hi >= th_lo >= th_floor (_triton_sample.py), identically in every chunk;
  2. each program streams its chunk once: online max / sum-exp / lowest argmax (all rows);
     gathers the top set x >= tau0 into the row's candidate region 0 (rows with any of the
     three modes), and for rows whose thresholds may lie below the top set (top-p without a
     small top-k, top-k > CAP / 4, min-p) counts the exact count and mass at or above every
     rung and gathers the bracket th_lo <= x < th_hi into region 1.
Candidate slots come from one integer atomic per gathered value (their order is scheduling
order; everything summed over them later is summed in fixed point, so the order never shows).
Kept lean on purpose: the finishing work, which needs many registers, is its own launch, so
that this bandwidth-bound pass keeps its occupancy.
"""
import triton
import triton.language as tl

from ._triton_common import BIG_INDEX, NEG_INF, POS_INF, load_x_row, num_drafts_of_row, row_source, sampling_modes
from ._triton_sample import sample_rungs

# Candidate regions per row (cand_ptr [R, 3, CAP]) and their fill counters (fill_ptr [R, 2]).
TOP_SET = tl.constexpr(0)
BRACKET = tl.constexpr(1)
SWEPT = tl.constexpr(2)


@triton.jit
def candidate_plan(topk_on, topp_on, minp_on, top_k, CAP: tl.constexpr):
    """(gather: the row gathers its top set, rungs: it also counts rungs and gathers a bracket).
    A top-k of at most CAP / 4 settles in the top set, and top-p / min-p with it (they only
    ever remove more)."""
    small_topk = topk_on & (top_k * 4 <= CAP)
    gather = topk_on | topp_on | minp_on
    return gather, gather & ~small_topk


@triton.jit
def _gather(sel, x, fill_ptr, dst_ptr, CAP: tl.constexpr):
    """Append the x where sel to a candidate region (dst_ptr fp32 [CAP]) whose fill counter is
    fill_ptr: one integer atomic per value; the count stays exact past CAP."""
    if tl.sum(sel.to(tl.int32), axis=0) > 0:
        slot = tl.atomic_add(fill_ptr + tl.zeros_like(sel.to(tl.int32)), 1, mask=sel, sem="relaxed")
        tl.store(dst_ptr + slot, x, mask=sel & (slot < CAP))


@triton.jit
def _stream_chunk(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, start, tau0, th_hi, th_lo, th_floor,
                  cand_row_ptr, fill_row_ptr,
                  V: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr, CAP: tl.constexpr,
                  GATHER: tl.constexpr, RUNGS: tl.constexpr):
    """One pass over vocab [start, start + CHUNK) of one row: (max, sum exp(x - max), lowest
    argmax, counts and masses (relative to the max) at or above the four rungs). GATHER: gather
    the top set; RUNGS: count the rungs and gather the bracket too."""
    zero_f = tl.sum(tl.zeros([2], tl.float32), axis=0)
    zero_i = tl.sum(tl.zeros([2], tl.int32), axis=0)
    m = zero_f + NEG_INF
    s = zero_f
    arg = zero_i + start
    c0, c1, c2, c3 = zero_i, zero_i, zero_i, zero_i
    w0, w1, w2, w3 = zero_f, zero_f, zero_f, zero_f
    for v0 in range(0, CHUNK, BLOCK_V):
        idx = start + v0 + tl.arange(0, BLOCK_V)
        x = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp)
        block_max = tl.max(x, axis=0)
        block_arg = tl.min(tl.where(x == block_max, idx, BIG_INDEX), axis=0)
        new_m = tl.maximum(m, block_max)
        arg = tl.where(block_max > m, block_arg, arg)
        alpha = tl.where(new_m == m, 1.0, tl.exp(m - new_m))
        e = tl.where(x > NEG_INF, tl.exp(x - new_m), 0.0)
        s = s * alpha + tl.sum(e, axis=0)
        inside = idx < V
        if RUNGS:
            a0 = inside & (x >= tau0)
            a1 = inside & (x >= th_hi)
            a2 = inside & (x >= th_lo)
            a3 = inside & (x >= th_floor)
            c0 += tl.sum(a0.to(tl.int32), axis=0)
            c1 += tl.sum(a1.to(tl.int32), axis=0)
            c2 += tl.sum(a2.to(tl.int32), axis=0)
            c3 += tl.sum(a3.to(tl.int32), axis=0)
            w0 = w0 * alpha + tl.sum(tl.where(a0, e, 0.0), axis=0)
            w1 = w1 * alpha + tl.sum(tl.where(a1, e, 0.0), axis=0)
            w2 = w2 * alpha + tl.sum(tl.where(a2, e, 0.0), axis=0)
            w3 = w3 * alpha + tl.sum(tl.where(a3, e, 0.0), axis=0)
            _gather(a2 & ~a1, x, fill_row_ptr + BRACKET, cand_row_ptr + BRACKET * CAP, CAP)
        if GATHER:
            _gather(inside & (x >= tau0), x, fill_row_ptr + TOP_SET, cand_row_ptr + TOP_SET * CAP, CAP)
        m = new_m
    return m, s, arg, c0, c1, c2, c3, w0, w1, w2, w3


@triton.jit
def select_stream_kernel(
    target_ptr, draft_ptr, tokens_ptr,  # logits [B, K+1, V], [B, K, V] (target again when absent); drafts int [B, K]
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # [B]: fp32, int32, fp32, fp32
    part_f_ptr, part_i_ptr,  # [R, NCHUNK, 8] chunk partials: fp32 (m, s, mass x4, -, -), int32 (argmax, count x4, ...)
    cand_ptr, fill_ptr, rungs_ptr,  # fp32 [R, 3, CAP] candidates; int32 [R, 2] fills (zeroed); fp32 [R, 4] rungs
    NPOS, NCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    CAP: tl.constexpr, SAMPLE: tl.constexpr, SAMPLE_RUN: tl.constexpr, SAMPLE_GROUP: tl.constexpr,
    SAMPLE_SUB: tl.constexpr,
):
    """grid (R, NCHUNK): see the module docstring."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    b = r // NPOS
    kb = num_drafts_of_row(tokens_ptr, b, sx_b, sx_k, K, BLOCK_K)
    t_off, d_off, t_lim, d_lim = row_source(r, NPOS, kb, st_b, st_k, sd_b, sd_k, V, K)
    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    needed = t_lim + d_lim > 0
    topk_on, topp_on, minp_on = sampling_modes(t, top_k, tl.load(top_p_ptr + b), tl.load(min_p_ptr + b), needed, V)
    gather, rungs = candidate_plan(topk_on, topp_on, minp_on, top_k, CAP)
    temp = tl.where(t > 0, t, 1.0)
    cand_row_ptr = cand_ptr + r.to(tl.int64) * (3 * CAP)
    fill_row_ptr = fill_ptr + r * 2

    tau0 = tl.sum(tl.zeros([2], tl.float32), axis=0) + POS_INF
    th_hi, th_lo, th_floor = tau0, tau0, tau0
    if gather:
        tau0, th_hi, th_lo, th_floor = sample_rungs(
            target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, top_k, tl.load(top_p_ptr + b),
            tl.load(min_p_ptr + b), topk_on, topp_on, minp_on, topk_on & ~rungs, V, CAP, SAMPLE, SAMPLE_RUN,
            SAMPLE_GROUP, SAMPLE_SUB)
        if c == 0:
            j = tl.arange(0, 4)
            tl.store(rungs_ptr + r * 4 + j, tl.where(j == 0, tau0, tl.where(j == 1, th_hi, tl.where(j == 2, th_lo, th_floor))))
    start = c * CHUNK
    zero_f = tl.sum(tl.zeros([2], tl.float32), axis=0)
    zero_i = tl.sum(tl.zeros([2], tl.int32), axis=0)
    m, s, arg = zero_f + NEG_INF, zero_f, zero_i + start
    c0, c1, c2, c3 = zero_i, zero_i, zero_i, zero_i
    w0, w1, w2, w3 = zero_f, zero_f, zero_f, zero_f
    if rungs:
        m, s, arg, c0, c1, c2, c3, w0, w1, w2, w3 = _stream_chunk(
            target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, start, tau0, th_hi, th_lo, th_floor, cand_row_ptr,
            fill_row_ptr, V, CHUNK, BLOCK_V, CAP, True, True)
    elif gather:
        m, s, arg, c0, c1, c2, c3, w0, w1, w2, w3 = _stream_chunk(
            target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, start, tau0, th_hi, th_lo, th_floor, cand_row_ptr,
            fill_row_ptr, V, CHUNK, BLOCK_V, CAP, True, False)
    elif needed:
        m, s, arg, c0, c1, c2, c3, w0, w1, w2, w3 = _stream_chunk(
            target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, start, tau0, th_hi, th_lo, th_floor, cand_row_ptr,
            fill_row_ptr, V, CHUNK, BLOCK_V, CAP, False, False)
    f = tl.arange(0, 8)
    out = (r * NCHUNK + c) * 8 + f
    tl.store(part_f_ptr + out, tl.where(f == 0, m, tl.where(f == 1, s, tl.where(f == 2, w0, tl.where(
        f == 3, w1, tl.where(f == 4, w2, tl.where(f == 5, w3, 0.0)))))))
    tl.store(part_i_ptr + out, tl.where(f == 0, arg, tl.where(f == 1, c0, tl.where(f == 2, c1, tl.where(
        f == 3, c2, tl.where(f == 4, c3, 0))))))
