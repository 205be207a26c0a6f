"""Launch 2 of the verify step for large vocabularies: for each distribution, merge the chunk
partials of _triton_select_stream.py and settle the top-k / top-p / min-p thresholds exactly.
Glossary: _triton_common.py.

grid (R,), one distribution per program. Each threshold is the largest key reaching a goal
(_triton_search.py: a count for top-k, a fixed-point probability mass for top-p, within the
top-k set). The exact counts and masses at the known points +inf, the four rungs and -inf
locate the interval [point j+1, point j) that holds it:
  - the top set (j = 0) or the bracket (j = 2), already gathered: searched in registers;
  - any other interval, or a gathered region that overflowed CAP: exact sweeps over the row by
    this program (_triton_sweeps.py) halve it until it holds at most CAP values, gather it and
    search it (the slow path: a sampled bound missed; 1 + log2(count / CAP) passes or so).
min-p is a threshold too (its test is monotone in x): either everything kept passes, or its
own interval is searched the same way, or one sweep sums it.
"""
import triton
import triton.language as tl

from ._triton_common import (BIG_INDEX, E_ONE, KEY_NEG_INF, KEY_NONE, KEY_POS_INF, NEG_INF, fixed_mass, fixed_prob,
                             key_value, num_drafts_of_row, order_key, passes_min_p, row_source, sampling_modes)
from ._triton_search import largest_key_reaching, load_candidates
from ._triton_select_stream import BRACKET, SWEPT, TOP_SET, candidate_plan
from ._triton_sweeps import refine_and_collect, sweep_min_p_mass

NUM_POINTS = tl.constexpr(8)  # known points: +inf, tau0, th_hi, th_lo, th_floor, -inf (x3)
# Diagnostics (paths_ptr, one int32 per distribution): 1 << region per stage, shifted by
# 0 (top-k), 4 (top-p), 8 (min-p); SINGLE_KEY: a refinement ended on one key holding the threshold.
SINGLE_KEY = tl.constexpr(8)


@triton.jit
def _merge_partials(part_f_ptr, part_i_ptr, r, NCHUNK, BLOCK_C: tl.constexpr):
    """Merge the chunk partials of row r (a fixed reduction order: deterministic): (m, s, amax,
    rung counts int64 [4], rung masses fp32 [4] relative to m). part_f: fp32 [R, NCHUNK, 8] =
    (m, s, mass x4, -, -); part_i: int32 [R, NCHUNK, 8] = (argmax, count x4, -, -, -)."""
    c = tl.arange(0, BLOCK_C)[:, None]
    f = tl.arange(0, 8)[None, :]
    at = (r * NCHUNK + c) * 8 + f
    live = c < NCHUNK
    pf = tl.load(part_f_ptr + at, mask=live, other=0.0)
    pi = tl.load(part_i_ptr + at, mask=live, other=0)
    cm = tl.where(live, tl.sum(tl.where(f == 0, pf, 0.0), axis=1)[:, None], NEG_INF)  # [BLOCK_C, 1]
    m = tl.max(tl.max(cm, axis=1), axis=0)
    scale = tl.where(cm > NEG_INF, tl.exp(cm - m), 0.0)  # [BLOCK_C, 1]
    s = tl.sum(tl.sum(tl.where(f == 1, pf * scale, 0.0), axis=1), axis=0)
    args = tl.sum(tl.where(f == 0, pi, 0), axis=1)[:, None]
    amax = tl.min(tl.min(tl.where(live & (cm == m), args, BIG_INDEX), axis=1), axis=0)
    # rung j sits in column j + 2 (masses) / j + 1 (counts): shift them to columns 0..3
    masses = tl.sum(tl.where((f >= 2) & (f < 6), pf * scale, 0.0), axis=0)  # [8], rung j at j + 2
    counts = tl.sum(tl.where((f >= 1) & (f < 5), pi, 0), axis=0).to(tl.int64)  # [8], rung j at j + 1
    j = tl.arange(0, 4)[:, None]
    masses4 = tl.sum(tl.where(f == j + 2, masses[None, :], 0.0), axis=1)
    counts4 = tl.sum(tl.where(f == j + 1, counts[None, :], 0), axis=1)
    return m, s, amax, counts4, masses4


@triton.jit
def _pick8(values, j):
    """values[j] of a [NUM_POINTS] tensor (j a scalar)."""
    return tl.sum(tl.where(tl.arange(0, NUM_POINTS) == j, values, 0), axis=0)


@triton.jit
def _threshold_stage(goal, s2k, floor_key, p_key, p_count, p_mass, region_ok0, region_ok1, n0, n1,
                     cand_row_ptr, target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, m,
                     V: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr, USE_PROB: tl.constexpr):
    """The largest key t with weight(key >= max(t, floor_key)) >= goal, weight = counts (top-k)
    or fixed-point probabilities e / s2k (USE_PROB: top-p); returns (t, count and mass (E units) of the
    values with key >= t, path: 1 << region used, | SINGLE_KEY when the interval was one key). Known points p_key / p_count / p_mass [8] (decreasing keys, values
    already restricted to key >= floor_key) locate the interval [p_key[j+1], p_key[j]) holding t;
    it is searched in its gathered region (top set: j = 0, bracket: j = 2) or swept."""
    if USE_PROB:
        p_weight = fixed_prob(p_mass.to(tl.float64) / (s2k.to(tl.float64) * E_ONE))
    else:
        p_weight = p_count
    j = tl.maximum(tl.sum((p_weight < goal).to(tl.int32), axis=0) - 1, 0)
    reachable = j < NUM_POINTS - 1
    j = tl.minimum(j, NUM_POINTS - 2)
    hi_key = _pick8(p_key, j)
    c_hi = _pick8(p_count, j)
    w_hi = _pick8(p_weight, j)
    m_hi = _pick8(p_mass, j)
    lo_key = _pick8(p_key, j + 1)
    c_lo = _pick8(p_count, j + 1)
    m_lo = _pick8(p_mass, j + 1)
    region = tl.where((j == 0) & region_ok0, TOP_SET, tl.where((j == 2) & region_ok1, BRACKET, SWEPT))
    count = tl.where(region == TOP_SET, n0, n1)
    if region == SWEPT:
        lo_key, c_lo, m_lo, hi_key, c_hi, w_hi, m_hi, count = refine_and_collect(
            target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, m, goal, lo_key, c_lo, m_lo, hi_key, c_hi, w_hi,
            m_hi, floor_key, s2k, cand_row_ptr + SWEPT * CAP, V, CAP, BLOCK_S, USE_PROB)
    gathered = count <= CAP  # else the refinement ended on a single key: it is the threshold
    x, key = load_candidates(cand_row_ptr + region * CAP, tl.where(gathered, count, 0),
                             tl.maximum(lo_key, floor_key), hi_key, CAP)
    e = tl.where(key != KEY_NONE, tl.exp(x - m), 0.0)
    if USE_PROB:
        weight = tl.where(key != KEY_NONE, fixed_prob(tl.div_rn(e, s2k)), 0)
    else:
        weight = (key != KEY_NONE).to(tl.int64)
    one = tl.zeros([1], tl.int64)
    t = tl.sum(largest_key_reaching(key, weight, one + tl.maximum(goal - w_hi, 1), one + lo_key, one + hi_key), axis=0)
    above = key >= t
    count_t = c_hi + tl.sum(tl.sum(above.to(tl.int64), axis=1), axis=0)
    mass_t = m_hi + tl.sum(tl.sum(tl.where(above, fixed_mass(e), 0), axis=1), axis=0)
    # goal beyond everything (rounding at top_p ~ 1): keep all; a single-key interval: that key
    last_key = _pick8(p_key, NUM_POINTS - 1)
    t = tl.where(reachable, tl.where(gathered, t, lo_key), last_key)
    count_t = tl.where(reachable, tl.where(gathered, count_t, c_lo), _pick8(p_count, NUM_POINTS - 1))
    mass_t = tl.where(reachable, tl.where(gathered, mass_t, m_lo), _pick8(p_mass, NUM_POINTS - 1))
    path = (1 << region) | tl.where(gathered, 0, SINGLE_KEY)
    return t, count_t, mass_t, path


@triton.jit
def _min_p_stage(tkey, s2, min_p, p_key, p_mass, region_ok0, region_ok1, n0, n1, cand_row_ptr,
                 target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, m,
                 V: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr):
    """Mass (E units) of the kept values (key >= tkey) that min-p keeps too. min-p's test is
    monotone in x: if the smallest kept key passes, everything kept does; otherwise its own
    threshold lies between two known points, above tkey."""
    passes = passes_min_p(tl.exp(key_value(p_key) - m), s2, min_p) & (p_key > KEY_NEG_INF)
    passes = passes | (p_key == KEY_POS_INF)
    j = tl.maximum(tl.sum(passes.to(tl.int32), axis=0) - 1, 0)  # last known point that passes
    region = tl.where((j == 0) & region_ok0, TOP_SET, tl.where((j == 2) & region_ok1, BRACKET, SWEPT))
    count = tl.where(region == TOP_SET, n0, n1)
    x, key = load_candidates(cand_row_ptr + region * CAP, tl.where(region == SWEPT, 0, count),
                             tl.maximum(_pick8(p_key, j + 1), tkey), _pick8(p_key, j), CAP)
    e = tl.where(key != KEY_NONE, tl.exp(x - m), 0.0)
    mass = _pick8(p_mass, j) + tl.sum(tl.sum(tl.where((key != KEY_NONE) & passes_min_p(e, s2, min_p), fixed_mass(e), 0),
                                             axis=1), axis=0)
    if region == SWEPT:
        mass = sweep_min_p_mass(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, m, tkey, s2, min_p, V, BLOCK_S)
    path = 1 << region
    if passes_min_p(tl.exp(key_value(tkey) - m), s2, min_p) & (tkey > KEY_NEG_INF):
        mass = mass * 0 - 1  # everything kept passes: the caller keeps s2
        path = 0
    return mass, path


@triton.jit
def select_finish_kernel(
    target_ptr, draft_ptr, tokens_ptr,  # logits [B, K+1, V], [B, K, V] (target again when absent); drafts int [B, K]
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # [B]: fp32, int32, fp32, fp32
    part_f_ptr, part_i_ptr,  # [R, NCHUNK, 8] chunk partials (_triton_select_stream.py)
    cand_ptr, fill_ptr, rungs_ptr,  # fp32 [R, 3, CAP] candidates; int32 [R, 2] fills; fp32 [R, 4] rungs
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, paths_ptr,  # [R] outputs: fp32 x3, int64, int32, int32 (diagnostics)
    NPOS, NCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
    V: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr, CAP: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """grid (R,): merge the chunk partials of distribution r and settle its thresholds exactly."""
    r = tl.program_id(0)
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
    _, use_rungs = candidate_plan(topk_on, topp_on, minp_on, top_k, CAP)
    cand_row_ptr = cand_ptr + r.to(tl.int64) * (3 * CAP)
    fill_row_ptr = fill_ptr + r * 2
    m, s, amax, counts4, masses4 = _merge_partials(part_f_ptr, part_i_ptr, r, NCHUNK, BLOCK_C)
    m = tl.where(needed, m, 0.0)  # positions never read: harmless numbers instead of -inf / 0
    s = tl.where(needed, s, 1.0)
    tkey = tl.sum(tl.zeros([1], tl.int64), axis=0) + KEY_NEG_INF
    s2 = s
    s3 = s
    paths = tl.sum(tl.zeros([1], tl.int32), axis=0)
    if topk_on | topp_on | minp_on:
        rungs = tl.load(rungs_ptr + r * 4 + tl.arange(0, 4))
        fill = tl.load(fill_row_ptr + tl.arange(0, 2))
        n0 = tl.sum(tl.where(tl.arange(0, 2) == TOP_SET, fill, 0), axis=0)
        n1 = tl.sum(tl.where(tl.arange(0, 2) == BRACKET, fill, 0), axis=0)
        ok0 = n0 <= CAP
        # Known points: +inf, the rungs (exact counts / masses: streamed, or for rows that only
        # gathered the top set, summed from it), -inf (everything).
        jp = tl.arange(0, NUM_POINTS)
        rung_vals = tl.sum(tl.where(jp[:, None] == tl.arange(0, 4)[None, :] + 1, rungs[None, :], 0.0), axis=1)
        rung_counts = tl.sum(tl.where(jp[:, None] == tl.arange(0, 4)[None, :] + 1, counts4[None, :], 0), axis=1)
        rung_masses = tl.sum(tl.where(jp[:, None] == tl.arange(0, 4)[None, :] + 1,
                                      fixed_mass(masses4)[None, :], 0), axis=1)
        tau0 = tl.max(tl.where(tl.arange(0, 4) == 0, rungs, NEG_INF), axis=0)
        x0, key0 = load_candidates(cand_row_ptr + TOP_SET * CAP, tl.where(ok0 & ~use_rungs, n0, 0), order_key(tau0),
                                   KEY_POS_INF, CAP)
        top_mass = tl.sum(tl.sum(tl.where(key0 != KEY_NONE, fixed_mass(tl.exp(x0 - m)), 0), axis=1), axis=0)
        inner = (jp >= 1) & (jp <= 4)
        known = use_rungs | ok0  # without rungs only tau0 is known, and only when its set fits
        p_key = tl.where(jp == 0, KEY_POS_INF, tl.where(inner & known, order_key(rung_vals), KEY_NEG_INF))
        p_key = tl.where(inner & known & ~use_rungs, order_key(tau0), p_key)
        p_count = tl.where(jp == 0, 0, tl.where(inner & known, tl.where(use_rungs, rung_counts, n0.to(tl.int64)), V))
        p_mass = tl.where(jp == 0, 0, tl.where(inner & known, tl.where(use_rungs, rung_masses, top_mass), fixed_mass(s)))
        ok1 = use_rungs & (n1 <= CAP) & (_pick8(p_key, 3) < _pick8(p_key, 2))

        # top-k: counts.
        t_k = tkey
        c_k = tl.sum(tl.zeros([1], tl.int64), axis=0) + V
        m_k = fixed_mass(s)
        if topk_on:
            t_k, c_k, m_k, path_k = _threshold_stage(top_k.to(tl.int64), s, KEY_NEG_INF, p_key, p_count, p_mass,
                                             ok0, ok1, n0, n1, cand_row_ptr, target_ptr, draft_ptr, t_off, d_off,
                                             t_lim, d_lim, temp, m, V, CAP, BLOCK_S, False)
            paths = paths | path_k
        s2k = tl.where(topk_on, (m_k.to(tl.float64) / E_ONE).to(tl.float32), s)
        # top-p: fixed-point probabilities within the top-k set (known points below t_k become t_k).
        t_p = t_k
        m_p = m_k
        if topp_on:
            below = p_key <= t_k
            pk = tl.where(below, t_k, p_key)
            pc = tl.where(below, c_k, p_count)
            pm = tl.where(below, m_k, p_mass)
            t_p, c_p, m_p, path_p = _threshold_stage(fixed_prob(top_p.to(tl.float64)), s2k, t_k, pk, pc, pm, ok0, ok1,
                                             n0, n1, cand_row_ptr, target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim,
                                             temp, m, V, CAP, BLOCK_S, True)
            paths = paths | (path_p << 4)
        tkey = t_p
        s2 = tl.where(topk_on | topp_on, (m_p.to(tl.float64) / E_ONE).to(tl.float32), s)
        s3 = s2
        if minp_on:
            mass3, path_m = _min_p_stage(tkey, s2, min_p, p_key, p_mass, ok0, ok1, n0, n1, cand_row_ptr, target_ptr, draft_ptr,
                                 t_off, d_off, t_lim, d_lim, temp, m, V, CAP, BLOCK_S)
            s3 = tl.where(mass3 >= 0, (mass3.to(tl.float64) / E_ONE).to(tl.float32), s2)
            paths = paths | (path_m << 8)
    tl.store(m_ptr + r, m)
    tl.store(s2_ptr + r, s2)
    tl.store(s3_ptr + r, s3)
    tl.store(tkey_ptr + r, tkey)
    tl.store(amax_ptr + r, amax)
    tl.store(paths_ptr + r, paths)


