"""Launch 2 of the verify step: ratio test and token emission (after a selection kernel,
_triton_select_small.py / _triton_select_stream.py, wrote each distribution's m, s2, s3, tkey,
amax). Glossary: _triton_common.py.

grid (cdiv(B, BLOCK_R), NCHUNK): each program runs the ratio test of BLOCK_R rows (K vector
steps, repeated by every chunk: cheaper than a launch), then one pass over a vocab chunk of
each row's emitted position (Gumbel-max candidates, written per chunk); the program that takes
the row tile's last ticket merges the chunks in chunk order and writes the tokens.

LANES (the plan's emit_lanes where a program streams more than one block, since an H200 timed it):
the pass keeps its running maxima per lane ([BLOCK_R, BLOCK_V] values and indices, elementwise
updates) and reduces them once after the loop, instead of ~8 block reductions per step (each a
shared-memory round with barriers: the emission's sm_90a loop held 18 barriers per step at B = 64,
bench/results/verify_stream_ptx_sm90.json).
The same candidates bit for bit: within a lane later steps hold larger indices, so a strict
improvement keeps the lowest index of a tie, and the final reduction takes the lowest index among
the lanes at the maximum. The skip test then bounds each lane by its own best (a weaker bound than
the row's: fewer tiles skipped on full-distribution rows; greedy / truncated rows still skip
every -inf tile), one tile-wide reduction per step.
"""
import triton
import triton.language as tl

from ..penalties.triton import penalise, row_penalty
from ..rng import STREAM_ACCEPT
from ..rng.triton import exponential_from_bits, philox_bits, tile_bits, uniform_from_bits
from .._triton_sync import last_program_of
from ._triton_common import BIG_INDEX, NEG_INF, found_or_zero, identity_skips, num_drafts, standardised

_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)
# Gumbel-max in ratio form: the reference's argmax(std + G) and argmax(log r + G), G = -log(E),
# are argmax(prob / E) and argmax(r / E) (exp is monotone; prob = exp(std - m) / s3 with the row's
# m and s3), E = exponential_from_bits: one logarithm per value where G and log r took three.
# Keys are -inf where std is (truncated, outside the vocabulary), as the reference's. The same
# tokens but for rounding (as between any two of the backends). Compiled for sm_90a (no GPU),
# the B = 64 emission's loop (LANES) went from 1993 to 1397 PTX lines a step (FMAs 288 to 96:
# tl.log is libdevice's polynomial there, tl.exp an ex2.approx); not yet timed on a GPU.
# An upper bound of 1 / E: E >= -log(1 - 2**-24) = 2**-24 (1 + 2**-25) (the largest open
# uniform), with room for rounding; a value's key is at most its prob (or residual) times it.
NOISE_RATIO_MAX = tl.constexpr(33554432.0)  # 2**25


@triton.jit
def noise_weight(std, prob):
    """The weight a value's noise divides (ratio form, NOISE_RATIO_MAX's note): its probability,
    -inf where the reference's standardised logit is (never a candidate)."""
    return tl.where(std > NEG_INF, prob, NEG_INF)


@triton.jit
def _q_weight(std_q, q, m, EXP_KEYS: tl.constexpr):
    """The target's noise weights [BLOCK_R, BLOCK_V]: noise_weight(std_q, q), or with EXP_KEYS
    exp(std_q - m) (the probability times the row's sum, a positive row constant: the same argmax,
    and no division a value; _triton_plan.EMIT_SAMPLER_EXP_KEYS). A greedy row's one finite std is 0
    at its argmax: a weight exp(-m) >= 0 there against -inf elsewhere, so its argmax still wins."""
    if EXP_KEYS:
        return noise_weight(std_q, tl.exp(std_q - m))
    return noise_weight(std_q, q)


@triton.jit
def _tile_rows(count, BLOCK_R: tl.constexpr):
    """This program's row indices [BLOCK_R] (clamped into range, so loads need no row mask)
    and which of them are real (for stores)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    return tl.minimum(r, count - 1), r < count


@triton.jit
def _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, at):
    return tl.load(m_ptr + at), tl.load(s2_ptr + at), tl.load(s3_ptr + at), tl.load(tkey_ptr + at), tl.load(amax_ptr + at)


@triton.jit
def _argmax_update(best, best_idx, values, idx):
    """Per-row running argmax of values [BLOCK_R, BLOCK_V] at idx [1, BLOCK_V]; ties go to the
    lowest index (blocks are visited in ascending order, so a later block wins only if larger)."""
    bm = tl.max(values, axis=1)
    barg = tl.min(tl.where(values == bm[:, None], idx, BIG_INDEX), axis=1)
    return tl.maximum(best, bm), tl.where(bm > best, barg, best_idx)


@triton.jit
def _lane_update(best, arg, values, idx):
    """Per-lane running maxima best / arg [BLOCK_R, BLOCK_V] after values at idx [1, BLOCK_V]
    (a strict improvement: the earlier, lower index keeps a tie)."""
    better = values > best
    return tl.where(better, values, best), tl.where(better, idx, arg)


@triton.jit
def _lanes_reduced(best, arg, start):
    """The rows' maxima [BLOCK_R] and the lowest index holding them; start where a row's maximum
    is -inf (no value was ever taken: the block-reduction loop's initial index)."""
    row_best = tl.max(best, axis=1)
    row_arg = tl.min(tl.where(best == row_best[:, None], arg, BIG_INDEX), axis=1)
    return row_best, tl.where(row_best == NEG_INF, start, row_arg)


@triton.jit
def _q_tile(target_ptr, q_row, idx, inside, pen_q, temp, greedy, min_p, mq, s2q, s3q, tkq, amq, skips,
            PENALTY: tl.constexpr):
    """The emitted position's target row at idx [1, BLOCK_V] -> (standardised logits, -inf outside
    the vocabulary; probabilities q), each [BLOCK_R, BLOCK_V]. skips: standardised's (divide,
    by_min_p) (identity_skips)."""
    zq = tl.load(target_ptr + q_row[:, None] + idx, mask=inside, other=NEG_INF)
    if PENALTY:
        zq = penalise(zq.to(tl.float32), idx, inside, pen_q)
    divide, by_min_p = skips
    std_q, q = standardised(zq, idx, temp[:, None], greedy[:, None], mq[:, None], s2q[:, None], s3q[:, None],
                            tkq[:, None], amq[:, None], min_p[:, None], divide, by_min_p)
    return tl.where(inside, std_q, NEG_INF), q


@triton.jit
def _p_tile(draft_ptr, p_row, idx, inside, rejected, xj, pen_p, temp, greedy, min_p, mp, s2p, s3p, tkp, amp, skips,
            PENALTY: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr):
    """The draft's probabilities p [BLOCK_R, BLOCK_V] at the rejected position (read for rejected
    rows only), or the one-hot of the draft token xj without draft logits. skips: as _q_tile's."""
    if HAS_DRAFT_LOGITS:
        zp = tl.load(draft_ptr + p_row[:, None] + idx, mask=inside & rejected[:, None], other=NEG_INF)
        if PENALTY:
            zp = penalise(zp.to(tl.float32), idx, inside & rejected[:, None], pen_p)
        divide, by_min_p = skips
        _, p = standardised(zp, idx, temp[:, None], greedy[:, None], mp[:, None], s2p[:, None], s3p[:, None],
                            tkp[:, None], amp[:, None], min_p[:, None], divide, by_min_p)
    else:
        p = tl.where(idx == xj[:, None], 1.0, 0.0)
    return p


@triton.jit
def _emit_pass_lanes(target_ptr, draft_ptr, q_row, p_row, pen_q, pen_p, temp, greedy, min_p, mq, s2q, s3q, tkq, amq,
                     mp, s2p, s3p, tkp, amp, seed, offset, noise_position, stream, rejected, xj, start, skips,
                     PENALTY: tl.constexpr, V: tl.constexpr, CHUNK: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, EXP_KEYS: tl.constexpr):
    """The emission's pass over a vocab chunk with per-lane state (module docstring: LANES) ->
    (q maxima, their indices, residual maxima, their indices, residual seen positive), each
    [BLOCK_R, BLOCK_V]; the math of each value is the block-reduction loop's (_emit)."""
    q_lane = tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32)
    q_arg = tl.full([BLOCK_R, BLOCK_V], BIG_INDEX, tl.int32)
    r_lane = q_lane
    r_arg = q_arg
    r_any = tl.zeros([BLOCK_R, BLOCK_V], tl.int32)
    any_rejected = tl.max(rejected.to(tl.int32), axis=0) > 0
    for v0 in range(0, CHUNK, BLOCK_V):
        idx = (start + v0 + tl.arange(0, BLOCK_V))[None, :]
        inside = idx < V
        std_q, q = _q_tile(target_ptr, q_row, idx, inside, pen_q, temp, greedy, min_p, mq, s2q, s3q, tkq, amq, skips,
                           PENALTY)
        q_top = _q_weight(std_q, q, mq[:, None], EXP_KEYS)
        r_top = tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32)  # max(q - p, 0), -inf where 0
        if any_rejected:
            p = _p_tile(draft_ptr, p_row, idx, inside, rejected, xj, pen_p, temp, greedy, min_p, mp, s2p, s3p, tkp, amp,
                        skips, PENALTY, HAS_DRAFT_LOGITS)
            r = tl.maximum(q - p, 0.0)
            positive = inside & rejected[:, None] & (r > 0)
            r_any = tl.maximum(r_any, positive.to(tl.int32))
            r_top = tl.where(positive, r, NEG_INF)
        # Noise only where some lane could still improve (its own best; 1 / E <= NOISE_RATIO_MAX
        # and r <= q): one reduction over the tile.
        could = (q_top * NOISE_RATIO_MAX >= q_lane) | (rejected[:, None] & (r_top * NOISE_RATIO_MAX >= r_lane))
        if tl.max(tl.max(could.to(tl.int32), axis=1), axis=0) > 0:
            inv_e = 1.0 / exponential_from_bits(tile_bits(seed[:, None], offset[:, None], noise_position[:, None],
                                                          stream, start + v0, idx, BLOCK_V))
            q_lane, q_arg = _lane_update(q_lane, q_arg, q_top * inv_e, idx)
            if any_rejected:
                r_lane, r_arg = _lane_update(r_lane, r_arg, r_top * inv_e, idx)
    return q_lane, q_arg, r_lane, r_arg, r_any


@triton.jit
def merge_chunk_candidates(q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, b, NCHUNK,
                           BLOCK_C: tl.constexpr):
    """Merge the Gumbel-max candidates of rows b [BLOCK_R], written per vocab chunk ([B, NCHUNK]
    each), in chunk order (ties to the lowest index; other programs wrote them, so read through
    L2, .cg): (y_q, y_r, r_any) [BLOCK_R]: q's token, the residual's, whether the residual has mass."""
    cs = tl.arange(0, BLOCK_C)[None, :]
    part = b[:, None] * NCHUNK + cs
    in_c = cs < NCHUNK
    qv = tl.load(q_val_ptr + part, mask=in_c, other=NEG_INF, cache_modifier=".cg")
    qi = tl.load(q_idx_ptr + part, mask=in_c, other=BIG_INDEX, cache_modifier=".cg")
    rv = tl.load(r_val_ptr + part, mask=in_c, other=NEG_INF, cache_modifier=".cg")
    ri = tl.load(r_idx_ptr + part, mask=in_c, other=BIG_INDEX, cache_modifier=".cg")
    r_any = tl.max(tl.load(r_any_ptr + part, mask=in_c, other=0, cache_modifier=".cg"), axis=1)
    y_q = found_or_zero(tl.min(tl.where(qv == tl.max(qv, axis=1)[:, None], qi, BIG_INDEX), axis=1))
    y_r = found_or_zero(tl.min(tl.where(rv == tl.max(rv, axis=1)[:, None], ri, BIG_INDEX), axis=1))
    return y_q, y_r, r_any


@triton.jit
def _write_tokens(tokens_ptr, q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, out_ptr, num_accepted_ptr,
                  b, live, j, kb, NCHUNK, sx_b, sx_k, so_b,
                  K: tl.constexpr, BLOCK_K1: tl.constexpr, BLOCK_C: tl.constexpr):
    """Merge the chunk candidates of rows b [BLOCK_R] (merge_chunk_candidates), choose residual
    or q, write tokens[b] = x_0..x_{j-1}, y, -1, ... and num_accepted[b] = j."""
    b64 = b.to(tl.int64)
    y_q, y_r, r_any = merge_chunk_candidates(q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, b, NCHUNK, BLOCK_C)
    y = tl.where((j < kb) & (r_any > 0), y_r, y_q)
    t = tl.arange(0, BLOCK_K1)[None, :]
    x = tl.load(tokens_ptr + b64[:, None] * sx_b + t * sx_k, mask=t < K, other=-1).to(tl.int32)
    out = tl.where(t < j[:, None], x, tl.where(t == j[:, None], y[:, None], -1))
    tl.store(out_ptr + b64[:, None] * so_b + t, out, mask=(t < K + 1) & live[:, None])
    tl.store(num_accepted_ptr + b, j, mask=live)


@triton.jit
def emit_kernel(
    target_ptr, draft_ptr, tokens_ptr,  # logits [B, K+1, V], [B, K, V] (target again when absent); drafts int [B, K]
    temperature_ptr, min_p_ptr, seed_ptr, offset_ptr, positions_ptr,  # [B]: fp32, fp32, int64, int64, int64
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr,  # [B * NPOS] stats of every distribution
    q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr,  # [B, NCHUNK] chunk candidates: fp32, i32, fp32, i32, i32
    ticket_ptr, out_ptr, num_accepted_ptr,  # int32 [cdiv(B, BLOCK_R)] (zeroed); int32 [B, K+1], int32 [B]
    B, NPOS, NCHUNK, stream, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr,
    USE_POSITIONS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_K1: tl.constexpr, BLOCK_C: tl.constexpr, FENCE: tl.constexpr, LANES: tl.constexpr = False,
    SKIP_IDENTITIES: tl.constexpr = False, EXP_KEYS: tl.constexpr = False,
):
    """grid (cdiv(B, BLOCK_R), NCHUNK): the ratio test of BLOCK_R rows, then one pass over a
    vocab chunk of each row's emitted position j: Gumbel-max candidates argmax(std_q + G) and
    argmax(log max(q - p, 0) + G), G keyed by (seed, offset, j or positions[b], stream); the
    last program of the row tile merges them (_write_tokens). No penalties."""
    _emit(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, min_p_ptr, seed_ptr, offset_ptr, positions_ptr, m_ptr,
          s2_ptr, s3_ptr, tkey_ptr, amax_ptr, q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, ticket_ptr,
          out_ptr, num_accepted_ptr, B, NPOS, NCHUNK, stream, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b, (tokens_ptr,),
          False, V, K, CHUNK, HAS_DRAFT_LOGITS, USE_POSITIONS, BLOCK_R, BLOCK_V, BLOCK_K, BLOCK_K1, BLOCK_C, FENCE,
          LANES, SKIP_IDENTITIES, EXP_KEYS)


@triton.jit
def emit_penalised_kernel(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, min_p_ptr, seed_ptr, offset_ptr, positions_ptr, m_ptr, s2_ptr,
    s3_ptr, tkey_ptr, amax_ptr, q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, ticket_ptr, out_ptr,
    num_accepted_ptr, B, NPOS, NCHUNK, stream, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
    counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb, s_pk,  # penalties
    V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr,
    USE_POSITIONS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_K1: tl.constexpr, BLOCK_C: tl.constexpr, FENCE: tl.constexpr, W: tl.constexpr, P0: tl.constexpr,
    LANES: tl.constexpr = False, SKIP_IDENTITIES: tl.constexpr = False, EXP_KEYS: tl.constexpr = False,
):
    """emit_kernel with penalties (the arguments of
    _triton_select_stream.select_stream_penalised_kernel): the ratio test's q_i(x_i), p_i(x_i)
    and the emitted position's rows read penalised logits, as the selection's statistics did.
    At K = 1 its ratio test loops over a runtime trip count: Triton 3.6 failed to compile the
    folded 1-step loop for sm_90 at some shapes (the comment in _emit)."""
    _emit(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, min_p_ptr, seed_ptr, offset_ptr, positions_ptr, m_ptr,
          s2_ptr, s3_ptr, tkey_ptr, amax_ptr, q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, ticket_ptr,
          out_ptr, num_accepted_ptr, B, NPOS, NCHUNK, stream, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
          (W, P0, counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb, s_pk), True, V,
          K, CHUNK, HAS_DRAFT_LOGITS, USE_POSITIONS, BLOCK_R, BLOCK_V, BLOCK_K, BLOCK_K1, BLOCK_C, FENCE, LANES,
          SKIP_IDENTITIES, EXP_KEYS)


@triton.jit
def _emit(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, min_p_ptr, seed_ptr, offset_ptr, positions_ptr, m_ptr, s2_ptr,
    s3_ptr, tkey_ptr, amax_ptr, q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, ticket_ptr, out_ptr,
    num_accepted_ptr, B, NPOS, NCHUNK, stream, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b, pen_args,
    PENALTY: tl.constexpr, V: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr,
    USE_POSITIONS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_K1: tl.constexpr, BLOCK_C: tl.constexpr, FENCE: tl.constexpr, LANES: tl.constexpr,
    SKIP_IDENTITIES: tl.constexpr, EXP_KEYS: tl.constexpr,
):
    """The emission's program; pen_args: the penalties (kernels/penalties/triton.py) or (False,)."""
    b, live = _tile_rows(B, BLOCK_R)
    c = tl.program_id(1)
    b64 = b.to(tl.int64)
    kb = num_drafts(tokens_ptr, b, sx_b, sx_k, K, BLOCK_K)
    t = tl.load(temperature_ptr + b)
    temp = tl.where(t > 0, t, 1.0)
    greedy = t == 0
    min_p = tl.load(min_p_ptr + b)
    seed = tl.load(seed_ptr + b)
    offset = tl.load(offset_ptr + b)
    zero = tl.zeros([BLOCK_R], tl.int32)
    skips = identity_skips(temp, min_p, SKIP_IDENTITIES)

    # Ratio test: accept x_i iff p(x_i) > 0 and u_i * p(x_i) < q(x_i), until the first rejection.
    # One position after another. All K positions in one [BLOCK_R, BLOCK_K] tile (two dependent
    # rounds to memory instead of two per position) was measured against this loop on an H200
    # (bench/results/h200_2026-11-27c, K = 4, V = 128256): B = 1 T = 1 verify 28.0 against 28.4 us,
    # B = 64 T = 1 290.9 against 254.9 us. Not kept: the B = 1 emission's 18 us are not this chain.
    j = zero
    alive = kb >= 0
    # With penalties and K = 1, a runtime trip count (= K: NPOS > K) instead of the constexpr K.
    # Measured (triton 3.6, sm_90, e.g. fp16 / fp32, B = 3, V = 33: BLOCK_R = 4, BLOCK_V = 64): a
    # 1-step constexpr loop is folded away, and TritonGPURemoveLayoutConversions, rematerialising
    # the chain accept -> j -> jd in the [BLOCK_R, 1] layout of the penalty columns (pen_q, pen_p),
    # rewired b * NPOS + j (the _stats offsets) to the new j only, then failed: "'arith.addi' op
    # requires the same encoding for all operands and results". Kept as an scf.for (as for
    # K >= 2, which compiles), j is a loop result, and every K = 1 shape of the grid compiles (an
    # observation, not a guarantee: the pass is erratic). Neither W = 2 in penalise nor a K = 1
    # case of num_drafts fixed every shape; tests/kernels/_compile_verify_kernels.py --grid is the
    # check. Penalty-free kernels keep
    # the constexpr loop (their PTX is unchanged: tests/kernels/test_verify_triton_compiles.py).
    if PENALTY and K == 1:
        steps = tl.minimum(NPOS, K)
    else:
        steps = K
    for i in range(0, steps):
        x = tl.load(tokens_ptr + b64 * sx_b + i * sx_k)
        x = tl.minimum(tl.maximum(x, 0), V - 1).to(tl.int32)
        m, s2, s3, tkey, amax = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + i)
        z = tl.load(target_ptr + b64 * st_b + i * st_k + x)
        if PENALTY:  # position i: the drafts x_0..x_{i-1} in front of it
            z = penalise(z.to(tl.float32), x, x >= 0, row_penalty(pen_args, b, i))
        divide, by_min_p = skips
        _, q_x = standardised(z, x, temp, greedy, m, s2, s3, tkey, amax, min_p, divide, by_min_p)
        if HAS_DRAFT_LOGITS:
            m, s2, s3, tkey, amax = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + K + 1 + i)
            z = tl.load(draft_ptr + b64 * sd_b + i * sd_k + x)
            if PENALTY:
                z = penalise(z.to(tl.float32), x, x >= 0, row_penalty(pen_args, b, i))
            _, p_x = standardised(z, x, temp, greedy, m, s2, s3, tkey, amax, min_p, divide, by_min_p)
        else:
            p_x = tl.full([BLOCK_R], 1.0, tl.float32)
        u = uniform_from_bits(philox_bits(seed, offset, zero + i, _STREAM_ACCEPT, zero))
        accept = alive & (i < kb) & (p_x > 0) & (u * p_x < q_x)
        j += accept.to(tl.int32)
        alive = accept

    # Emission at position j: residual max(q_j - p_j, 0) where rejected, else (and as the
    # fallback for an empty residual) q_j itself.
    rejected = j < kb
    if USE_POSITIONS:
        noise_position = tl.load(positions_ptr + b)
    else:
        noise_position = j.to(tl.int64)
    jd = tl.maximum(tl.minimum(j, K - 1), 0)
    xj = tl.load(tokens_ptr + b64 * sx_b + jd * sx_k, mask=jd < K, other=0)
    mq, s2q, s3q, tkq, amq = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + j)
    if HAS_DRAFT_LOGITS:
        mp, s2p, s3p, tkp, amp = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + K + 1 + jd)
    q_row = b64 * st_b + j * st_k
    p_row = b64 * sd_b + jd * sd_k
    pen_q = pen_args
    pen_p = pen_args
    if PENALTY:  # positions j and jd = j (when read) of the rows, as [BLOCK_R, 1] columns
        pen_q = row_penalty(pen_args, b[:, None], j[:, None])
        pen_p = row_penalty(pen_args, b[:, None], jd[:, None])
    start = c * CHUNK
    if not HAS_DRAFT_LOGITS:  # unread (_p_tile: p is the one-hot of the draft then)
        mp, s2p, s3p, tkp, amp = mq, s2q, s3q, tkq, amq
    if LANES:
        q_lane, q_lane_arg, r_lane, r_lane_arg, r_lane_any = _emit_pass_lanes(
            target_ptr, draft_ptr, q_row, p_row, pen_q, pen_p, temp, greedy, min_p, mq, s2q, s3q, tkq, amq, mp, s2p, s3p,
            tkp, amp, seed, offset, noise_position, stream, rejected, xj, start, skips, PENALTY, V, CHUNK,
            HAS_DRAFT_LOGITS, BLOCK_R, BLOCK_V, EXP_KEYS)
        q_best, q_arg = _lanes_reduced(q_lane, q_lane_arg, start)
        r_best, r_arg = _lanes_reduced(r_lane, r_lane_arg, start)
        r_any = tl.max(r_lane_any, axis=1)
    else:
        q_best = tl.full([BLOCK_R], NEG_INF, tl.float32)
        q_arg = zero + start
        r_best = q_best
        r_arg = q_arg
        r_any = zero
        any_rejected = tl.max(rejected.to(tl.int32), axis=0) > 0
        for v0 in range(0, CHUNK, BLOCK_V):
            idx = (start + v0 + tl.arange(0, BLOCK_V))[None, :]
            inside = idx < V
            std_q, q = _q_tile(target_ptr, q_row, idx, inside, pen_q, temp, greedy, min_p, mq, s2q, s3q, tkq, amq,
                               skips, PENALTY)
            # The noise (Philox, the bulk of this kernel's work) only where a value could still win:
            # 1 / E <= NOISE_RATIO_MAX, and the residual max(q - p, 0) <= q. Skipped tiles
            # change nothing (a later index replaces the best only when strictly larger). Greedy
            # and truncated (top-k / top-p / min-p) rows skip most of the vocab this way.
            q_top = _q_weight(std_q, q, mq[:, None], EXP_KEYS)
            could_q = tl.max(q_top, axis=1) * NOISE_RATIO_MAX >= q_best
            could_r = rejected & (tl.max(q, axis=1) * NOISE_RATIO_MAX >= r_best)
            if tl.max((could_q | could_r).to(tl.int32), axis=0) > 0:
                inv_e = 1.0 / exponential_from_bits(tile_bits(seed[:, None], offset[:, None], noise_position[:, None],
                                                              stream, start + v0, idx, BLOCK_V))
                q_best, q_arg = _argmax_update(q_best, q_arg, q_top * inv_e, idx)
                if any_rejected:
                    p = _p_tile(draft_ptr, p_row, idx, inside, rejected, xj, pen_p, temp, greedy, min_p, mp, s2p, s3p,
                                tkp, amp, skips, PENALTY, HAS_DRAFT_LOGITS)
                    r = tl.maximum(q - p, 0.0)
                    positive = inside & rejected[:, None] & (r > 0)
                    r_any = tl.maximum(r_any, tl.max(positive.to(tl.int32), axis=1))
                    r_best, r_arg = _argmax_update(r_best, r_arg, tl.where(positive, r * inv_e, NEG_INF), idx)
            elif any_rejected:
                # r_any must still see every positive residual entry of the row.
                p = _p_tile(draft_ptr, p_row, idx, inside, rejected, xj, pen_p, temp, greedy, min_p, mp, s2p, s3p, tkp,
                            amp, skips, PENALTY, HAS_DRAFT_LOGITS)
                positive = inside & rejected[:, None] & (tl.maximum(q - p, 0.0) > 0)
                r_any = tl.maximum(r_any, tl.max(positive.to(tl.int32), axis=1))
    out = b * NCHUNK + c
    tl.store(q_val_ptr + out, q_best, mask=live)
    tl.store(q_idx_ptr + out, q_arg, mask=live)
    tl.store(r_val_ptr + out, r_best, mask=live)
    tl.store(r_idx_ptr + out, r_arg, mask=live)
    tl.store(r_any_ptr + out, r_any, mask=live)
    if last_program_of(ticket_ptr + tl.program_id(0), NCHUNK, FENCE):
        tl.debug_barrier()
        _write_tokens(tokens_ptr, q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, out_ptr, num_accepted_ptr,
                      b, live, j, kb, NCHUNK, sx_b, sx_k, so_b, K, BLOCK_K1, BLOCK_C)


