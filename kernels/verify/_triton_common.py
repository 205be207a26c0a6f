"""Device helpers shared by the Triton verify kernels (_triton_select*.py, _triton_emit.py).

Glossary (used in every kernel of this folder):
    row / distribution   one (batch row b, position) softmax: target positions 0..K, then
                         draft positions 0..K-1 when draft logits are given (NPOS of them per b)
    x                    tempered logit z / T (fp32, IEEE division like torch); -inf outside the row
    key                  int64 whose order is the float order of x (order_key); thresholds are keys
    e                    exp(x - m), m = the row max: unnormalised probability in (0, 1]
    m, amax              row max of x and its lowest index
    s                    sum of e over the row
    tkey                 the top-k / top-p threshold: kept iff key(x) >= tkey
    s2                   sum of e over the kept set (the top-k + top-p normaliser; min-p tests
                         e / s2 >= min_p / s2 against it, like reference.standardise)
    s3                   sum of e over what min-p keeps too (the final normaliser)
    E_ONE, P_ONE         fixed-point units: masses of e as int64 multiples of 2**-40,
                         probabilities as multiples of 2**-60. Integer sums are exact in any
                         order, so sums over candidates gathered in atomic (scheduling) order
                         are deterministic.
"""
import triton
import triton.language as tl

from ..penalties.triton import penalise

KEY_NEG_INF = tl.constexpr(-2139095041)  # order key of -inf: 0xFF800000 ^ 0x7FFFFFFF as int32
KEY_POS_INF = tl.constexpr(2139095040)  # order key of +inf: 0x7F800000
KEY_NONE = tl.constexpr(-2139095042)  # below every key: empty candidate slots
BIG_INDEX = tl.constexpr(2147483647)
NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))
E_ONE = tl.constexpr(1099511627776.0)  # 2**40: e <= 1, so a row of up to 2**23 entries sums below 2**63
P_ONE = tl.constexpr(1152921504606846976.0)  # 2**60: probabilities sum to about 1


@triton.jit
def found_or_zero(index):
    """index int32, BIG_INDEX where a search over a row found no maximum -> 0 there. A row of NaN
    logits (the unspecified logits of a padding row: a finished row, the engine feeds nothing)
    has none (x == max is never true), and BIG_INDEX must not leave a kernel as a token: fed
    back, it indexes past an embedding (an IndexError on CPU, a device assert on CUDA). 0 is
    what torch.argmax gives such a row; the emitters apply it once a row, outside every loop."""
    return tl.where(index == BIG_INDEX, 0, index)


@triton.jit
def order_key(x):
    """int64 whose order is the float order of x (fp32; -0.0 folded onto +0.0)."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def key_value(key):
    """The fp32 value whose order key is key (inverse of order_key for keys of floats)."""
    bits = key.to(tl.int32)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def fixed_mass(e):
    """e (fp32 in [0, 1], or a sum of them) -> int64 multiples of 2**-40 (exact for e >= 2**-16)."""
    return (e * E_ONE).to(tl.int64)


@triton.jit
def fixed_prob(p):
    """A probability (fp32 or fp64) -> int64 multiples of 2**-60 (top-p's unit)."""
    return (p * P_ONE).to(tl.int64)


@triton.jit
def passes_min_p(e, s2, min_p):
    """min-p's test, written exactly as reference.standardise and standardised() evaluate it
    (a no-op at min_p = 0); monotone in e, so it is a threshold on x."""
    return tl.div_rn(e, s2) >= min_p * tl.div_rn(1.0, s2)


@triton.jit
def num_drafts(tokens_ptr, b, sx_b, sx_k, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """K_b for rows b [BLOCK_R] (tokens_ptr: int [B, K] drafts): the drafts before the first -1."""
    t = tl.arange(0, BLOCK_K)[None, :]
    tok = tl.load(tokens_ptr + b.to(tl.int64)[:, None] * sx_b + t * sx_k, mask=t < K, other=0)
    return tl.min(tl.where((tok < 0) & (t < K), t, K), axis=1)


@triton.jit
def num_drafts_of_row(tokens_ptr, b, sx_b, sx_k, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """K_b of one row b (a scalar)."""
    t = tl.arange(0, BLOCK_K)
    tok = tl.load(tokens_ptr + b.to(tl.int64) * sx_b + t * sx_k, mask=t < K, other=0)
    return tl.min(tl.where((tok < 0) & (t < K), t, K), axis=0)


@triton.jit
def row_source(r, NPOS, kb, st_b, st_k, sd_b, sd_k, V: tl.constexpr, K: tl.constexpr):
    """Where distribution r (scalar or [BLOCK_R]) reads its logits, given its row's K_b:
    (element offsets of its target and draft rows, vocab limits t_lim / d_lim: V for the one
    row to read, 0 for the other and for positions never needed, i.e. past the first -1).
    Limits, not i1 masks: the CPU interpreter cannot broadcast an i1 scalar."""
    b = r // NPOS
    pos = r % NPOS
    is_target = pos <= K
    i = tl.where(is_target, pos, pos - K - 1)
    lim = tl.where(tl.where(is_target, i <= kb, i < kb), V, 0)
    t_lim = tl.where(is_target, lim, 0)
    b64 = b.to(tl.int64)
    t_off = b64 * st_b + tl.where(is_target, i, 0) * st_k
    d_off = b64 * sd_b + tl.where(is_target, 0, i) * sd_k
    return t_off, d_off, t_lim, lim - t_lim


@triton.jit
def load_x_rows(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp, pen, PENALTY: tl.constexpr):
    """Tempered logits x [BLOCK_R, BLOCK_V] of rows with offsets / limits [BLOCK_R] at vocab
    indices idx [BLOCK_V] (target_ptr / draft_ptr: [B, K+1, V] / [B, K, V], any float dtype);
    -inf outside each row's limit. pen: the rows' penalties (kernels/penalties/triton.py, values
    [BLOCK_R, 1]) or (False,)."""
    i2 = idx[None, :]
    in_t = i2 < t_lim[:, None]
    zt = tl.load(target_ptr + t_off[:, None] + i2, mask=in_t, other=NEG_INF)
    zd = tl.load(draft_ptr + d_off[:, None] + i2, mask=i2 < d_lim[:, None], other=NEG_INF)
    z = tl.where(in_t, zt, zd).to(tl.float32)
    if PENALTY:
        z = penalise(z, i2, in_t | (i2 < d_lim[:, None]), pen)
    return tl.div_rn(z, temp[:, None])


@triton.jit
def load_x_row(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp, pen, PENALTY: tl.constexpr):
    """load_x_rows for one row (scalar offsets / limits): x at indices idx (any shape). One load
    (the row's own pointer), and no division at T = 1 (x = z exactly: ~10 fewer instructions
    per value in the bandwidth-bound streaming pass). pen: the row's penalties or (False,)."""
    row_ptr = tl.where(t_lim > 0, target_ptr + t_off, draft_ptr + d_off)
    inside = idx < t_lim + d_lim
    x = tl.load(row_ptr + idx, mask=inside, other=NEG_INF).to(tl.float32)
    if PENALTY:
        x = penalise(x, idx, inside, pen)
    if temp != 1.0:
        x = tl.div_rn(x, temp)
    return x


@triton.jit
def position_of(r, NPOS, K: tl.constexpr):
    """The position (target i or draft i) of distribution r (glossary: target 0..K, then draft
    0..K-1 per batch row): the number of drafts in front of it."""
    pos = r % NPOS
    return tl.where(pos <= K, pos, pos - K - 1)


@triton.jit
def identity_skips(temp, min_p, SKIP_IDENTITIES: tl.constexpr):
    """standardised's (divide, by_min_p) for the rows temp / min_p [R] (R >= 1) a program
    standardises (SKIP_IDENTITIES, a plan's flag; else (True, True): every value divided and
    tested): a division where some row has T != 1, min-p's test where some row has min-p. Per value,
    the emission's sm_90a loop (B = 64, K = 4, V = 128256) held 2443 instructions a step of 8
    values a thread, of which the division by the temperature 254 and min-p's test 292 (compiled
    here, no GPU): both identities for a tile of T = 1 rows without min-p."""
    if SKIP_IDENTITIES:
        return tl.max((temp != 1.0).to(tl.int32), axis=0) > 0, tl.max((min_p > 0).to(tl.int32), axis=0) > 0
    else:
        return True, True


@triton.jit
def standardised(z, idx, temp, greedy, m, s2, s3, tkey, amax, min_p, divide=True, by_min_p=True):
    """(std, prob) of raw logits z at vocab indices idx (any broadcastable shapes) from the
    stats of their distributions: reference.standardise and its softmax, never materialised.
    divide / by_min_p (scalars; True: always): False where no row of the call has T != 1 / min_p
    > 0, skipping per value an IEEE division that is then the identity (z / 1 = z exactly) and
    min-p's test (two divisions) that then keeps every value (e / s2 >= 0 for finite or -inf
    logits, as the reference applies no min-p at min_p = 0)."""
    x = z.to(tl.float32)
    if divide:
        x = tl.div_rn(x, temp)
    e = tl.exp(x - m)
    keep = order_key(x) >= tkey
    if by_min_p:
        keep = keep & passes_min_p(e, s2, min_p)
    std = tl.where(keep, x, NEG_INF)
    prob = tl.where(keep, tl.div_rn(e, s3), 0.0)
    at_max = idx == amax
    std = tl.where(greedy, tl.where(at_max, 0.0, NEG_INF), std)
    prob = tl.where(greedy, tl.where(at_max, 1.0, 0.0), prob)
    return std, prob


@triton.jit
def vocab_index(amax, V: tl.constexpr):
    """amax where it is an index of the vocabulary, else 0. The lowest index of a row's maximum
    matches no value when the row holds NaN (possible only with check=False; on the interpreter
    a NaN max, on a GPU an all-NaN row): the tokens are then unspecified, but must stay indices
    a caller can embed (an out-of-range draft token crashed the next draft step's embedding)."""
    return tl.where((amax >= 0) & (amax < V), amax, 0)


@triton.jit
def sampling_modes(t, top_k, top_p, min_p, needed, V: tl.constexpr):
    """(top-k on, top-p on, min-p on) per distribution (any shape): only for needed, sampled
    (T > 0) rows, and top-k only when it removes something (0 < k < V)."""
    sampled = needed & (t > 0)
    return sampled & (top_k > 0) & (top_k < V), sampled & (top_p < 1), sampled & (min_p > 0)
