"""The residual masses of tree_verify's sibling tests (sampled children), on the nodes that have
siblings to test only.

For a node n with m children (i.i.d. draws from its draft distribution p), the k-th child is
tested against the residual left by the first k - 1: lam_0 = 0, W_0 = 1, lam_k = lam_{k-1} +
W_{k-1}, W_k = sum_v max(q_n - lam_k p_n, 0) (reference.py). W_k is needed where m > k: one
launch per k = 1 .. kmax - 1, since W_k depends on W_{k-1} (or one launch with a grid barrier
between the k, the fused kernel below).

  residual_rows_kernel  (row,): the row's nodes ordered by their number of children, most first,
                        and per k how many have more than k: the nodes of launch k are a prefix
  residual_mass_kernel  (programs,), once per k: the programs work on those nodes only (tiles of
                        BLOCK_S nodes: one on a GPU, many under the interpreter, which pays per
                        operation), each tile's vocabulary split over the programs to spare
  residual_masses_fused_kernel
                        (programs,), once: both of the above in one launch, a grid-wide barrier
                        (kernels/_triton_sync.py grid_barrier) between the rows and each k, the
                        same work per k as the launches (_triton_plan.RESIDUAL_FUSED)

Measured reason (NVIDIA H200, B = 1, N = 64, V = 128256, T = 1, TokenTree.default(64): 8, 4, 3,
2, 1 nodes with more than k = 1 .. 5 children): the former grid tiled all B * N (row, node) pairs,
two per program, by vocab chunks of 8192, so only the tiles holding a node with siblings worked:
16 programs per such node, each over 2 x 8192 logits of q and of p (half of them the masked -inf
of the row beside it). Nsight Compute (bench/results/h200_2026-11-27b): 105-112 us a launch
whatever the number of nodes, 9.5-13.7% achieved occupancy, 0.8-1.0 instructions a cycle on the
busy SMs, 0.1-0.8% of DRAM bandwidth: a few programs' instruction latency, not bytes.
"""
import triton
import triton.language as tl

from .._triton_sync import grid_barrier, last_program_of
from ..verify._triton_common import identity_skips, standardised
from ..verify._triton_emit import _stats


@triton.jit
def _row_order(b, parents_ptr, temperature_ptr, order_ptr, count_ptr, B, KMAX, sp_b,
               N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Row b's order [N] and count [KMAX] (residual_rows_kernel's docstring)."""
    b64 = tl.cast(b, tl.int64)  # b: a program id, or a loop's index (a Python int under the interpreter)
    nid = tl.arange(0, BLOCK_N)
    valid = nid < N
    par = tl.load(parents_ptr + b64 * sp_b + nid, mask=valid, other=-1)
    # m[n] = #{i : parents[i] = n, i > n}: rows n, columns i
    m = tl.sum(((par[None, :] == nid[:, None]) & (nid[None, :] > nid[:, None])).to(tl.int32), axis=1)
    # rank[n] = #{valid i before n}: more children, or as many and a lower index (padding: none)
    before = ((m[None, :] > m[:, None]) | ((m[None, :] == m[:, None]) & (nid[None, :] < nid[:, None])))
    rank = tl.sum((before & valid[None, :]).to(tl.int32), axis=1)
    tl.store(order_ptr + b64 * N + rank, nid, mask=valid)
    kk = tl.arange(0, BLOCK_K)
    more = tl.sum(((m[None, :] > kk[:, None]) & valid[None, :]).to(tl.int32), axis=1)
    t = tl.load(temperature_ptr + b)
    tl.store(count_ptr + kk * B + b, tl.where(t > 0, more, 0), mask=kk < KMAX)


@triton.jit
def residual_rows_kernel(parents_ptr, temperature_ptr, order_ptr, count_ptr, B, KMAX, sp_b,
                         N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """grid (B,): row b's nodes by number of children m, most first, ties by index (order [B, N]
    int32: a permutation of 0 .. N - 1), and count [KMAX, B] int32: how many nodes of row b have
    more than k children, 0 where the row is greedy (temperature 0: no residual is read). Valid
    trees assumed (check_tree): node i >= 1 is present iff 0 <= parents[i] < i."""
    _row_order(tl.program_id(0), parents_ptr, temperature_ptr, order_ptr, count_ptr, B, KMAX, sp_b,
               N, BLOCK_N, BLOCK_K)


@triton.jit
def residual_mass_kernel(
    target_ptr, draft_ptr, order_ptr, count_ptr, temperature_ptr, min_p_ptr,
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, mass_ptr, lam_ptr, part_ptr, ticket_ptr,
    k, B, NPOS, st_b, st_n, sd_b, sd_n,
    N: tl.constexpr, V: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_C: tl.constexpr, FENCE: tl.constexpr, SKIP_IDENTITIES: tl.constexpr = False,
):
    """grid (P,), launched for k = 1 .. KMAX - 1 in order. The nodes with more than k children
    (slots: row b's count[k, b] first nodes of order, rows in order; S slots in all) in tiles of
    BLOCK_S slots (T = cdiv(S, BLOCK_S)), each tile's vocabulary split into C = max(1, P // T)
    chunks (multiples of BLOCK_V): items tile * C + c, program p taking items p, p + P, ... Each
    item sums max(q - lam_k p, 0) over its chunk into part [item * BLOCK_S + j] for its slots j;
    the tile's last item to finish (ticket [tile]: count C, put back to zero) adds each slot's C
    parts in order, writes W_k to mass[(b * N + n) * N + k] and lam_{k+1} = lam_k + W_k to lam
    [B * N] (lam_1 = 1 is not read). The sums depend on S and P only: the same bits on every call
    for a tree. SKIP_IDENTITIES (the plan's skip_identities): an item whose live slots all have
    T = 1 does not divide each value by T, and one without min-p does not run min-p's test
    (standardised's divide / by_min_p: identities there, the same masses)."""
    _masses_at(k, tl.program_id(0), tl.num_programs(0), target_ptr, draft_ptr, order_ptr, count_ptr, temperature_ptr,
               min_p_ptr, m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, mass_ptr, lam_ptr, part_ptr, ticket_ptr,
               B, NPOS, st_b, st_n, sd_b, sd_n, N, V, BLOCK_S, BLOCK_V, BLOCK_B, BLOCK_C, FENCE, SKIP_IDENTITIES)


@triton.jit
def _masses_at(
    k, pid, P, target_ptr, draft_ptr, order_ptr, count_ptr, temperature_ptr, min_p_ptr,
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, mass_ptr, lam_ptr, part_ptr, ticket_ptr,
    B, NPOS, st_b, st_n, sd_b, sd_n,
    N: tl.constexpr, V: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_C: tl.constexpr, FENCE: tl.constexpr, SKIP_IDENTITIES: tl.constexpr,
):
    """Program pid of P's share of W_k (residual_mass_kernel's docstring). The rows' order, counts
    and lam are read through L2 (.cg): in the fused launch other programs wrote them after this
    program may have read the same lines (lam_k, then lam_{k+1} at one address)."""
    bid = tl.arange(0, BLOCK_B)
    cnt = tl.load(count_ptr + k * B + bid, mask=bid < B, other=0, cache_modifier=".cg")
    incl = tl.cumsum(cnt, axis=0)
    excl = incl - cnt
    slots = tl.sum(cnt, axis=0)
    tiles = tl.cdiv(slots, BLOCK_S)
    chunks = tl.maximum(P // tl.maximum(tiles, 1), 1)
    chunk_len = tl.cdiv(tl.cdiv(V, chunks), BLOCK_V) * BLOCK_V
    j = tl.arange(0, BLOCK_S)
    for item in range(pid, tiles * chunks, P):
        tile = item // chunks
        c = item % chunks
        slot = tile * BLOCK_S + j
        live = slot < slots
        b = tl.sum((incl[None, :] <= slot[:, None]).to(tl.int32), axis=1)  # the rows holding these slots
        b = tl.minimum(b, B - 1)
        first = tl.sum(tl.where(bid[None, :] == b[:, None], excl[None, :], 0), axis=1)
        b64 = b.to(tl.int64)
        node = tl.load(order_ptr + b64 * N + (slot - first), mask=live, other=0, cache_modifier=".cg")
        r = b * N + node
        t = tl.load(temperature_ptr + b)  # > 0 where live: greedy rows have no slots
        temp = tl.where(live, t, 1.0)
        greedy = (temp <= 0)[:, None]  # never where live
        min_p = tl.load(min_p_ptr + b)
        divide, by_min_p = identity_skips(temp, tl.where(live, min_p, 0.0), SKIP_IDENTITIES)
        later = (j * 0 + k) > 1  # lam_1 = 1 is not stored (a tensor: Triton 3.9's interpreter types a
        # scalar comparison int32 and refuses it in a mask)
        lam = tl.load(lam_ptr + r, mask=live & later, other=1.0, cache_modifier=".cg")
        dnode = tl.minimum(node, N - 2)
        qm, qs2, qs3, qtk, qam = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + node)
        pm, ps2, ps3, ptk, pam = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + N + dnode)
        q_row = b64 * st_b + node * st_n
        p_row = b64 * sd_b + dnode * sd_n
        acc = tl.zeros([BLOCK_S, BLOCK_V], tl.float32)
        start = c * chunk_len
        for v0 in range(start, tl.minimum(start + chunk_len, V), BLOCK_V):
            idx = (tl.multiple_of(v0, BLOCK_V) + tl.arange(0, BLOCK_V))[None, :]  # chunks start at multiples of BLOCK_V
            inside = (idx < V) & live[:, None]
            zq = tl.load(target_ptr + q_row[:, None] + idx, mask=inside, other=0.0)
            _, q = standardised(zq, idx, temp[:, None], greedy, qm[:, None], qs2[:, None], qs3[:, None],
                                qtk[:, None], qam[:, None], min_p[:, None], divide, by_min_p)
            zp = tl.load(draft_ptr + p_row[:, None] + idx, mask=inside, other=0.0)
            _, p = standardised(zp, idx, temp[:, None], greedy, pm[:, None], ps2[:, None], ps3[:, None],
                                ptk[:, None], pam[:, None], min_p[:, None], divide, by_min_p)
            acc += tl.where(inside, tl.maximum(q - lam[:, None] * p, 0.0), 0.0)
        tl.store(part_ptr + item * BLOCK_S + j, tl.sum(acc, axis=1))
        if last_program_of(ticket_ptr + tile, chunks, FENCE):
            parts = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
            for c0 in range(0, chunks, BLOCK_C):  # the chunks in a fixed order: deterministic
                cc = (c0 + tl.arange(0, BLOCK_C))[None, :]
                parts += tl.load(part_ptr + (tile * chunks + cc) * BLOCK_S + j[:, None], mask=cc < chunks, other=0.0,
                                 cache_modifier=".cg")
            w = tl.sum(parts, axis=1)
            tl.store(mass_ptr + r.to(tl.int64) * N + k, w, mask=live)
            tl.store(lam_ptr + r, lam + w, mask=live)


@triton.jit
def residual_masses_fused_kernel(
    parents_ptr, target_ptr, draft_ptr, order_ptr, count_ptr, temperature_ptr, min_p_ptr,
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, mass_ptr, lam_ptr, part_ptr, ticket_ptr, sync_ptr,
    B, KMAX, NPOS, sp_b, st_b, st_n, sd_b, sd_n,
    N: tl.constexpr, V: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr, FENCE: tl.constexpr,
    SKIP_IDENTITIES: tl.constexpr, SPIN_LIMIT: tl.constexpr,
):
    """grid (P,), all resident at once (the plan's promise: _triton_plan.ResidualGrid; under the
    interpreter P = 1): residual_rows_kernel for rows pid, pid + P, ..., a grid barrier, then for
    k = 1 .. KMAX - 1 residual_mass_kernel's work for k with a barrier after each k but the last
    (W_k reads lam_k, which the merges of k - 1 wrote). The same items, parts and merges as the
    launches with P programs and BLOCK_V: the same bits. sync [3] int32, zero at the start: the
    barriers' arrivals, the exit ticket (whose winner puts both back to zero) and a failure count (+1 per
    program that gave up waiting at a barrier: grid_barrier's SPIN_LIMIT; never put back, so
    that a check sees it)."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    for b in range(pid, B, P):
        _row_order(b, parents_ptr, temperature_ptr, order_ptr, count_ptr, B, KMAX, sp_b, N, BLOCK_N, BLOCK_K)
    passed = grid_barrier(sync_ptr, P, FENCE, SPIN_LIMIT)
    for k in range(1, KMAX):
        _masses_at(k, pid, P, target_ptr, draft_ptr, order_ptr, count_ptr, temperature_ptr, min_p_ptr,
                   m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, mass_ptr, lam_ptr, part_ptr, ticket_ptr,
                   B, NPOS, st_b, st_n, sd_b, sd_n, N, V, BLOCK_S, BLOCK_V, BLOCK_B, BLOCK_C, FENCE, SKIP_IDENTITIES)
        if k < KMAX - 1:
            passed = passed & grid_barrier(sync_ptr, P * (k + 1), FENCE, SPIN_LIMIT)
    if passed == 0:
        tl.atomic_add(sync_ptr + 2, 1, sem="relaxed", scope="gpu")
    if last_program_of(sync_ptr + 1, P, FENCE):  # every program is past its last barrier
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
