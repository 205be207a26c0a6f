"""Triton kernels of the fused verify step, first half: per-position statistics of the
standardised distributions (launched by kernels/verify/triton.py; _triton_emit.py has the rest).

Tiles: every kernel handles BLOCK_R rows at once (a [BLOCK_R, BLOCK_V] tile per step),
so small vocabularies still fill the vector units (and the CPU interpreter stays fast).
Indexing: a "stats position" is one (row, distribution): pos in [0, K] is target position
pos, pos in [K+1, 2K] is draft position pos-K-1 (only when draft logits are given).
Standardisation (reference.standardise) is never materialised: per stats position the
kernels keep (m, s2, s3, tkey, amax) and rebuild any standardised value on the fly:
    x = logits / T;  keep = key(x) >= tkey (top-k and top-p together)
                            and not (exp(x-m)/s2 < min_p * (1/s2))          (min-p)
    std = keep ? x : -inf;  prob = keep ? exp(x-m)/s3 : 0
    greedy (T == 0): std = 0 / prob = 1 at amax, -inf / 0 elsewhere.
m = max x, amax = its lowest index, s2 = sum of exp(x-m) after top-k and top-p, s3 = after
min-p too. Floats compare like their order keys (positive float32 order like their int32
bit patterns), so top-k and top-p thresholds are exact bisections over int32 keys.
"""
import triton
import triton.language as tl

KEY_NEG_INF = tl.constexpr(-2139095041)  # order key of -inf: 0xFF800000 ^ 0x7FFFFFFF as int32
BIG_INDEX = tl.constexpr(2147483647)
NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _order_key(x):
    """int64 whose order is the float order of x (fp32; -0.0 folded onto +0.0)."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _tile_rows(count, BLOCK_R: tl.constexpr):
    """This program's row indices [BLOCK_R] (clamped into range, so loads need no row mask)
    and which of them are real (for stores)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    return tl.minimum(r, count - 1), r < count


@triton.jit
def _num_drafts(tokens_ptr, b, sx_b, sx_k, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """K_b [BLOCK_R]: the drafts of each row b before its first -1."""
    t = tl.arange(0, BLOCK_K)[None, :]
    tok = tl.load(tokens_ptr + b.to(tl.int64)[:, None] * sx_b + t * sx_k, mask=t < K, other=0)
    return tl.min(tl.where((tok < 0) & (t < K), t, K), axis=1)


@triton.jit
def _row_source(r, NPOS, tokens_ptr, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
                V: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """For stats positions r [BLOCK_R]: (row b, element offsets of its target and draft rows,
    vocab limits t_lim / d_lim: V for the one row to read, 0 for the other and for positions
    never needed (past the first -1)). Limits, not i1 masks: the CPU interpreter cannot
    broadcast an i1 scalar, and a bound works the same on every path."""
    b = r // NPOS
    pos = r % NPOS
    kb = _num_drafts(tokens_ptr, b, sx_b, sx_k, K, BLOCK_K)
    is_target = pos <= K
    i = tl.where(is_target, pos, pos - K - 1)
    lim = tl.where(tl.where(is_target, i <= kb, i < kb), V, 0)
    t_lim = tl.where(is_target, lim, 0)
    b64 = b.to(tl.int64)
    t_off = b64 * st_b + tl.where(is_target, i, 0) * st_k
    d_off = b64 * sd_b + tl.where(is_target, 0, i) * sd_k
    return b, t_off, d_off, t_lim, lim - t_lim


@triton.jit
def _load_x(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp):
    """Tempered logits x = z / T [BLOCK_R, BLOCK_V] (loaded in their dtype, fp32 IEEE division
    like torch) at vocab indices idx [BLOCK_V]; -inf outside each row's limit."""
    i2 = idx[None, :]
    in_t = i2 < t_lim[:, None]
    zt = tl.load(target_ptr + t_off[:, None] + i2, mask=in_t, other=NEG_INF)
    zd = tl.load(draft_ptr + d_off[:, None] + i2, mask=i2 < d_lim[:, None], other=NEG_INF)
    return tl.div_rn(tl.where(in_t, zt, zd).to(tl.float32), temp[:, None])


@triton.jit
def standardised(z, idx, temp, greedy, m, s2, s3, tkey, amax, min_p):
    """(std, prob) of raw logits z at vocab indices idx (any broadcastable shapes) from the
    stats of their positions."""
    x = tl.div_rn(z.to(tl.float32), temp)
    e = tl.exp(x - m)
    keep = _order_key(x) >= tkey
    keep = keep & (tl.div_rn(e, s2) >= min_p * tl.div_rn(1.0, s2))  # min-p (a no-op at min_p = 0)
    std = tl.where(keep, x, NEG_INF)
    prob = tl.where(keep, tl.div_rn(e, s3), 0.0)
    at_max = idx == amax
    std = tl.where(greedy, tl.where(at_max, 0.0, NEG_INF), std)
    prob = tl.where(greedy, tl.where(at_max, 1.0, 0.0), prob)
    return std, prob


@triton.jit
def partial_stats_kernel(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, part_m_ptr, part_s_ptr, part_arg_ptr,
    R, NPOS, NCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """grid (cdiv(R, BLOCK_R), NCHUNK), R = B * NPOS: online max, sum exp(x - max) and lowest
    argmax of x over one vocab chunk of BLOCK_R stats positions, in one pass."""
    r, live = _tile_rows(R, BLOCK_R)
    c = tl.program_id(1)
    b, t_off, d_off, t_lim, d_lim = _row_source(r, NPOS, tokens_ptr, st_b, st_k, sd_b, sd_k, sx_b, sx_k, V, K, BLOCK_K)
    t = tl.load(temperature_ptr + b)
    temp = tl.where(t > 0, t, 1.0)
    start = c * CHUNK
    m = tl.full([BLOCK_R], NEG_INF, tl.float32)
    s = tl.zeros([BLOCK_R], tl.float32)
    arg = tl.zeros([BLOCK_R], tl.int32) + start
    if tl.max(t_lim + d_lim, axis=0) > 0:  # skip tiles of positions past every row's first -1
        for v0 in range(0, CHUNK, BLOCK_V):
            idx = start + v0 + tl.arange(0, BLOCK_V)
            x = _load_x(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp)
            bm = tl.max(x, axis=1)
            barg = tl.min(tl.where(x == bm[:, None], idx[None, :], BIG_INDEX), axis=1)
            new_m = tl.maximum(m, bm)
            arg = tl.where(bm > m, barg, arg)
            alpha = tl.where(new_m == m, 1.0, tl.exp(m - new_m))
            e = tl.where(x > NEG_INF, tl.exp(x - new_m[:, None]), 0.0)
            s = s * alpha + tl.sum(e, axis=1)
            m = new_m
    out = r * NCHUNK + c
    tl.store(part_m_ptr + out, m, mask=live)
    tl.store(part_s_ptr + out, s, mask=live)
    tl.store(part_arg_ptr + out, arg, mask=live)


@triton.jit
def _masked_sum(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, m, tkey, s2, min_p,
                V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """[BLOCK_R] sums of exp(x - m) over x with key(x) >= tkey that min-p keeps (fp32)."""
    s = tl.zeros([BLOCK_R], tl.float32)
    for v0 in range(0, V, BLOCK_V):
        x = _load_x(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, v0 + tl.arange(0, BLOCK_V), temp)
        e = tl.exp(x - m[:, None])
        keep = (_order_key(x) >= tkey[:, None]) & (tl.div_rn(e, s2[:, None]) >= (min_p * tl.div_rn(1.0, s2))[:, None])
        s += tl.sum(tl.where(keep, e, 0.0), axis=1)
    return s


@triton.jit
def thresholds_kernel(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
    part_m_ptr, part_s_ptr, part_arg_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr,
    R, NPOS, NCHUNK, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
    V: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """grid (cdiv(R, BLOCK_R),): merge the chunk partials in chunk order; where top-k / top-p /
    min-p are active, bisect their thresholds over order keys (one pass over the vocab per
    step, 32 steps at most) and recompute the normalisers. Writes m, s2, s3, tkey, amax."""
    r, live = _tile_rows(R, BLOCK_R)
    b, t_off, d_off, t_lim, d_lim = _row_source(r, NPOS, tokens_ptr, st_b, st_k, sd_b, sd_k, sx_b, sx_k, V, K, BLOCK_K)
    cs = tl.arange(0, BLOCK_C)[None, :]
    part = r[:, None] * NCHUNK + cs
    pm = tl.load(part_m_ptr + part, mask=cs < NCHUNK, other=NEG_INF)
    ps = tl.load(part_s_ptr + part, mask=cs < NCHUNK, other=0.0)
    pa = tl.load(part_arg_ptr + part, mask=cs < NCHUNK, other=BIG_INDEX)
    m = tl.max(pm, axis=1)
    amax = tl.min(tl.where(pm == m[:, None], pa, BIG_INDEX), axis=1)
    s = tl.sum(tl.where(pm > NEG_INF, ps * tl.exp(pm - m[:, None]), 0.0), axis=1)
    needed = t_lim + d_lim > 0
    m = tl.where(needed, m, 0.0)  # positions never read: harmless numbers instead of -inf / 0
    s = tl.where(needed, s, 1.0)

    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    top_p = tl.load(top_p_ptr + b)
    min_p = tl.load(min_p_ptr + b)
    temp = tl.where(t > 0, t, 1.0)
    sampled = needed & (t > 0)
    tkey = tl.zeros([BLOCK_R], tl.int64) + KEY_NEG_INF
    if V <= BLOCK_V:  # the whole row fits one tile: load it once for every bisection step
        x_row = _load_x(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, tl.arange(0, BLOCK_V), temp)
        key_row = _order_key(x_row)

    # top-k: the k-th largest x is the largest key t with count(key(x) >= t) >= k.
    # Invariant count(key >= lo) >= k > count(key >= hi); rows not bisecting have hi = lo + 1.
    on = sampled & (top_k > 0) & (top_k < V)
    lo = tkey
    hi = tl.where(on, _order_key(m) + 1, lo + 1)
    while tl.max(hi - lo, axis=0) > 1:
        mid = lo + (hi - lo) // 2
        if V <= BLOCK_V:
            count = tl.sum((key_row >= mid[:, None]).to(tl.int32), axis=1)
        else:
            count = tl.zeros([BLOCK_R], tl.int32)
            for v0 in range(0, V, BLOCK_V):
                x = _load_x(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, v0 + tl.arange(0, BLOCK_V), temp)
                count += tl.sum((_order_key(x) >= mid[:, None]).to(tl.int32), axis=1)
        go = hi - lo > 1
        enough = count >= top_k
        lo = tl.where(go & enough, mid, lo)
        hi = tl.where(go & (count < top_k), mid, hi)
    tkey = tl.where(on, lo, tkey)
    if tl.max(on.to(tl.int32), axis=0) > 0:
        s_k = _masked_sum(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, m, tkey, s, min_p * 0.0, V, BLOCK_R, BLOCK_V)
        s = tl.where(on, s_k, s)

    # top-p: keep x iff the mass of tokens strictly above it is < top_p, i.e. key(x) >= t0 with
    # t0 the smallest key whose mass above is < top_p. Invariant mass(> lo) >= top_p > mass(> hi).
    # Probabilities fp32 like the reference's softmax, summed in fp64 like its cumsum.
    on = sampled & (top_p < 1)
    lo = tkey - 1
    hi = tl.where(on, _order_key(m), lo + 1)
    goal = top_p.to(tl.float64)
    if V <= BLOCK_V:
        prob_row = tl.where(key_row >= tkey[:, None], tl.div_rn(tl.exp(x_row - m[:, None]), s[:, None]), 0.0).to(tl.float64)
    while tl.max(hi - lo, axis=0) > 1:
        mid = lo + (hi - lo) // 2
        if V <= BLOCK_V:
            mass = tl.sum(tl.where(key_row > mid[:, None], prob_row, 0.0), axis=1)
        else:
            mass = tl.zeros([BLOCK_R], tl.float64)
            for v0 in range(0, V, BLOCK_V):
                x = _load_x(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, v0 + tl.arange(0, BLOCK_V), temp)
                key = _order_key(x)
                above = (key > mid[:, None]) & (key >= tkey[:, None])
                prob = tl.where(above, tl.div_rn(tl.exp(x - m[:, None]), s[:, None]), 0.0)
                mass += tl.sum(prob.to(tl.float64), axis=1)
        go = hi - lo > 1
        hi = tl.where(go & (mass < goal), mid, hi)
        lo = tl.where(go & (mass >= goal), mid, lo)
    tkey = tl.where(on, hi, tkey)
    if tl.max(on.to(tl.int32), axis=0) > 0:
        s_p = _masked_sum(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, m, tkey, s, min_p * 0.0, V, BLOCK_R, BLOCK_V)
        s = tl.where(on, s_p, s)

    s2 = s
    on = sampled & (min_p > 0)
    if tl.max(on.to(tl.int32), axis=0) > 0:
        s_m = _masked_sum(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, temp, m, tkey, s2, min_p, V, BLOCK_R, BLOCK_V)
        s = tl.where(on, s_m, s)
    tl.store(m_ptr + r, m, mask=live)
    tl.store(s2_ptr + r, s2, mask=live)
    tl.store(s3_ptr + r, s, mask=live)
    tl.store(tkey_ptr + r, tkey, mask=live)
    tl.store(amax_ptr + r, amax, mask=live)
