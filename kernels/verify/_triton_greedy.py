"""The greedy chain's tokens, written by the selection launch itself when every row is greedy
(SamplingTensors.modes == {"greedy"}, known on the host): no emission launch.

Why that is exact (reference.py, temperature 0): q_i and p_i are one-hot at the argmaxes a_i of
the target and d_i of the draft position i (p_i one-hot at the draft x_i without draft logits),
and u_i < 1, so the ratio test accepts x_i iff x_i == a_i (and x_i == d_i with draft logits).
The token after the j accepted ones is a_j in every case: a bonus or q-sample is the argmax of
std_q + G = G at a_j, -inf elsewhere; a positive residual max(q_j - p_j, 0) is one-hot at a_j.
So the tokens need only the argmax (amax) of every distribution: what the selection computes.

The selection's last program of each distribution takes a ticket of its batch row; the one
that completes the row (NPOS distributions) writes that row's tokens (last_program_of).
"""
import triton
import triton.language as tl

from ._triton_common import BIG_INDEX, found_or_zero, num_drafts


@triton.jit
def write_greedy_tokens(tokens_ptr, amax_ptr, out_ptr, num_accepted_ptr, b, live, NPOS, sx_b, sx_k, so_b,
                        V: tl.constexpr, K: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_K: tl.constexpr,
                        BLOCK_K1: tl.constexpr):
    """Rows b [BLOCK] (written where live): tokens[b] = x_0..x_{j-1}, a_j, -1, ...; num_accepted[b]
    = j, from the drafts tokens_ptr int [B, K] (-1 pads) and amax_ptr int32 [B * NPOS] (target
    position i at b * NPOS + i, draft position i at b * NPOS + K + 1 + i; written by other
    programs of this launch: read through L2)."""
    b64 = b.to(tl.int64)
    kb = num_drafts(tokens_ptr, b, sx_b, sx_k, K, BLOCK_K)
    t = tl.arange(0, BLOCK_K1)[None, :]
    x = tl.load(tokens_ptr + b64[:, None] * sx_b + t * sx_k, mask=live[:, None] & (t < K), other=-1).to(tl.int32)
    xc = tl.minimum(tl.maximum(x, 0), V - 1)  # as the emission kernel compares them
    stats_row = b[:, None] * NPOS
    a_t = tl.load(amax_ptr + stats_row + t, mask=live[:, None] & (t <= K), other=0, cache_modifier=".cg")
    match = (t < kb[:, None]) & (xc == a_t)
    if HAS_DRAFT_LOGITS:
        a_d = tl.load(amax_ptr + stats_row + K + 1 + t, mask=live[:, None] & (t < K), other=0, cache_modifier=".cg")
        match = match & (xc == a_d)
    j = tl.min(tl.where(match, BIG_INDEX, t), axis=1)  # the first position not accepted (<= K_b)
    y = found_or_zero(tl.sum(tl.where(t == j[:, None], a_t, 0), axis=1))
    out = tl.where(t < j[:, None], x, tl.where(t == j[:, None], y[:, None], -1))
    tl.store(out_ptr + b64[:, None] * so_b + t, out, mask=live[:, None] & (t < K + 1))
    tl.store(num_accepted_ptr + b, j, mask=live)
