"""Exact fallbacks of the large-vocab selection: passes over one whole row by one program
(the row's last program in _triton_select_finish.py), used only when the values gathered
during the streaming pass do not decide a threshold (a mis-predicted sample, an overflowing
candidate region, min-p reaching below the top set). Each is one pass over the row (from L2
at small batch); the refinement takes one per bisection step until the interval holding the
threshold fits the candidate region.
"""
import triton
import triton.language as tl

from ._triton_common import fixed_mass, fixed_prob, load_x_row, order_key, passes_min_p


@triton.jit
def sweep_at(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr, m, at_key, floor_key,
             s2k, V: tl.constexpr, BLOCK_S: tl.constexpr, USE_PROB: tl.constexpr):
    """(count, weight, mass) over the row's values with key >= max(at_key, floor_key), as int64:
    weight is the count, or the fixed-point probabilities e / s2k (USE_PROB); mass in E_ONE units."""
    bound = tl.maximum(at_key, floor_key)
    count = tl.zeros([BLOCK_S], tl.int64)
    weight = tl.zeros([BLOCK_S], tl.int64)
    mass = tl.zeros([BLOCK_S], tl.int64)
    for v0 in range(0, V, BLOCK_S):
        idx = v0 + tl.arange(0, BLOCK_S)
        x = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp, pen, PENALTY)
        e = tl.exp(x - m)
        sel = (order_key(x) >= bound) & (idx < V)
        one = sel.to(tl.int64)
        count += one
        if USE_PROB:
            weight += tl.where(sel, fixed_prob(tl.div_rn(e, s2k)), 0)
        else:
            weight += one
        mass += tl.where(sel, fixed_mass(e), 0)
    return tl.sum(count, axis=0), tl.sum(weight, axis=0), tl.sum(mass, axis=0)


@triton.jit
def sweep_collect(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr, lo_key, hi_key,
                  floor_key, dst_ptr, V: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr):
    """Write the values x with max(lo_key, floor_key) <= key < hi_key to dst_ptr (fp32 [CAP]), in
    index order; returns how many there are (only the first CAP are written)."""
    bound = tl.maximum(lo_key, floor_key)
    n = tl.sum(tl.zeros([BLOCK_S], tl.int32), axis=0)
    for v0 in range(0, V, BLOCK_S):
        idx = v0 + tl.arange(0, BLOCK_S)
        x = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp, pen, PENALTY)
        key = order_key(x)
        sel = (key >= bound) & (key < hi_key) & (idx < V)
        slot = n + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(dst_ptr + slot, x, mask=sel & (slot < CAP))
        n += tl.sum(sel.to(tl.int32), axis=0)
    tl.debug_barrier()  # other threads of this program read the values back
    return n


@triton.jit
def sweep_min_p_mass(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr, m, tkey, s2,
                     min_p, V: tl.constexpr, BLOCK_S: tl.constexpr):
    """Mass (E_ONE units) of the values kept by top-k / top-p (key >= tkey) that min-p keeps too."""
    mass = tl.zeros([BLOCK_S], tl.int64)
    for v0 in range(0, V, BLOCK_S):
        idx = v0 + tl.arange(0, BLOCK_S)
        x = load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp, pen, PENALTY)
        e = tl.exp(x - m)
        keep = (order_key(x) >= tkey) & passes_min_p(e, s2, min_p) & (idx < V)
        mass += tl.where(keep, fixed_mass(e), 0)
    return tl.sum(mass, axis=0)


@triton.jit
def refine_and_collect(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY: tl.constexpr, m, goal,
                       lo_key, c_lo, m_lo, hi_key, c_hi, w_hi, m_hi, floor_key, s2k, dst_ptr,
                       V: tl.constexpr, CAP: tl.constexpr, BLOCK_S: tl.constexpr, USE_PROB: tl.constexpr):
    """The interval [lo_key, hi_key) holds the threshold (weight >= goal at lo, < goal at hi;
    c / w / m: exact count, weight, mass at each end). Halve it with one sweep per step until it
    holds at most CAP values or a single key, then gather its values into dst_ptr.
    Returns the final (lo_key, c_lo, m_lo, hi_key, c_hi, w_hi, m_hi, gathered count)."""
    while (c_lo - c_hi > CAP) & (hi_key - lo_key > 1):
        mid = lo_key + (hi_key - lo_key) // 2
        c_mid, w_mid, m_mid = sweep_at(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, m, mid,
                                       floor_key, s2k, V, BLOCK_S, USE_PROB)
        up = w_mid >= goal
        lo_key = tl.where(up, mid, lo_key)
        c_lo = tl.where(up, c_mid, c_lo)
        m_lo = tl.where(up, m_mid, m_lo)
        hi_key = tl.where(up, hi_key, mid)
        c_hi = tl.where(up, c_hi, c_mid)
        w_hi = tl.where(up, w_hi, w_mid)
        m_hi = tl.where(up, m_hi, m_mid)
    n = (c_lo - c_hi).to(tl.int32)
    if c_lo - c_hi <= CAP:
        n = sweep_collect(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, pen, PENALTY, lo_key, hi_key,
                          floor_key, dst_ptr, V, CAP, BLOCK_S)
    return lo_key, c_lo, m_lo, hi_key, c_hi, w_hi, m_hi, n
