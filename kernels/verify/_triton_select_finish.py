"""Launch 2 of the verify step for large vocabularies: for each distribution, merge the chunk
partials of _triton_select_stream.py and settle the top-k / top-p / min-p thresholds exactly.
Glossary: _triton_common.py.

grid (R, NFCHUNK): FCHUNK-value chunks (fewer than the streaming launch's: this kernel's
registers allow one program per SM). Each threshold is the largest key
reaching a goal (_triton_search.py: a count for top-k, a fixed-point probability mass for
top-p within the top-k set). Every program merges its row's partials (a fixed order: each
gets the same m, s and exact counts / masses at the known points +inf, the four rungs, -inf)
and so locates, identically, the interval [point j+1, point j) that holds a threshold:
  - the top set (j = 0), gathered while streaming: nothing more to read;
  - a deeper interval of at most CAP values: every program gathers its chunk's part of it
    (integer atomics), one more pass over the row spread over NCHUNK programs;
  - min-p alone, reaching below the top set: every program sums its chunk's kept mass
    (fixed point, one slot per chunk).
The program that takes the row's last ticket then searches the gathered values in registers.
Anything else (an interval of more than CAP values, top-p below a top-k of more than CAP / 4,
an overflowing region) falls back to exact sweeps over the row by that one program
(_triton_sweeps.py: 1 + ~log2(count / CAP) passes; rare on real and random logits).
"""
import triton
import triton.language as tl

from .._triton_sync import last_program_of
from ..penalties.triton import row_penalty
from ._triton_common import (BIG_INDEX, E_ONE, KEY_NEG_INF, KEY_NONE, KEY_POS_INF, NEG_INF, fixed_mass, fixed_prob,
                             key_value, load_x_row, num_drafts_of_row, order_key, passes_min_p,
                             position_of, row_source, sampling_modes, vocab_index)
from ._triton_search import largest_key_fused, largest_key_reaching, load_candidates
from ._triton_select_stream import GATHERED, SWEPT, TOP_SET, candidate_plan, merge_partials
from ._triton_sweeps import refine_and_collect, sweep_min_p_mass

NUM_POINTS = tl.constexpr(8)  # known points: +inf, the six rungs (tau0 first), -inf
# Diagnostics (paths_ptr, one int32 per distribution): 1 << region per stage (TOP_SET,
# GATHERED, SWEPT), shifted by 0 (top-k), 4 (top-p), 8 (min-p; GATHERED: summed by chunks);
# SINGLE_KEY: a refinement ended on one key holding the threshold.
SINGLE_KEY = tl.constexpr(8)
MIN_P_BY_CHUNKS = tl.constexpr(2 << 8)  # (1 << GATHERED) << 8
PATH_TOP_SET = tl.constexpr(1)  # 1 << TOP_SET
PATH_SWEPT = tl.constexpr(4)  # 1 << SWEPT


@triton.jit
def _pick8(values, j):
    """values[j] of a [NUM_POINTS] tensor (j a scalar)."""
    return tl.sum(tl.where(tl.arange(0, NUM_POINTS) == j, values, 0), axis=0)


@triton.jit
def _top_set_mass(top_ptr, n, tau0, m, TILE: tl.constexpr):
    """Mass (E units) of the first n <= TILE values of the top set at top_ptr with x >= tau0."""
    x0, key0 = load_candidates(top_ptr, n, order_key(tau0), KEY_POS_INF, TILE)
    return tl.sum(tl.sum(tl.where(key0 != KEY_NONE, fixed_mass(tl.exp(x0 - m)), 0), axis=1), axis=0)


@triton.jit
def _known_points(rungs, counts8, masses8, m, s, n0, ok0, use_rungs, weigh_top, cand_row_ptr,
                  V: tl.constexpr, CAP: tl.constexpr, SEARCH_TILE: tl.constexpr):
    """(key, count, mass (E units)) [NUM_POINTS] of the values at or above each known point, in
    decreasing key order: +inf, the six rungs, -inf. Rows without rungs know only tau0, from
    their gathered top set (when it fits; its mass is read only when weigh_top: over a tile of
    SEARCH_TILE values where the set fits one and SEARCH_TILE is set, else of CAP), and use tau0
    for every rung slot."""
    jp = tl.arange(0, NUM_POINTS)
    slot = jp[:, None] == tl.arange(0, 8)[None, :] + 1  # point j is rung j - 1
    rung_vals = tl.sum(tl.where(slot, rungs[None, :], 0.0), axis=1)
    rung_counts = tl.sum(tl.where(slot, counts8[None, :], 0), axis=1)
    rung_masses = tl.sum(tl.where(slot, fixed_mass(masses8)[None, :], 0), axis=1)
    tau0 = tl.max(tl.where(tl.arange(0, 8) == 0, rungs, NEG_INF), axis=0)
    n_top = tl.where(ok0 & ~use_rungs & weigh_top, n0, 0)
    if SEARCH_TILE == 0:
        top_mass = _top_set_mass(cand_row_ptr + TOP_SET * CAP, n_top, tau0, m, CAP)
    elif n_top <= SEARCH_TILE:
        top_mass = _top_set_mass(cand_row_ptr + TOP_SET * CAP, n_top, tau0, m, SEARCH_TILE)
    else:
        top_mass = _top_set_mass(cand_row_ptr + TOP_SET * CAP, n_top, tau0, m, CAP)
    inner = (jp >= 1) & (jp <= NUM_POINTS - 2)
    known = inner & (use_rungs | ok0)  # without rungs only tau0 is known, and only when its set fits
    p_key = tl.where(jp == 0, KEY_POS_INF, tl.where(known, order_key(rung_vals), KEY_NEG_INF))
    p_key = tl.where(known & ~use_rungs, order_key(tau0), p_key)
    p_count = tl.where(jp == 0, 0, tl.where(known, tl.where(use_rungs, rung_counts, n0.to(tl.int64)), V))
    p_mass = tl.where(jp == 0, 0, tl.where(known, tl.where(use_rungs, rung_masses, top_mass), fixed_mass(s)))
    return p_key, p_count, p_mass


@triton.jit
def _interval(p_count, p_mass, goal, s2k, USE_PROB: tl.constexpr):
    """(j, weight at point j, reachable): the interval [point j+1, point j) holding the largest
    key whose weight (counts, or fixed-point probabilities mass / s2k) reaches goal."""
    if USE_PROB:
        p_weight = fixed_prob(p_mass.to(tl.float64) / (s2k.to(tl.float64) * E_ONE))
    else:
        p_weight = p_count
    j = tl.maximum(tl.sum((p_weight < goal).to(tl.int32), axis=0) - 1, 0)
    reachable = j < NUM_POINTS - 1
    j = tl.minimum(j, NUM_POINTS - 2)
    return j, _pick8(p_weight, j), reachable


@triton.jit
def _search_region(region_ptr, n, lo_key, hi_key, floor_key, goal, w_hi, c_hi, m_hi, m, s2k, TILE: tl.constexpr,
                   USE_PROB: tl.constexpr, WAYS: tl.constexpr):
    """The threshold inside a gathered interval [lo_key, hi_key) of n <= TILE values at
    region_ptr (fp32), restricted to keys >= floor_key, whose upper end hi_key has weight w_hi,
    count c_hi and mass m_hi (E units) at or above it: (t, count and mass of the values with key
    >= t), t the largest key whose weight (counts, or fixed-point probabilities e / s2k:
    USE_PROB) reaches goal (at least one value of the interval). WAYS: 0, largest_key_reaching;
    else largest_key_fused's WAYS-way search (int32 counts)."""
    x, key = load_candidates(region_ptr, n, tl.maximum(lo_key, floor_key), hi_key, TILE)
    e = tl.where(key != KEY_NONE, tl.exp(x - m), 0.0)
    if USE_PROB:
        weight = tl.where(key != KEY_NONE, fixed_prob(tl.div_rn(e, s2k)), 0)
    elif WAYS > 0:
        weight = (key != KEY_NONE).to(tl.int32)
    else:
        weight = (key != KEY_NONE).to(tl.int64)
    if WAYS > 0:
        t = largest_key_fused(key, weight, tl.maximum(goal - w_hi, 1), lo_key, hi_key, WAYS)
    else:
        one = tl.zeros([1], tl.int64)
        t = tl.sum(largest_key_reaching(key, weight, one + tl.maximum(goal - w_hi, 1), one + lo_key, one + hi_key),
                   axis=0)
    above = key >= t
    count_t = c_hi + tl.sum(tl.sum(above.to(tl.int64), axis=1), axis=0)
    mass_t = m_hi + tl.sum(tl.sum(tl.where(above, fixed_mass(e), 0), axis=1), axis=0)
    return t, count_t, mass_t


@triton.jit
def _threshold_stage(goal, s2k, floor_key, p_key, p_count, p_mass, ok0, n0, g_lo, g_hi, ok_g, n_g, cand_row_ptr,
                     target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr, m,
                     V: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr, USE_PROB: tl.constexpr,
                     SEARCH_TILE: tl.constexpr):
    """The largest key t with weight(key >= max(t, floor_key)) >= goal, weight = counts (top-k)
    or fixed-point probabilities e / s2k (USE_PROB: top-p); returns (t, count and mass (E units)
    of the values with key >= t, path). Known points (already restricted to key >= floor_key)
    locate the interval holding t; it is searched where it was gathered (the top set, or the
    interval [g_lo, g_hi) the chunks gathered), else swept."""
    j, w_hi, reachable = _interval(p_count, p_mass, goal, s2k, USE_PROB)
    hi_key = _pick8(p_key, j)
    c_hi = _pick8(p_count, j)
    m_hi = _pick8(p_mass, j)
    lo_key = _pick8(p_key, j + 1)
    c_lo = _pick8(p_count, j + 1)
    m_lo = _pick8(p_mass, j + 1)
    region = tl.where((j == 0) & ok0, TOP_SET, tl.where((lo_key == g_lo) & (hi_key == g_hi) & ok_g, GATHERED, SWEPT))
    count = tl.where(region == TOP_SET, n0, n_g)
    if region == SWEPT:
        lo_key, c_lo, m_lo, hi_key, c_hi, w_hi, m_hi, count = refine_and_collect(
            target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, m, goal, lo_key, c_lo, m_lo, hi_key,
            c_hi, w_hi, m_hi, floor_key, s2k, cand_row_ptr + SWEPT * CAP, V, CAP, BLOCK_S, USE_PROB)
    gathered = count <= CAP  # else the refinement ended on a single key: it is the threshold
    region_ptr = cand_row_ptr + region * CAP
    n = tl.where(gathered, count, 0)
    # SEARCH_TILE (_triton_plan.FINISH_SEARCH_TILE): 0, the [1, CAP] tile's 4-way search of three
    # reductions a step; else the fused search, 8-way over a small tile of at most SEARCH_TILE
    # values (SEARCH_TILE / 256 a thread: each step's latency, not its instructions, bounds it), 4-way
    # over [1, CAP] (16 values a thread: the probes' compares bound it). A model from compiled code
    # (sm_90a: instructions and barriers a step), untimed.
    if SEARCH_TILE == 0:
        t, count_t, mass_t = _search_region(region_ptr, n, lo_key, hi_key, floor_key, goal, w_hi, c_hi, m_hi, m, s2k,
                                            CAP, USE_PROB, 0)
    elif n <= SEARCH_TILE:
        t, count_t, mass_t = _search_region(region_ptr, n, lo_key, hi_key, floor_key, goal, w_hi, c_hi, m_hi, m, s2k,
                                            SEARCH_TILE, USE_PROB, 8)
    else:
        t, count_t, mass_t = _search_region(region_ptr, n, lo_key, hi_key, floor_key, goal, w_hi, c_hi, m_hi, m, s2k,
                                            CAP, USE_PROB, 4)
    # goal beyond everything (rounding at top_p ~ 1): keep all; a single-key interval: that key
    last_key = _pick8(p_key, NUM_POINTS - 1)
    t = tl.where(reachable, tl.where(gathered, t, lo_key), last_key)
    count_t = tl.where(reachable, tl.where(gathered, count_t, c_lo), _pick8(p_count, NUM_POINTS - 1))
    mass_t = tl.where(reachable, tl.where(gathered, mass_t, m_lo), _pick8(p_mass, NUM_POINTS - 1))
    return t, count_t, mass_t, (1 << region) | tl.where(gathered, 0, SINGLE_KEY)


@triton.jit
def _min_p_stage(tkey, s2, min_p, covered, ok0, n0, tau0_key, cand_row_ptr, target_ptr, draft_ptr, t_off, d_off, t_lim,
                 d_lim, temp, pen, PENALTY: tl.constexpr, m, V: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr):
    """(mass (E units) of the kept values (key >= tkey) that min-p keeps too, or -1 when all of
    them do; path). min-p's test is monotone in x: when the largest value below the top set
    fails it (covered), whatever passes is in the gathered top set; otherwise one sweep."""
    in_top = covered & ok0
    x, key = load_candidates(cand_row_ptr + TOP_SET * CAP, tl.where(in_top, n0, 0), tl.maximum(tau0_key, tkey),
                             KEY_POS_INF, CAP)
    e = tl.where(key != KEY_NONE, tl.exp(x - m), 0.0)
    mass = tl.sum(tl.sum(tl.where((key != KEY_NONE) & passes_min_p(e, s2, min_p), fixed_mass(e), 0), axis=1), axis=0)
    path = tl.where(in_top, PATH_TOP_SET, PATH_SWEPT)
    if ~in_top:
        mass = sweep_min_p_mass(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, m, tkey, s2,
                                min_p, V, BLOCK_S)
    if passes_min_p(tl.exp(key_value(tkey) - m), s2, min_p) & (tkey > KEY_NEG_INF):
        mass = mass * 0 - 1
        path = 0
    return mass, path


@triton.jit
def _chunk_pass(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr, m, s, min_p, start,
                g_lo, g_hi, gather_on, minp_on, fill_ptr, dst_ptr, V: tl.constexpr, CHUNK: tl.constexpr,
                BLOCK_V: tl.constexpr, CAP: tl.constexpr):
    """This program's share of the row's second pass: gather x with g_lo <= key < g_hi into
    dst_ptr (fp32 [CAP], fill counter fill_ptr: integer atomics) when gather_on; return the
    fixed-point mass of the chunk's values that min-p alone keeps (minp_on)."""
    mass = tl.zeros([BLOCK_V], tl.int64)
    for v0 in range(0, CHUNK, BLOCK_V):
        idx = start + v0 + tl.arange(0, BLOCK_V)
        x = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp, pen, PENALTY)
        key = order_key(x)
        # gather_on as a block: Triton 3.9's interpreter types a scalar comparison int32 and then
        # refuses it in a mask ("mask has unsupported dtype"); the compiled code is the same
        on = (idx * 0 + gather_on.to(tl.int32)) != 0
        sel = on & (key >= g_lo) & (key < g_hi) & (idx < V)
        if tl.sum(sel.to(tl.int32), axis=0) > 0:
            slot = tl.atomic_add(fill_ptr + tl.zeros_like(idx), 1, mask=sel, sem="relaxed")
            tl.store(dst_ptr + slot, x, mask=sel & (slot < CAP))
        if minp_on:
            e = tl.exp(x - m)
            mass += tl.where((idx < V) & passes_min_p(e, s, min_p), fixed_mass(e), 0)
    return tl.sum(mass, axis=0)


@triton.jit
def _finish_selecting_row(r, c, target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr,
                          top_k, top_p, min_p, topk_on, topp_on, minp_on, use_rungs, needed, part_f_ptr, part_i_ptr,
                          cand_ptr, fill_ptr, rungs_ptr, minp_part_ptr, ticket_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr,
                          amax_ptr, paths_ptr, NCHUNK, NFCHUNK, V: tl.constexpr, CHUNK: tl.constexpr,
                          BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr,
                          FENCE: tl.constexpr, SEARCH_TILE: tl.constexpr):
    """Program (r, c) of a row with top-k, top-p or min-p: see the module docstring."""
    cand_row_ptr = cand_ptr + r.to(tl.int64) * (3 * CAP)
    fill_row_ptr = fill_ptr + r * 2
    m, s, amax, counts8, masses8 = merge_partials(part_f_ptr, part_i_ptr, r, NCHUNK, BLOCK_C, False)
    m = tl.where(needed, m, 0.0)  # positions never read: harmless numbers instead of -inf / 0
    s = tl.where(needed, s, 1.0)

    # Every program: where do the thresholds lie, and what must the chunks read again?
    rungs = tl.load(rungs_ptr + r * 8 + tl.arange(0, 8))
    n0 = tl.load(fill_row_ptr + TOP_SET)
    ok0 = n0 <= CAP
    # (rows with rungs know every point; the others need only tau0's mass, in the last program)
    p_key, p_count, p_mass = _known_points(rungs, counts8, masses8, m, s, n0, ok0, use_rungs, False, cand_row_ptr, V,
                                           CAP, SEARCH_TILE)
    # The one interval the chunks gather: top-k's (not small), else top-p's when alone.
    j_k, _, reach_k = _interval(p_count, p_mass, top_k.to(tl.int64), s, False)
    j_p, _, reach_p = _interval(p_count, p_mass, fixed_prob(top_p.to(tl.float64)), s, True)
    for_k = use_rungs & topk_on
    j_g = tl.where(for_k, j_k, j_p)
    g_hi = _pick8(p_key, j_g)
    g_lo = _pick8(p_key, j_g + 1)
    g_count = _pick8(p_count, j_g + 1) - _pick8(p_count, j_g)
    gather_on = use_rungs & (topk_on | topp_on) & tl.where(for_k, reach_k, reach_p) & ((j_g > 0) | ~ok0) \
        & (g_count <= CAP)
    # min-p: covered when the largest value below the top set fails it (then whatever passes
    # was gathered). min-p alone and not covered: summed by chunks.
    tau0_key = order_key(tl.max(tl.where(tl.arange(0, 8) == 0, rungs, NEG_INF), axis=0))
    covered = ~passes_min_p(tl.exp(key_value(tau0_key - 1) - m), s, min_p)
    minp_chunks = minp_on & ~topk_on & ~topp_on & (~ok0 | ~covered)
    if gather_on | minp_chunks:
        chunk_mass = _chunk_pass(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, m, s, min_p,
                                 c * CHUNK, g_lo, g_hi, gather_on, minp_chunks, fill_row_ptr + GATHERED,
                                 cand_row_ptr + GATHERED * CAP, V, CHUNK, BLOCK_V, CAP)
        tl.store(minp_part_ptr + r * NFCHUNK + c, chunk_mass)

    if last_program_of(ticket_ptr + r, NFCHUNK, FENCE):
        tkey = tl.sum(tl.zeros([1], tl.int64), axis=0) + KEY_NEG_INF
        s2 = s
        s3 = s
        paths = tl.sum(tl.zeros([1], tl.int32), axis=0)
        p_key, p_count, p_mass = _known_points(rungs, counts8, masses8, m, s, n0, ok0, use_rungs, True,
                                               cand_row_ptr, V, CAP, SEARCH_TILE)
        n_g = tl.load(fill_row_ptr + GATHERED, cache_modifier=".cg")
        ok_g = gather_on & (n_g <= CAP)
        # top-k: counts.
        t_k = tkey
        c_k = tl.sum(tl.zeros([1], tl.int64), axis=0) + V
        m_k = fixed_mass(s)
        if topk_on:
            t_k, c_k, m_k, path_k = _threshold_stage(
                top_k.to(tl.int64), s, KEY_NEG_INF, p_key, p_count, p_mass, ok0, n0, g_lo, g_hi, ok_g & for_k,
                n_g, cand_row_ptr, target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, m, V, CAP,
                BLOCK_S, False, SEARCH_TILE)
            paths = paths | path_k
        s2k = tl.where(topk_on, (m_k.to(tl.float64) / E_ONE).to(tl.float32), s)
        # top-p: fixed-point probabilities within the top-k set (known points below t_k become t_k).
        t_p = t_k
        m_p = m_k
        if topp_on:
            below = p_key <= t_k
            t_p, c_p, m_p, path_p = _threshold_stage(
                fixed_prob(top_p.to(tl.float64)), s2k, t_k, tl.where(below, t_k, p_key),
                tl.where(below, c_k, p_count), tl.where(below, m_k, p_mass), ok0, n0, g_lo, g_hi,
                ok_g & ~for_k & ~topk_on, n_g, cand_row_ptr, target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim,
                temp, pen, PENALTY, m, V, CAP, BLOCK_S, True, SEARCH_TILE)
            paths = paths | (path_p << 4)
        tkey = t_p
        s2 = tl.where(topk_on | topp_on, (m_p.to(tl.float64) / E_ONE).to(tl.float32), s)
        s3 = s2
        if minp_chunks:
            cs = tl.arange(0, BLOCK_C)
            chunk_masses = tl.load(minp_part_ptr + r * NFCHUNK + cs, mask=cs < NFCHUNK, other=0,
                                   cache_modifier=".cg")
            s3 = (tl.sum(chunk_masses, axis=0).to(tl.float64) / E_ONE).to(tl.float32)
            paths = paths | MIN_P_BY_CHUNKS
        elif minp_on:
            covered2 = ~passes_min_p(tl.exp(key_value(tau0_key - 1) - m), s2, min_p)  # judged with s2 now
            mass3, path_m = _min_p_stage(tkey, s2, min_p, covered2, ok0, n0, tau0_key, cand_row_ptr, target_ptr,
                                         draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, m, V, CAP, BLOCK_S)
            s3 = tl.where(mass3 >= 0, (mass3.to(tl.float64) / E_ONE).to(tl.float32), s2)
            paths = paths | (path_m << 8)
        tl.store(m_ptr + r, m)
        tl.store(s2_ptr + r, s2)
        tl.store(s3_ptr + r, s3)
        tl.store(tkey_ptr + r, tkey)
        tl.store(amax_ptr + r, vocab_index(amax, V))
        tl.store(paths_ptr + r, paths)
        # the row's candidate counters back to zero (every program has made its last use of them):
        # what a persistent workspace needs instead of a zero fill (kernels/_workspace.py)
        tl.store(fill_row_ptr + tl.arange(0, 2), tl.zeros([2], tl.int32))


@triton.jit
def select_finish_kernel(
    target_ptr, draft_ptr, tokens_ptr,  # logits [B, K+1, V], [B, K, V] (target again when absent); drafts int [B, K]
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # [B]: fp32, int32, fp32, fp32
    part_f_ptr, part_i_ptr,  # [R, NCHUNK, 8] chunk partials (_triton_select_stream.py)
    cand_ptr, fill_ptr, rungs_ptr,  # fp32 [R, 3, CAP] candidates; int32 [R, 2] fills; fp32 [R, 8] rungs
    minp_part_ptr, ticket_ptr,  # int64 [R, NFCHUNK] min-p chunk masses; int32 [R] tickets (zeroed)
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, paths_ptr,  # [R] outputs: fp32 x3, int64, int32, int32 (diagnostics)
    NPOS, NCHUNK, NFCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr, FENCE: tl.constexpr,
    SEARCH_TILE: tl.constexpr = 0,
):
    """grid (R, NFCHUNK): see the module docstring. NCHUNK: the streaming launch's chunks (its
    partials); CHUNK / NFCHUNK: this launch's. No penalties."""
    _select_finish(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_f_ptr,
                   part_i_ptr, cand_ptr, fill_ptr, rungs_ptr, minp_part_ptr, ticket_ptr, m_ptr, s2_ptr, s3_ptr,
                   tkey_ptr, amax_ptr, paths_ptr, NPOS, NCHUNK, NFCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
                   (tokens_ptr,), False, V, K, CHUNK, BLOCK_V, BLOCK_K, BLOCK_C, CAP, BLOCK_S, FENCE, SEARCH_TILE)


@triton.jit
def select_finish_penalised_kernel(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_f_ptr, part_i_ptr,
    cand_ptr, fill_ptr, rungs_ptr, minp_part_ptr, ticket_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, paths_ptr,
    NPOS, NCHUNK, NFCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
    counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb, s_pk,  # penalties
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr, FENCE: tl.constexpr,
    W: tl.constexpr, P0: tl.constexpr, SEARCH_TILE: tl.constexpr = 0,
):
    """select_finish_kernel with penalties (the arguments of select_stream_penalised_kernel)."""
    _select_finish(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_f_ptr,
                   part_i_ptr, cand_ptr, fill_ptr, rungs_ptr, minp_part_ptr, ticket_ptr, m_ptr, s2_ptr, s3_ptr,
                   tkey_ptr, amax_ptr, paths_ptr, NPOS, NCHUNK, NFCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
                   (W, P0, counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb, s_pk),
                   True, V, K, CHUNK, BLOCK_V, BLOCK_K, BLOCK_C, CAP, BLOCK_S, FENCE, SEARCH_TILE)


@triton.jit
def _select_finish(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_f_ptr, part_i_ptr,
    cand_ptr, fill_ptr, rungs_ptr, minp_part_ptr, ticket_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, paths_ptr,
    NPOS, NCHUNK, NFCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k, pen_args, PENALTY: tl.constexpr,
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr, FENCE: tl.constexpr, SEARCH_TILE: tl.constexpr,
):
    """The finishing launch's program (r, c); pen_args: the penalties or (False,)."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    b = r // NPOS
    kb = num_drafts_of_row(tokens_ptr, b, sx_b, sx_k, K, BLOCK_K)
    t_off, d_off, t_lim, d_lim = row_source(r, NPOS, kb, st_b, st_k, sd_b, sd_k, V, K)
    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    top_p = tl.load(top_p_ptr + b)
    min_p = tl.load(min_p_ptr + b)
    temp = tl.where(t > 0, t, 1.0)
    needed = t_lim + d_lim > 0
    topk_on, topp_on, minp_on = sampling_modes(t, top_k, top_p, min_p, needed, V)
    selecting, use_rungs = candidate_plan(topk_on, topp_on, minp_on, top_k, CAP)
    pen = pen_args
    if PENALTY:
        pen = row_penalty(pen_args, b, position_of(r, NPOS, K))
    if selecting:  # rows without top-k / top-p / min-p were finished by the streaming launch
        _finish_selecting_row(
            r, c, target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, top_k, top_p, min_p, topk_on,
            topp_on, minp_on, use_rungs, needed, part_f_ptr, part_i_ptr, cand_ptr, fill_ptr, rungs_ptr, minp_part_ptr,
            ticket_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, paths_ptr, NCHUNK, NFCHUNK, V, CHUNK, BLOCK_V,
            BLOCK_C, CAP, BLOCK_S, FENCE, SEARCH_TILE)
