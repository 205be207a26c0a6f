"""Where to look before looking: per-row thresholds chosen from a small sample of the row, so
that the one streaming pass of the large-vocab selection kernel can already gather the few
values the exact thresholds depend on (candidate collection).

Every program of a row computes the same sample and the same thresholds (same data, same
code), so all chunks of a row gather against the same bounds without any communication.
The sample only steers performance: the finishing step checks with exact counts and masses
whether the gathered values decide the thresholds, and falls back to exact sweeps over the
row when they do not (a mis-predicted sample costs time, never exactness).

Four "rungs" per row, in decreasing order (values of x):
    tau0      the top set: every x >= tau0 is gathered (aimed at ~8 k values for top-k,
              CAP / 4 otherwise, and below min-p's threshold m + log(min_p) when that fits)
    th_hi     upper end of the predicted bracket: x in [th_lo, th_hi) is gathered too, for
    th_lo     thresholds predicted below the top set (top-p on a flat row, top-k > CAP / 4)
    th_floor  a deeper rung: its exact count and mass narrow the fallback's first interval
"""
import triton
import triton.language as tl

from ._triton_common import NEG_INF, load_x_row


@triton.jit
def _highest_with_count(values, counts, n):
    """The largest of the candidate thresholds values [G] that have at least n sample values at
    or above them (counts [G]); -inf when none has."""
    return tl.max(tl.where(counts >= n, values, NEG_INF), axis=0)


@triton.jit
def _sample_count_for(row_count, V: tl.constexpr, SAMPLE: tl.constexpr):
    """How many sample values lie above a threshold with about row_count row values above it."""
    return tl.minimum(tl.maximum((row_count * SAMPLE + V - 1) // V, 1), SAMPLE)


@triton.jit
def sample_rungs(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, top_k, top_p, min_p,
                 topk_on, topp_on, minp_on, small_topk,
                 V: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr, SAMPLE_RUN: tl.constexpr,
                 GROUP: tl.constexpr, SUB: tl.constexpr):
    """(tau0, th_hi, th_lo, th_floor) fp32 for one row (scalars; see the module docstring).

    The sample: SAMPLE values read as SAMPLE // SAMPLE_RUN runs of SAMPLE_RUN neighbours spread
    evenly over the vocab (coalesced reads; an LLM vocabulary's index order is not random).
    Candidate thresholds: the maxima of G = SAMPLE / GROUP groups of GROUP sample values taken
    across the runs; for each, the sample count and mass at or above it, from [G, SUB] compares
    over SUB sample values at a time (no sort; few registers). A group maximum with n sample
    values at or above it is at most the sample's n-th largest, so rungs err towards more
    candidates.
    """
    NUM_RUNS: tl.constexpr = SAMPLE // SAMPLE_RUN
    G: tl.constexpr = SAMPLE // GROUP
    i = tl.arange(0, SAMPLE)
    pos = tl.minimum((i // SAMPLE_RUN) * (V // NUM_RUNS) + i % SAMPLE_RUN, V - 1)
    ys = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, pos, temp)
    g = tl.max(tl.reshape(ys, [GROUP, G]), axis=0)  # group j: sample values j, j + G, ...
    y0 = tl.max(g, axis=0)
    total = tl.sum(tl.where(ys > NEG_INF, tl.exp(ys - y0), 0.0), axis=0)
    counts = tl.zeros([G], tl.int32)
    masses = tl.zeros([G], tl.float32)
    for s0 in range(0, SAMPLE, SUB):
        j = s0 + tl.arange(0, SUB)
        y = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim,
                       tl.minimum((j // SAMPLE_RUN) * (V // NUM_RUNS) + j % SAMPLE_RUN, V - 1), temp)
        at_or_above = y[None, :] >= g[:, None]  # [G, SUB]
        counts += tl.sum(at_or_above.to(tl.int32), axis=1)
        masses += tl.sum(tl.where(at_or_above & (y[None, :] > NEG_INF), tl.exp(y[None, :] - y0), 0.0), axis=1)

    # The top set: ~8 k values for a small top-k (a miss needs ~8x fewer row values above the
    # sample's matching value than expected: rare), CAP / 4 otherwise.
    want = tl.where(small_topk, tl.minimum(tl.maximum(top_k * 8, CAP // 8), (CAP * 3) // 4), CAP // 4)
    n0 = _sample_count_for(want, V, SAMPLE)
    tau0 = _highest_with_count(g, counts, n0)
    # min-p keeps x >= m + log(min_p) (up to rounding) and m >= y0: gather from below that.
    minp_threshold = y0 + tl.log(tl.maximum(min_p, 1e-30)) - 0.01
    in_reach = (tl.sum((ys >= minp_threshold).to(tl.int32), axis=0) + 1) * V <= (CAP // 2) * SAMPLE
    tau0 = tl.where(minp_on & in_reach, tl.minimum(tau0, minp_threshold), tau0)

    # A bracket around the predicted threshold when it lies below the top set: top-p from the
    # sample's own mass profile (good on flat rows, where the top set cannot hold the kept
    # set), or a large top-k from its rank.
    n_p = tl.min(tl.where(masses >= top_p * total, counts, SAMPLE), axis=0)
    n_k = _sample_count_for(top_k, V, SAMPLE)
    for_p = topp_on & ~small_topk
    for_k = topk_on & ~small_topk & ~topp_on
    n_b = tl.where(for_p, n_p, n_k)
    half = tl.where(for_p, (n_b * 9) // 20 + 2, tl.sqrt(n_k.to(tl.float32)).to(tl.int32) * 3 + 2)
    half = tl.maximum(tl.minimum(half, ((CAP * 3) // 8) * SAMPLE // V), 1)
    bracket = (for_p | for_k) & (n_b > n0)
    n_hi = tl.maximum(n_b - half, 1)
    n_lo = tl.minimum(n_b + half, SAMPLE)
    th_hi = tl.where(bracket, tl.minimum(_highest_with_count(g, counts, n_hi), tau0), tau0)
    th_lo = tl.where(bracket, tl.minimum(_highest_with_count(g, counts, n_lo), th_hi), tau0)
    n_floor = tl.minimum(4 * (tl.maximum(tl.where(bracket, n_lo, n0), n0) + 2), SAMPLE)
    th_floor = tl.minimum(_highest_with_count(g, counts, n_floor), th_lo)
    return tau0, th_hi, th_lo, th_floor
