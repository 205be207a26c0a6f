"""Launch 1 of the verify step for large vocabularies (V > CAP): ONE streaming pass over every
distribution, spread over NCHUNK programs per row, that also gathers the values the exact
thresholds depend on (finished by _triton_select_finish.py). Glossary: _triton_common.py.

grid (R, NCHUNK), R = B * NPOS distributions, one row and one vocab chunk per program:
  1. rows with top-k / top-p / min-p read a small sample of their row and place six rungs
     tau0 >= rung1 >= ... >= rung5 (_triton_sample.py), identically in every chunk, or read
     them from the launch before, which placed them once per row (RUNGS_GIVEN: the plan's
     rungs_launch, _triton_select_rungs.py);
  2. each program streams its chunk once: online max / sum-exp / lowest argmax (all rows);
     gathers the top set x >= tau0 into the row's candidate region 0 (rows with any of the
     three modes), and for rows whose thresholds may lie below the top set (top-p without a
     small top-k, top-k > CAP / 16) counts the exact count and mass at or above every rung.
Rows without any of the three (greedy, plain sampling, positions past a row's first -1) are
then done: their last program (an integer ticket) merges the chunk partials and writes m, s,
amax. GREEDY_TOKENS (every row greedy, known on the host): that program also takes a ticket of
its batch row, and the one completing the row writes its tokens (_triton_greedy.py): the verify
step is then this launch and the zero fill. Candidate slots come from one integer atomic per gathered value (their order is scheduling
order; everything summed over them later is summed in fixed point, so the order never shows).
Kept lean on purpose: the finishing work, which needs many registers, is its own launch, so
that this bandwidth-bound pass keeps its occupancy.
"""
import triton
import triton.language as tl

from .._triton_sync import last_program_of
from ..penalties.triton import row_penalty
from ._triton_common import (BIG_INDEX, KEY_NEG_INF, NEG_INF, POS_INF, load_x_row, num_drafts_of_row,
                             position_of, row_source, sampling_modes, vocab_index)
from ._triton_greedy import write_greedy_tokens
from ._triton_sample import sample_rungs

# Candidate regions per row (cand_ptr [R, 3, CAP]) and their fill counters (fill_ptr [R, 2]):
# the top set (gathered here), the interval the finishing kernel gathers, the fallback's sweeps.
TOP_SET = tl.constexpr(0)
GATHERED = tl.constexpr(1)
SWEPT = tl.constexpr(2)


@triton.jit
def small_top_k(topk_on, top_k, CAP: tl.constexpr):
    """A top-k of at most CAP / 16: it settles in the gathered top set (candidate_plan)."""
    return topk_on & (top_k * 16 <= CAP)


@triton.jit
def candidate_plan(topk_on, topp_on, minp_on, top_k, CAP: tl.constexpr):
    """(gather: the row gathers its top set, rungs: it also counts and weighs its rungs).
    A top-k of at most CAP / 16 settles in the top set (aimed at 8 k values: a miss is
    vanishingly rare), and top-p / min-p with it (they only ever remove more); top-p without
    it and larger top-k locate their thresholds with the rungs; min-p alone needs only tau0
    (the finishing kernel sums it by chunks when it reaches below the top set)."""
    small_topk = small_top_k(topk_on, top_k, CAP)
    gather = topk_on | topp_on | minp_on
    return gather, (topk_on | topp_on) & ~small_topk


@triton.jit
def _gather(sel, x, fill_ptr, dst_ptr, CAP: tl.constexpr):
    """Append the x where sel to a candidate region (dst_ptr fp32 [CAP]) whose fill counter is
    fill_ptr: one integer atomic per value; the count stays exact past CAP."""
    if tl.sum(sel.to(tl.int32), axis=None) > 0:  # any shape (the same IR as reshape(can_reorder=True), which
        # Triton 3.9 deprecates)
        slot = tl.atomic_add(fill_ptr + tl.zeros_like(sel.to(tl.int32)), 1, mask=sel, sem="relaxed")
        tl.store(dst_ptr + slot, x, mask=sel & (slot < CAP))


@triton.jit
def _stream_chunk(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr, start, rungs,
                  cand_row_ptr, fill_row_ptr, V: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr,
                  CAP: tl.constexpr, GATHER: tl.constexpr, RUNGS: tl.constexpr, SUMS: tl.constexpr = True):
    """One pass over vocab [start, start + CHUNK) of one row: (max, sum exp(x - max), lowest
    argmax, counts [8] and masses [8] (relative to the max) at or above the rungs [8]).
    GATHER: gather the top set x >= rungs[0]; RUNGS: count and weigh the rungs too. SUMS False
    (argmax only: every row greedy, _select_stream's SUMS): no exp, the sum returned as 1."""
    tl.static_assert(SUMS or not (RUNGS or GATHER), "the rungs and the top set need the sums")
    zero_f = tl.sum(tl.zeros([2], tl.float32), axis=0)
    m = zero_f + NEG_INF
    s = zero_f
    arg = tl.sum(tl.zeros([2], tl.int32), axis=0) + start
    counts = tl.zeros([8], tl.int32)
    masses = tl.zeros([8], tl.float32)
    tau0 = tl.max(tl.where(tl.arange(0, 8) == 0, rungs, NEG_INF), axis=0)
    for v0 in range(0, CHUNK, BLOCK_V):
        idx = start + v0 + tl.arange(0, BLOCK_V)
        x = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp, pen, PENALTY)
        block_max = tl.max(x, axis=0)
        if block_max > m:  # the lowest index of a new maximum (a later tile only wins when larger)
            arg = tl.min(tl.where(x == block_max, idx, BIG_INDEX), axis=0)
        new_m = tl.maximum(m, block_max)
        if SUMS:
            alpha = tl.where(new_m == m, 1.0, tl.exp(m - new_m))
            e = tl.where(x > NEG_INF, tl.exp(x - new_m), 0.0)
            s = s * alpha + tl.sum(e, axis=0)
        inside = idx < V
        if RUNGS:
            at_or_above = (x[None, :] >= rungs[:, None]) & inside[None, :]  # [8, BLOCK_V]
            counts += tl.sum(at_or_above.to(tl.int32), axis=1)
            masses = masses * alpha + tl.sum(tl.where(at_or_above, e[None, :], 0.0), axis=1)
        if GATHER:
            _gather(inside & (x >= tau0), x, fill_row_ptr + TOP_SET, cand_row_ptr + TOP_SET * CAP, CAP)
        m = new_m
    if not SUMS:
        s = zero_f + 1.0
    return m, s, arg, counts, masses


@triton.jit
def _stream_chunk_lanes(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr, start,
                        rungs, cand_row_ptr, fill_row_ptr, V: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr,
                        CAP: tl.constexpr, GATHER: tl.constexpr, UNROLL: tl.constexpr, SUMS: tl.constexpr = True):
    """_stream_chunk without rungs, keeping (max, sum exp, argmax) per lane [BLOCK_V] and reducing
    across lanes once, after the loop: no block-wide reduction (shared memory and a barrier) per
    step, so a warp's next loads need not wait for the other warps. One exp per value: a lane
    whose max rises rescales its sum by exp(old - new) and adds 1, else adds exp(x - max).
    Same (max, argmax) as _stream_chunk; the sum differs only in rounding order. H100, B=64
    V=128256 K=4 (bench/bench_stream_lanes.py): greedy / T=1 verify 353 / 527 us with the block
    loop, 246 / 419 us with this one; slower where a program streams a single block (the plan
    picks: _triton_plan.plan_launches). GATHER: the top set x >= tau0 = rungs[0] as in
    _stream_chunk. SUMS False (argmax only, as _stream_chunk's): per value a compare, a select and
    a max; the sum returned as 1."""
    tl.static_assert(SUMS or not GATHER, "the top set needs the sums")
    tau0 = tl.max(tl.where(tl.arange(0, 8) == 0, rungs, NEG_INF), axis=0)
    m_l = tl.full([BLOCK_V], NEG_INF, tl.float32)
    s_l = tl.zeros([BLOCK_V], tl.float32)
    a_l = tl.zeros([BLOCK_V], tl.int32) + start
    if UNROLL == 1:
        for v0 in range(0, CHUNK, BLOCK_V):
            idx = start + v0 + tl.arange(0, BLOCK_V)
            x = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp, pen, PENALTY)
            up = x > m_l  # a lane's first maximum keeps its lowest index
            if SUMS:
                e = tl.exp(tl.where(up, m_l - x, x - m_l))  # NaN only where x = m_l = -inf: masked below
                s_l = tl.where(up, s_l * e + 1.0, s_l + tl.where(x > NEG_INF, e, 0.0))
            a_l = tl.where(up, idx, a_l)
            m_l = tl.maximum(m_l, x)
            if GATHER:
                _gather((idx < V) & (x >= tau0), x, fill_row_ptr + TOP_SET, cand_row_ptr + TOP_SET * CAP, CAP)
    else:
        # UNROLL blocks per step, loaded as one [UNROLL, BLOCK_V] tile: UNROLL independent 16-byte
        # loads per thread in flight before any use (the plan makes CHUNK a multiple of the step).
        # Lane j folds its UNROLL values (max, sum exp, lowest argmax: rows in increasing index)
        # into its state with one more exp: (UNROLL + 1) / UNROLL exps per value.
        for v0 in range(0, CHUNK, BLOCK_V * UNROLL):
            idx2 = start + v0 + tl.arange(0, UNROLL)[:, None] * BLOCK_V + tl.arange(0, BLOCK_V)[None, :]
            x2 = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx2, temp, pen, PENALTY)
            bm = tl.max(x2, axis=0)
            ba = tl.min(tl.where(x2 == bm[None, :], idx2, BIG_INDEX), axis=0)
            up = bm > m_l
            if SUMS:
                live = bm > NEG_INF
                e2 = tl.where(x2 > NEG_INF, tl.exp(x2 - tl.where(live, bm, 0.0)[None, :]), 0.0)
                bs = tl.sum(e2, axis=0)
                e = tl.exp(tl.where(up, m_l - bm, bm - m_l))  # NaN only where bm = m_l = -inf: masked below
                s_l = tl.where(up, s_l * e + bs, tl.where(live, s_l + bs * e, s_l))
            a_l = tl.where(up, ba, a_l)
            m_l = tl.maximum(m_l, bm)
            if GATHER:
                _gather((idx2 < V) & (x2 >= tau0), x2, fill_row_ptr + TOP_SET, cand_row_ptr + TOP_SET * CAP, CAP)
    m = tl.max(m_l, axis=0)
    arg = tl.min(tl.where(m_l == m, a_l, BIG_INDEX), axis=0)
    if SUMS:
        s = tl.sum(tl.where(m_l > NEG_INF, s_l * tl.exp(m_l - m), 0.0), axis=0)
    else:
        s = tl.sum(tl.zeros([2], tl.float32), axis=0) + 1.0
    return m, s, arg


@triton.jit
def _stream_chunk_without_rungs(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr,
                                start, rungs, cand_row_ptr, fill_row_ptr, V: tl.constexpr, CHUNK: tl.constexpr,
                                BLOCK_V: tl.constexpr, CAP: tl.constexpr, GATHER: tl.constexpr, LANES: tl.constexpr,
                                UNROLL: tl.constexpr, SUMS: tl.constexpr = True):
    """_stream_chunk's outputs for a row without rungs (counts and masses zero), streamed per lane
    (LANES: _stream_chunk_lanes, UNROLL blocks per step) or with the block-reduction loop; SUMS
    False: the argmax and the max only (the sum 1)."""
    if LANES:
        m, s, arg = _stream_chunk_lanes(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, start,
                                        rungs, cand_row_ptr, fill_row_ptr, V, CHUNK, BLOCK_V, CAP, GATHER, UNROLL, SUMS)
        return m, s, arg, tl.zeros([8], tl.int32), tl.zeros([8], tl.float32)
    return _stream_chunk(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, start, rungs,
                         cand_row_ptr, fill_row_ptr, V, CHUNK, BLOCK_V, CAP, GATHER, False, SUMS)


@triton.jit
def merge_partials(part_f_ptr, part_i_ptr, r, NCHUNK, BLOCK_C: tl.constexpr, FROM_L2: tl.constexpr):
    """Merge the chunk partials of row r (a fixed reduction order: deterministic): (m, s, amax,
    rung counts int64 [8], rung masses fp32 [8] relative to m; slots 6, 7 zero). part_f: fp32
    [R, NCHUNK, 8] = (m, s, mass of rungs 0-5); part_i: int32 [R, NCHUNK, 8] = (argmax, count
    of rungs 0-5, -). FROM_L2: written by other programs of this launch (.cg loads)."""
    c = tl.arange(0, BLOCK_C)[:, None]
    f = tl.arange(0, 8)[None, :]
    at = (r * NCHUNK + c) * 8 + f
    live = c < NCHUNK
    if FROM_L2:
        pf = tl.load(part_f_ptr + at, mask=live, other=0.0, cache_modifier=".cg")
        pi = tl.load(part_i_ptr + at, mask=live, other=0, cache_modifier=".cg")
    else:
        pf = tl.load(part_f_ptr + at, mask=live, other=0.0)
        pi = tl.load(part_i_ptr + at, mask=live, other=0)
    cm = tl.where(live, tl.sum(tl.where(f == 0, pf, 0.0), axis=1)[:, None], NEG_INF)  # [BLOCK_C, 1]
    m = tl.max(tl.max(cm, axis=1), axis=0)
    scale = tl.where(cm > NEG_INF, tl.exp(cm - m), 0.0)  # [BLOCK_C, 1]
    s = tl.sum(tl.sum(tl.where(f == 1, pf * scale, 0.0), axis=1), axis=0)
    args = tl.sum(tl.where(f == 0, pi, 0), axis=1)[:, None]
    amax = tl.min(tl.min(tl.where(live & (cm == m), args, BIG_INDEX), axis=1), axis=0)
    masses = tl.sum(tl.where(f >= 2, pf * scale, 0.0), axis=0)  # [8], rung j at column j + 2
    counts = tl.sum(tl.where((f >= 1) & (f < 7), pi, 0), axis=0).to(tl.int64)  # [8], rung j at column j + 1
    j = tl.arange(0, 8)[:, None]
    return m, s, amax, tl.sum(tl.where(f == j + 1, counts[None, :], 0), axis=1), \
        tl.sum(tl.where(f == j + 2, masses[None, :], 0.0), axis=1)


@triton.jit
def select_stream_kernel(
    target_ptr, draft_ptr, tokens_ptr,  # logits [B, K+1, V], [B, K, V] (target again when absent); drafts int [B, K]
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # [B]: fp32, int32, fp32, fp32
    part_f_ptr, part_i_ptr,  # [R, NCHUNK, 8] chunk partials: fp32 (m, s, mass x6), int32 (argmax, count x6, -)
    cand_ptr, fill_ptr, rungs_ptr,  # fp32 [R, 3, CAP] candidates; int32 [R, 2] fills (zeroed); fp32 [R, 8] rungs
    ticket_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr,  # int32 [R] tickets (zeroed); [R] outputs of plain rows
    row_ticket_ptr, out_ptr, num_accepted_ptr,  # GREEDY_TOKENS: int32 [B] tickets (zeroed); int32 [B, K+1], [B]
    NPOS, NCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr, SAMPLE_RUN: tl.constexpr,
    SAMPLE_GROUP: tl.constexpr, SAMPLE_SUB: tl.constexpr, FENCE: tl.constexpr,
    GREEDY_TOKENS: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_K1: tl.constexpr, LANES: tl.constexpr,
    SELECTS: tl.constexpr, UNROLL: tl.constexpr, RUNGS_GIVEN: tl.constexpr = False, SUMS: tl.constexpr = True,
):
    """grid (R, NCHUNK): see the module docstring. LANES (the plan's stream_lanes): rows without
    rungs stream with _stream_chunk_lanes, else with _stream_chunk. RUNGS_GIVEN (the plan's
    rungs_launch): gathering rows read their rungs from rungs_ptr, placed by
    _triton_select_rungs.py, instead of placing them in every program. SUMS False (the plan's
    stream_sums: every row greedy): the stream keeps the max and the argmax alone (greedy tokens
    need nothing else: _triton_greedy.py, tree_verify's walk); s is written as 1. No penalties."""
    _select_stream(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_f_ptr,
                   part_i_ptr, cand_ptr, fill_ptr, rungs_ptr, ticket_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr,
                   row_ticket_ptr, out_ptr, num_accepted_ptr, NPOS, NCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
                   (tokens_ptr,), False, V, K, CHUNK, BLOCK_V, BLOCK_K, BLOCK_C, CAP, SAMPLE, SAMPLE_RUN, SAMPLE_GROUP,
                   SAMPLE_SUB, FENCE, GREEDY_TOKENS, HAS_DRAFT_LOGITS, BLOCK_K1, LANES, SELECTS, UNROLL, RUNGS_GIVEN,
                   SUMS)


@triton.jit
def select_stream_penalised_kernel(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_f_ptr, part_i_ptr,
    cand_ptr, fill_ptr, rungs_ptr, ticket_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, row_ticket_ptr, out_ptr,
    num_accepted_ptr, NPOS, NCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
    counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb, s_pk,  # penalties
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr, SAMPLE_RUN: tl.constexpr,
    SAMPLE_GROUP: tl.constexpr, SAMPLE_SUB: tl.constexpr, FENCE: tl.constexpr,
    GREEDY_TOKENS: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_K1: tl.constexpr, LANES: tl.constexpr,
    SELECTS: tl.constexpr, UNROLL: tl.constexpr,
    W: tl.constexpr, P0: tl.constexpr, RUNGS_GIVEN: tl.constexpr = False, SUMS: tl.constexpr = True,
):
    """select_stream_kernel with penalties (kernels/penalties/triton.py: counts int32 [B, V] row
    stride s_cb, per-row repetition / frequency / presence fp32 [B], the W generated tokens
    pen_tokens int [B, W] (strides s_pb, s_pk) of which position i sees the first P0 + i)."""
    _select_stream(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_f_ptr,
                   part_i_ptr, cand_ptr, fill_ptr, rungs_ptr, ticket_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr,
                   row_ticket_ptr, out_ptr, num_accepted_ptr, NPOS, NCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
                   (W, P0, counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb, s_pk),
                   True, V, K, CHUNK, BLOCK_V, BLOCK_K, BLOCK_C, CAP, SAMPLE, SAMPLE_RUN, SAMPLE_GROUP, SAMPLE_SUB,
                   FENCE, GREEDY_TOKENS, HAS_DRAFT_LOGITS, BLOCK_K1, LANES, SELECTS, UNROLL, RUNGS_GIVEN, SUMS)


@triton.jit
def _select_stream(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_f_ptr, part_i_ptr,
    cand_ptr, fill_ptr, rungs_ptr, ticket_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, row_ticket_ptr, out_ptr,
    num_accepted_ptr, NPOS, NCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b, pen_args, PENALTY: tl.constexpr,
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr, SAMPLE_RUN: tl.constexpr,
    SAMPLE_GROUP: tl.constexpr, SAMPLE_SUB: tl.constexpr, FENCE: tl.constexpr,
    GREEDY_TOKENS: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_K1: tl.constexpr, LANES: tl.constexpr,
    SELECTS: tl.constexpr, UNROLL: tl.constexpr, RUNGS_GIVEN: tl.constexpr, SUMS: tl.constexpr,
):
    """The streaming launch's program (r, c); pen_args: the penalties (kernels/penalties/triton.py)
    or (False,)."""
    tl.static_assert(SUMS or not SELECTS, "the argmax alone serves greedy rows only")
    r = tl.program_id(0)
    c = tl.program_id(1)
    b = r // NPOS
    kb = num_drafts_of_row(tokens_ptr, b, sx_b, sx_k, K, BLOCK_K)
    t_off, d_off, t_lim, d_lim = row_source(r, NPOS, kb, st_b, st_k, sd_b, sd_k, V, K)
    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    needed = t_lim + d_lim > 0
    if SELECTS:
        topk_on, topp_on, minp_on = sampling_modes(t, top_k, tl.load(top_p_ptr + b), tl.load(min_p_ptr + b), needed, V)
        gather, rungs_on = candidate_plan(topk_on, topp_on, minp_on, top_k, CAP)
    else:  # no row uses top-k / top-p / min-p (host-known modes): none of their code is compiled
        topk_on = False
        minp_on = False
        gather = False
        rungs_on = False
    temp = tl.where(t > 0, t, 1.0)
    cand_row_ptr = cand_ptr + r.to(tl.int64) * (3 * CAP)
    fill_row_ptr = fill_ptr + r * 2
    pen = pen_args
    if PENALTY:
        pen = row_penalty(pen_args, b, position_of(r, NPOS, K))

    rungs = tl.full([8], POS_INF, tl.float32)
    if SELECTS and gather:
        if RUNGS_GIVEN:  # placed once per row by the launch before (_triton_select_rungs.py)
            rungs = tl.load(rungs_ptr + r * 8 + tl.arange(0, 8))
        else:  # every program of the row places the same rungs (one program stores them)
            rungs = sample_rungs(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, top_k,
                                 tl.load(min_p_ptr + b), minp_on, small_top_k(topk_on, top_k, CAP), V, CAP, SAMPLE,
                                 SAMPLE_RUN, SAMPLE_GROUP, SAMPLE_SUB)
            if c == 0:
                tl.store(rungs_ptr + r * 8 + tl.arange(0, 8), rungs)
    start = c * CHUNK
    m = tl.sum(tl.zeros([2], tl.float32), axis=0) + NEG_INF
    s = tl.sum(tl.zeros([2], tl.float32), axis=0)
    arg = tl.sum(tl.zeros([2], tl.int32), axis=0) + start
    counts = tl.zeros([8], tl.int32)
    masses = tl.zeros([8], tl.float32)
    if SELECTS:
        if rungs_on:
            m, s, arg, counts, masses = _stream_chunk(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen,
                                                      PENALTY, start, rungs, cand_row_ptr, fill_row_ptr, V, CHUNK,
                                                      BLOCK_V, CAP, True, True)
        elif gather:
            m, s, arg, counts, masses = _stream_chunk_without_rungs(
                target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, start, rungs, cand_row_ptr,
                fill_row_ptr, V, CHUNK, BLOCK_V, CAP, True, LANES, UNROLL)
        elif needed:
            m, s, arg, counts, masses = _stream_chunk_without_rungs(
                target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, start, rungs, cand_row_ptr,
                fill_row_ptr, V, CHUNK, BLOCK_V, CAP, False, LANES, UNROLL)
    elif needed:
        m, s, arg, counts, masses = _stream_chunk_without_rungs(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp,
                                                                pen, PENALTY, start, rungs, cand_row_ptr, fill_row_ptr,
                                                                V, CHUNK, BLOCK_V, CAP, False, LANES, UNROLL, SUMS)
    # partials: fp32 (m, s, mass of rungs 0-5), int32 (argmax, count of rungs 0-5, -)
    f = tl.arange(0, 8)
    out = (r * NCHUNK + c) * 8 + f
    shift = f[:, None] == tl.arange(0, 8)[None, :] + 2
    tl.store(part_f_ptr + out, tl.where(f == 0, m, tl.where(f == 1, s, tl.sum(tl.where(shift, masses[None, :], 0.0),
                                                                              axis=1))))
    shift = f[:, None] == tl.arange(0, 8)[None, :] + 1
    tl.store(part_i_ptr + out, tl.where(f == 0, arg, tl.sum(tl.where(shift, counts[None, :], 0), axis=1)))
    # Rows without top-k / top-p / min-p (greedy, plain sampling, positions never read) are done
    # once merged: their row's last program does it here, where registers are plenty, instead
    # of a finishing program (one per SM) per row.
    if ~gather:
        if last_program_of(ticket_ptr + r, NCHUNK, FENCE):
            m, s, amax, _, _ = merge_partials(part_f_ptr, part_i_ptr, r, NCHUNK, BLOCK_C, True)
            m = tl.where(needed, m, 0.0)  # positions never read: harmless numbers instead of -inf / 0
            if SUMS:
                s = tl.where(needed, s, 1.0)
            else:  # the partials' 1s merged: not a sum
                s = tl.where(needed, 1.0, 1.0)
            tl.store(m_ptr + r, m)
            tl.store(s2_ptr + r, s)
            tl.store(s3_ptr + r, s)
            tl.store(tkey_ptr + r, tl.sum(tl.zeros([1], tl.int64), axis=0) + KEY_NEG_INF)
            tl.store(amax_ptr + r, vocab_index(amax, V))
            if GREEDY_TOKENS:  # every row greedy: the row's last distribution writes its tokens
                rows = tl.zeros([1], tl.int32) + b
                if K == 0:  # one distribution per row: this program completes it
                    tl.debug_barrier()  # its amax store, read back by every thread
                    write_greedy_tokens(tokens_ptr, amax_ptr, out_ptr, num_accepted_ptr, rows, rows >= 0, NPOS, sx_b,
                                        sx_k, so_b, V, K, HAS_DRAFT_LOGITS, BLOCK_K, BLOCK_K1)
                elif last_program_of(row_ticket_ptr + b, NPOS, FENCE):
                    write_greedy_tokens(tokens_ptr, amax_ptr, out_ptr, num_accepted_ptr, rows, rows >= 0, NPOS, sx_b,
                                        sx_k, so_b, V, K, HAS_DRAFT_LOGITS, BLOCK_K, BLOCK_K1)
