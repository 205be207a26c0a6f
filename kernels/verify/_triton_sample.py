"""Where to look before looking: per-row thresholds ("rungs") placed from a small sample of the
row, so that the one streaming pass of the large-vocab selection (_triton_select_stream.py) can
already gather the values a small top-k / top-p / min-p depends on (the top set), and count
the exact count and mass at a few deeper rungs that locate any other threshold.

Every program of a row computes the same sample and the same rungs (same data, same code), so
all chunks of a row gather and count against the same bounds without any communication. The
sample only steers performance: the finishing kernel checks with exact counts and masses
which interval holds each threshold (a mis-placed rung costs time, never exactness).

NUM_RUNGS = 6 rungs per row, in decreasing order (values of x; [8] vectors, the last two +inf):
    rung 0    tau0, the top set: every x >= tau0 is gathered (aimed at ~8 k values for a top-k
              of at most CAP / 16, CAP / 4 otherwise, and below min-p's threshold
              m + log(min_p) when that fits)
    rung 1-5  about 1.8, 3, 4.3, 6, 8.4 times as many values above them as tau0: a ladder whose
              exact counts / masses (streamed) put a deeper threshold (top-p on a flat row, a
              larger top-k) in an interval of at most ~CAP values down to ~2 CAP values above
              it, which the finishing kernel's chunks then gather
"""
import triton
import triton.language as tl

from ._triton_common import NEG_INF, load_x_row

NUM_RUNGS = tl.constexpr(6)


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
def sample_rungs(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr, top_k, min_p,
                 minp_on, small_topk, V: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr,
                 SAMPLE_RUN: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr):
    """Rungs [8] fp32 of one row, decreasing (see the module docstring; slots 6, 7: +inf).

    The sample: SAMPLE values read as SAMPLE // SAMPLE_RUN runs of SAMPLE_RUN neighbours spread
    evenly over the vocab (coalesced reads; an LLM vocabulary's index order is not random).
    Candidate thresholds: the maxima of G = SAMPLE / GROUP groups of GROUP sample values taken
    across the runs; for each, the number of sample values at or above it, from [G, SUB]
    compares over SUB sample values at a time (no sort; few registers). A group maximum with
    n sample values at or above it is at most the sample's n-th largest, so rungs err towards
    more values above them.
    """
    NUM_RUNS: tl.constexpr = SAMPLE // SAMPLE_RUN
    G: tl.constexpr = SAMPLE // GROUP
    i = tl.arange(0, SAMPLE)
    pos = tl.minimum((i // SAMPLE_RUN) * (V // NUM_RUNS) + i % SAMPLE_RUN, V - 1)
    ys = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, pos, temp, pen, PENALTY)
    g = tl.max(tl.reshape(ys, [GROUP, G]), axis=0)  # group j: sample values j, j + G, ...
    counts = tl.zeros([G], tl.int32)
    for s0 in range(0, SAMPLE, SUB):
        j = s0 + tl.arange(0, SUB)
        y = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim,
                       tl.minimum((j // SAMPLE_RUN) * (V // NUM_RUNS) + j % SAMPLE_RUN, V - 1), temp, pen, PENALTY)
        counts += tl.sum((y[None, :] >= g[:, None]).to(tl.int32), axis=1)

    # The top set: ~8 k values for a small top-k (a miss needs ~8x fewer row values above the
    # sample's matching value than expected: rare), CAP / 4 otherwise.
    want = tl.where(small_topk, tl.maximum(top_k * 8, CAP // 8), CAP // 4)
    n0 = _sample_count_for(want, V, SAMPLE)
    tau0 = _highest_with_count(g, counts, n0)
    # min-p keeps x >= m + log(min_p) (up to rounding) and m >= the sample max: gather from
    # below that when it fits.
    minp_threshold = tl.max(g, axis=0) + tl.log(tl.maximum(min_p, 1e-30)) - 0.01
    in_reach = (tl.sum((ys >= minp_threshold).to(tl.int32), axis=0) + 1) * V <= (CAP // 2) * SAMPLE
    tau0 = tl.where(minp_on & in_reach, tl.minimum(tau0, minp_threshold), tau0)
    # The ladder (sample counts n0 x 1.8, 3, 4.3, 6, 8.4): each interval between rungs holds
    # about 0.4 of the values above it, under CAP down to ~8 CAP / 4 with room for the sample's
    # noise (measured on N(0, 3^2) rows of 128256: a top-p of 0.9 lands in a gathered interval
    # for 23 of 24 rows at 4 x 1.4 steps, 47 of 48 here).
    r = tl.arange(0, 8)
    want_n = tl.where(r == 1, (9 * n0) // 5, tl.where(r == 2, 3 * n0, tl.where(r == 3, (43 * n0) // 10, tl.where(
        r == 4, 6 * n0, (42 * n0) // 5))))
    rungs = tl.max(tl.where(counts[None, :] >= tl.minimum(want_n, SAMPLE)[:, None], g[None, :], NEG_INF), axis=1)
    rungs = tl.where(r == 0, tau0, rungs)
    # decreasing (each at most the one above it), the two spare slots +inf
    rungs = tl.min(tl.where(r[None, :] <= r[:, None], rungs[None, :], float("inf")), axis=1)
    return tl.where(r < 6, rungs, float("inf"))
