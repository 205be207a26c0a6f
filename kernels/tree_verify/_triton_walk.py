"""tree_verify's walk without its scan: every node's accept test at once, then a chase down the
accepted path (launched by triton.py when the plan's walk_parallel is on; _triton_kernels.py's
walk_kernel is the scan it replaces, and the two give the same tokens bit for bit).

Why the tests need no scan: when the walk reaches node c it stands at c's parent, and every
earlier sibling of c has been tested and rejected (the walk only leaves a node by accepting a
child, and never returns). So the state c is tested under -- lam, and the mass W its ratio test
divides by -- depends only on c's rank among its siblings: after r rejections lam_r = 1 + W_1 +
... + W_{r-1} (lam_0 = 0) and the mass is W_r (W_0 = 1), the residual masses of the parent
(residual_mass_kernel's table), summed in the scan's order, so the same bits; without draft
logits the mass is 1 - q(s_1) - q(s_2) - ... over the earlier siblings whose tokens are new,
subtracted in the scan's order; greedy rows accept the child on a longest path of target argmaxes
(lowest index on ties). The accepted child of a node is its first child that passes its test; the
path follows those from the root, one reduction per level instead of a dependent step per node
(N - 1 of them, each waiting on a load: the scan's latency at B = 1).

One row per program: its [BLOCK_N, BLOCK_N] tiles (rows: a node as sibling or parent, columns: a
node) hold the tree's relations.
"""
import triton
import triton.language as tl

from ..rng import STREAM_ACCEPT
from ..rng.triton import philox_bits, uniform_from_bits
from ..verify._triton_common import BIG_INDEX, standardised
from ..verify._triton_emit import _stats

_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)


@triton.jit
def _pick(values, at, index):
    """values[at] of a vector values [BLOCK_N] (index: its positions), at a scalar: one reduction."""
    return tl.sum(tl.where(index == at, values, 0), axis=0)


@triton.jit
def walk_parallel_kernel(
    target_ptr, draft_ptr, tokens_ptr, parents_ptr, temperature_ptr, min_p_ptr, seed_ptr, offset_ptr,
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, mass_ptr,
    path_ptr, out_ptr, num_accepted_ptr, final_ptr, lam_ptr, removed_ptr, num_removed_ptr,
    NPOS, KMAX, st_b, st_n, sd_b, sd_n, sx_b, sp_b,
    N: tl.constexpr, V: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_N: tl.constexpr,
    GREEDY_BONUS: tl.constexpr,
):
    """grid (B,): the outputs of walk_kernel for row b (path [B, N], out [B, N] with the accepted
    tokens, num_accepted, final, lam, removed / num_removed; GREEDY_BONUS: out[b, j] = the final
    node's argmax). mass [B * N, N]: W_k of node n at (b * N + n) * N + k, for k < KMAX."""
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    c = tl.arange(0, BLOCK_N)
    in_row = c < N
    par = tl.load(parents_ptr + b64 * sp_b + c, mask=in_row, other=-1).to(tl.int32)
    tok = tl.minimum(tl.maximum(tl.load(tokens_ptr + b64 * sx_b + c, mask=in_row, other=0), 0), V - 1).to(tl.int32)
    present = in_row & (c > 0) & (par >= 0) & (par < c)
    pc = tl.where(present, par, 0)
    t = tl.load(temperature_ptr + b)
    greedy = t == 0
    temp = tl.where(t > 0, t, 1.0)
    min_p = tl.load(min_p_ptr + b)
    seed = tl.load(seed_ptr + b)
    offset = tl.load(offset_ptr + b)

    # The tree's relations: kid[p, c] (c is a child of p), sib[s, c] (s is an earlier sibling of c).
    rows = tl.arange(0, BLOCK_N)[:, None]
    kid = (par[None, :] == rows) & present[None, :]
    sib = (par[:, None] == par[None, :]) & present[:, None] & present[None, :] & (rows < c[None, :])
    rank = tl.sum(sib.to(tl.int32), axis=0)  # earlier siblings of c: the rejections before its test
    last_kid = tl.max(tl.where(kid, c[None, :], -1), axis=1)  # [p]

    # Each node's coin, and q (and p) at its parent of its token.
    u = uniform_from_bits(philox_bits(seed, offset, tl.maximum(c - 1, 0), _STREAM_ACCEPT, c * 0))
    qm, qs2, qs3, qtk, qam = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + pc)
    zq = tl.load(target_ptr + b64 * st_b + pc * st_n + tok, mask=in_row, other=0.0)
    _, q_x = standardised(zq, tok, temp, greedy, qm, qs2, qs3, qtk, qam, min_p)
    if HAS_DRAFT_LOGITS:
        dc = tl.minimum(pc, N - 2)
        pm, ps2, ps3, ptk, pam = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + N + dc)
        zp = tl.load(draft_ptr + b64 * sd_b + dc * sd_n + tok, mask=in_row, other=0.0)
        _, p_x = standardised(zp, tok, temp, greedy, pm, ps2, ps3, ptk, pam, min_p)
        w_at = (b64 * N + pc) * N
        mass = tl.load(mass_ptr + w_at + tl.minimum(rank, N - 1), mask=present & (rank > 0), other=1.0)
        lam = tl.where(rank > 0, 1.0, 0.0)
        for k in range(1, KMAX):  # lam_r = 1 + W_1 + ... + W_{r-1}, in the scan's order
            w = tl.load(mass_ptr + w_at + k, mask=present & (rank > k), other=0.0)
            lam = tl.where(rank > k, lam + w, lam)
        ok = (p_x > 0) & (u * p_x * mass < tl.maximum(q_x - lam * p_x, 0.0))
        lam_after = lam + mass  # lam once c is rejected
    else:
        repeated = tl.max((sib & (tok[:, None] == tok[None, :])).to(tl.int32), axis=0) > 0
        mass = tl.full([BLOCK_N], 1.0, tl.float32)
        for r in range(0, KMAX - 1):  # the sibling of rank r leaves its q, in the scan's order (ranks < KMAX)
            at_r = sib & (rank[:, None] == r)  # one s per column c of rank > r
            q_r = tl.sum(tl.where(at_r, q_x[:, None], 0.0), axis=0)
            new_r = tl.max((at_r & (repeated[:, None] == 0)).to(tl.int32), axis=0) > 0
            mass = tl.where((rank > r) & new_r, mass - q_r, mass)
        ok = (repeated == 0) & (u * mass < q_x)
        lam_after = tl.full([BLOCK_N], 1.0, tl.float32)

    # Greedy rows: the child on a longest path of good nodes (target argmax tokens), lowest index.
    good = present & (tok == qam)
    if greedy:
        height = tl.zeros([BLOCK_N], tl.int32)  # good nodes below, along the longest path
        grown = 1
        while grown > 0:
            taller = tl.max(tl.where(kid & good[None, :], height[None, :] + 1, 0), axis=1)
            grown = tl.max((taller != height).to(tl.int32), axis=0)
            height = taller
        best = tl.min(tl.where(kid & good[None, :] & (height[None, :] + 1 == height[:, None]), c[None, :], BIG_INDEX),
                      axis=1)  # [p]
        best_of_parent = tl.sum(tl.where(rows == par[None, :], best[:, None], 0), axis=0)
        ok = present & (best_of_parent == c)
    next_kid = tl.min(tl.where(kid & ok[None, :], c[None, :], BIG_INDEX), axis=1)  # [p]: the child the walk accepts

    # The accepted path from the root: one level per step.
    cur = 0
    j = 0
    depth = tl.zeros([BLOCK_N], tl.int32) - 1  # a path node's place on the path, else -1
    depth = tl.where(c == 0, 0, depth)
    nxt = _pick(next_kid, 0, c)
    while nxt < BIG_INDEX:
        cur = nxt
        j += 1
        depth = tl.where(c == cur, j, depth)
        nxt = _pick(next_kid, cur, c)

    slots = tl.arange(0, BLOCK_N)[:, None]
    on_path = depth[None, :] == slots  # [slot, c]
    path = tl.max(tl.where(on_path, c[None, :], -1), axis=1)
    out = tl.max(tl.where(depth[None, :] == slots + 1, tok[None, :], -1), axis=1)
    if GREEDY_BONUS:
        out = tl.where(c == j, tl.load(amax_ptr + b * NPOS + cur), out)
    tl.store(path_ptr + b64 * N + c, path, mask=in_row)
    tl.store(out_ptr + b64 * N + c, out, mask=in_row)
    tl.store(num_accepted_ptr + b, j)
    tl.store(final_ptr + b, cur)
    # lam at the final node: all its children rejected (0 without children; greedy rows never reject)
    last = _pick(last_kid, cur, c)
    lam_final = tl.where((last >= 0) & (greedy == 0), _pick(lam_after, last, c), 0.0)
    tl.store(lam_ptr + b, lam_final)
    kids = kid & (rows == cur)
    final_kid = tl.max(kids.to(tl.int32), axis=0) > 0  # [c]
    slot = tl.cumsum(final_kid.to(tl.int32), axis=0) - 1
    tl.store(removed_ptr + b64 * N + slot, tok, mask=final_kid)
    tl.store(num_removed_ptr + b, tl.sum(final_kid.to(tl.int32), axis=0))
