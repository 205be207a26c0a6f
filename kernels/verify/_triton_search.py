"""Exact threshold search on a tile of candidate values held in registers (the finishing step
of the selection kernels in _triton_select_small.py / _triton_select_stream.py).

top-k and top-p are the same question asked with different weights:
    top-k: the k-th largest key       = the largest t with count(key >= t) >= k
    top-p: the smallest kept key      = the largest t with mass(key >= t) >= top_p
           (kept iff the mass strictly above is < top_p, transformers' tie rule: a whole tie
           group is kept or removed together, because keys compare equal)
so one search serves both: weights 1 (counts) or fixed-point probabilities (P_ONE units).
"""
import triton
import triton.language as tl

from ._triton_common import KEY_NONE, NEG_INF, order_key


@triton.jit
def largest_key_reaching(keys, weights, goal, lo, hi):
    """Per row of keys / weights [R, C] (int64; weight 0 in empty slots) and goal / lo / hi [R]
    (int64): the largest integer t in [lo, hi) with sum(weights[keys >= t]) >= goal, given that
    the sum at lo reaches goal (otherwise the answer is lo) and the sum at hi does not.
    A 4-way search: 3 probes per step, about 17 steps over the 33-bit key range (each step one
    fused reduction over the tile; fewer steps than bisection, same result). The range is first
    cut to the keys present (the sums are constant outside them)."""
    present = keys > KEY_NONE
    lo = tl.maximum(lo, tl.min(tl.where(present, keys, lo[:, None]), axis=1))
    hi = tl.minimum(hi, tl.maximum(tl.max(tl.where(present, keys, lo[:, None]), axis=1), lo) + 1)
    while tl.max(hi - lo, axis=0) > 1:
        width = hi - lo
        q1 = lo + width // 4
        q2 = lo + width // 2
        q3 = lo + (3 * width) // 4
        ok1 = tl.sum(tl.where(keys >= q1[:, None], weights, 0), axis=1) >= goal
        ok2 = tl.sum(tl.where(keys >= q2[:, None], weights, 0), axis=1) >= goal
        ok3 = tl.sum(tl.where(keys >= q3[:, None], weights, 0), axis=1) >= goal
        # The sums fall as t grows, so the probes that reach goal are a prefix of q1 <= q2 <= q3.
        new_lo = tl.where(ok3, q3, tl.where(ok2, q2, tl.where(ok1, q1, lo)))
        new_hi = tl.where(~ok1, q1, tl.where(~ok2, q2, tl.where(~ok3, q3, hi)))
        busy = width > 1
        lo = tl.where(busy, new_lo, lo)
        hi = tl.where(busy, new_hi, hi)
    return lo


@triton.jit
def largest_key_fused(keys, weights, goal, lo, hi, WAYS: tl.constexpr):
    """largest_key_reaching for one row, in fewer instructions and barriers: keys [1, C] (int64
    order keys, KEY_NONE in empty slots), weights [1, C] (int32 counts or int64 fixed-point
    probabilities; 0 in empty slots); goal, lo, hi int64 scalars -> the same t (int64 scalar):
    the largest integer t in [lo, hi) with sum(weights[keys >= t]) >= goal, lo when none.
    A WAYS-way search (a power of 2): the probes q_j = lo + j * width / WAYS (j = 1 .. WAYS - 1)
    of a step are one [WAYS, C] reduction (one round of shuffles and barriers a step; the
    compiled largest_key_reaching held three, 9 barriers), on int32 keys (every order key,
    KEY_NONE included, fits: one compare a value instead of two), so int32 counts reduce with one
    warp instruction (sm_90 REDUX). The probes that reach goal are a prefix (the sums fall as t
    grows): n of them move lo to q_n and hi to q_{n+1} (q_0 = lo, q_WAYS = hi), so lo keeps
    reaching goal (or stays the first lo) and hi never does (or stays the first hi); the answer
    is unique, so it is largest_key_reaching's."""
    LOG: tl.constexpr = WAYS.bit_length() - 1
    present = keys > KEY_NONE
    lo = tl.maximum(lo, tl.min(tl.where(present, keys, lo)))
    hi = tl.minimum(hi, tl.maximum(tl.max(tl.where(present, keys, lo)), lo) + 1)
    keys32 = keys.to(tl.int32)
    j = tl.arange(0, WAYS)[:, None].to(tl.int64)  # [WAYS, 1]
    counted = tl.sum(j, axis=1) > 0  # [WAYS] as the sums: slot 0 (q_0 = lo) is not a probe
    while hi - lo > 1:
        width = hi - lo  # < 2**32: lo and hi lie within the order keys
        probes = (lo + ((j * width) >> LOG)).to(tl.int32)  # in [lo, hi): int32 like the keys
        sums = tl.sum(tl.where(keys32 >= probes, weights, 0), axis=1)  # [WAYS]
        n = tl.sum(((sums >= goal) & counted).to(tl.int64), axis=0)
        new_lo = lo + ((n * width) >> LOG)
        hi = lo + (((n + 1) * width) >> LOG)
        lo = new_lo
    return lo


@triton.jit
def load_candidates(cand_ptr, count, lo_key, hi_key, CAP: tl.constexpr):
    """The first `count` values of a candidate region (cand_ptr: fp32 [CAP], filled by other
    programs of this kernel: read through L2, .cg) restricted to keys in [lo_key, hi_key):
    (x [1, CAP], key [1, CAP] with KEY_NONE outside)."""
    i = tl.arange(0, CAP)[None, :]
    x = tl.load(cand_ptr + i, mask=i < count, other=NEG_INF, cache_modifier=".cg")
    key = order_key(x)
    inside = (i < count) & (key >= lo_key) & (key < hi_key)
    return x, tl.where(inside, key, KEY_NONE)
