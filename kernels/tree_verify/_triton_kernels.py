"""Triton kernels of tree_verify after the standardisation statistics (launched by triton.py).

The statistics of every node's target row (stats position b * NPOS + n) and draft row
(b * NPOS + N + n) come from kernels/verify's stats kernels; ``standardised`` rebuilds any
standardised value from them on the fly (kernels/verify/_triton_common.py). The residual masses
W_k of the sibling tests, which the walk reads, are _triton_residual.py's.
  walk_kernel           row tiles: presence, the greedy longest path, the rejection walk (and,
                        when every row is greedy, the emitted token: the final node's argmax)
  emit_kernel           (row tile, vocab chunk): Gumbel-max candidates at each final node; the
                        tile's last program merges the chunks and writes the emitted token
Masks are int32, not i1: the CPU interpreter cannot broadcast an i1 scalar.
"""
import triton
import triton.language as tl

from ..rng import STREAM_ACCEPT
from ..rng.triton import exponential_from_bits, philox_bits, tile_bits, uniform_from_bits
from .._triton_sync import last_program_of
from ..verify._triton_common import NEG_INF, found_or_zero, standardised
from ..verify._triton_emit import _argmax_update, _stats, _tile_rows, merge_chunk_candidates, noise_weight

_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)


@triton.jit
def walk_kernel(
    target_ptr, draft_ptr, tokens_ptr, parents_ptr, temperature_ptr, min_p_ptr, seed_ptr, offset_ptr,
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, mass_ptr, node_f_ptr, node_i_ptr,
    path_ptr, out_ptr, num_accepted_ptr, final_ptr, lam_ptr, removed_ptr, num_removed_ptr,
    B, NPOS, st_b, st_n, sd_b, sd_n, sx_b, sp_b,
    N: tl.constexpr, V: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    GREEDY_BONUS: tl.constexpr,
):
    """grid (cdiv(B, BLOCK_R),): the walk of reference.py for BLOCK_R rows, as its ascending scan
    over the nodes. Valid trees assumed (check_tree): node i >= 1 is present iff 0 <= parents[i] < i.
    Prologue, for all nodes at once ([BLOCK_R, BLOCK_N] tiles): each node's coin, q and p at its
    parent of its token, whether it is good (greedy) and whether an earlier sibling has its token,
    written to the scratch node_f [3, B, N] (q, p, coin) / node_i [4, B, N] (good, repeat, best,
    choice), so that every scan step reads a few values instead of reducing tiles. Writes path
    [B, N], out [B, N] (accepted tokens; emit_kernel writes the final token), num_accepted, the
    final node, its lam, and the final node's children's tokens, packed: removed [B, N], num_removed.
    GREEDY_BONUS (every row greedy, known on the host): out[b, j] = the final node's target argmax
    (amax, lowest index: what the emission's Gumbel-max of a one-hot q gives), and no emission
    launch follows."""
    b, live = _tile_rows(B, BLOCK_R)
    b64 = b.to(tl.int64)
    nid = tl.arange(0, BLOCK_N)[None, :]
    in_row = (nid < N) & live[:, None]
    par = tl.load(parents_ptr + b64[:, None] * sp_b + nid, mask=nid < N, other=-1).to(tl.int32)
    tok = tl.load(tokens_ptr + b64[:, None] * sx_b + nid, mask=nid < N, other=0)
    tok = tl.minimum(tl.maximum(tok, 0), V - 1).to(tl.int32)
    t = tl.load(temperature_ptr + b)
    temp = tl.where(t > 0, t, 1.0)[:, None]
    greedy = t == 0
    min_p = tl.load(min_p_ptr + b)[:, None]
    seed = tl.load(seed_ptr + b)
    offset = tl.load(offset_ptr + b)
    zero = tl.zeros([BLOCK_R], tl.int32)
    plane = B * N  # scratch planes [B, N]
    at = b64[:, None] * N + nid

    # Prologue: per node c, its coin and q / p at its parent of its token.
    present = (nid > 0) & (par >= 0) & (par < nid)
    pc = tl.where(present, par, 0)
    u_all = uniform_from_bits(philox_bits(seed[:, None], offset[:, None], tl.maximum(nid - 1, 0), _STREAM_ACCEPT, nid * 0))
    qm, qs2, qs3, qtk, qam = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b[:, None] * NPOS + pc)
    zq = tl.load(target_ptr + b64[:, None] * st_b + pc * st_n + tok, mask=in_row, other=0.0)
    _, q_all = standardised(zq, tok, temp, greedy[:, None], qm, qs2, qs3, qtk, qam, min_p)
    tl.store(node_f_ptr + at, q_all, mask=in_row)
    tl.store(node_f_ptr + 2 * plane + at, u_all, mask=in_row)
    if HAS_DRAFT_LOGITS:
        dc = tl.minimum(pc, N - 2)
        pm, ps2, ps3, ptk, pam = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b[:, None] * NPOS + N + dc)
        zp = tl.load(draft_ptr + b64[:, None] * sd_b + dc * sd_n + tok, mask=in_row, other=0.0)
        _, p_all = standardised(zp, tok, temp, greedy[:, None], pm, ps2, ps3, ptk, pam, min_p)
        tl.store(node_f_ptr + plane + at, p_all, mask=in_row)
    else:
        twin = tl.zeros([BLOCK_R, BLOCK_N], tl.int32)
        for s in range(1, N):  # an earlier sibling s with the same token
            par_s = tl.load(parents_ptr + b64 * sp_b + s).to(tl.int32)
            tok_s = tl.minimum(tl.maximum(tl.load(tokens_ptr + b64 * sx_b + s), 0), V - 1).to(tl.int32)
            same = (nid > s) & (par == par_s[:, None]) & (tok == tok_s[:, None]) & ((par_s >= 0) & (par_s < s))[:, None]
            twin = tl.maximum(twin, same.to(tl.int32))
        tl.store(node_i_ptr + plane + at, twin, mask=in_row)
    tl.store(node_i_ptr + at, (present & (tok == qam)).to(tl.int32), mask=in_row)  # qam: the argmax at the parent
    tl.store(node_i_ptr + 2 * plane + at, tl.zeros([BLOCK_R, BLOCK_N], tl.int32), mask=in_row)
    tl.store(node_i_ptr + 3 * plane + at, tl.full([BLOCK_R, BLOCK_N], -1, tl.int32), mask=in_row)
    tl.store(path_ptr + at, tl.where(nid == 0, 0, -1), mask=in_row)
    tl.store(out_ptr + at, tl.full([BLOCK_R, BLOCK_N], -1, tl.int32), mask=in_row)
    tl.debug_barrier()  # the scan below reads what other threads wrote

    row = b64 * N
    # Greedy rows: the longest path of good nodes (descending scan; '>=': lower indices win ties).
    if tl.max(greedy.to(tl.int32), axis=0) > 0:
        for s in range(0, N - 1):
            i = N - 1 - s
            pi = tl.load(parents_ptr + b64 * sp_b + i).to(tl.int32)
            good = (tl.load(node_i_ptr + row + i) > 0) & greedy & live
            cand = tl.load(node_i_ptr + 2 * plane + row + i) + 1
            upd = good & (cand >= tl.load(node_i_ptr + 2 * plane + row + pi, mask=good, other=0))
            tl.store(node_i_ptr + 2 * plane + row + pi, cand, mask=upd)
            tl.store(node_i_ptr + 3 * plane + row + pi, zero + i, mask=upd)
            tl.debug_barrier()

    # The walk: an ascending scan (a node's children come after it).
    cur = zero
    j = zero
    k = zero  # children of cur rejected so far
    lam = tl.zeros([BLOCK_R], tl.float32)
    mass = tl.full([BLOCK_R], 1.0, tl.float32)
    for c in range(1, N):
        x = tl.minimum(tl.maximum(tl.load(tokens_ptr + b64 * sx_b + c), 0), V - 1).to(tl.int32)
        par_c = tl.load(parents_ptr + b64 * sp_b + c).to(tl.int32)
        child = par_c == cur  # cur < c always: a present child of cur
        q_x = tl.load(node_f_ptr + row + c)
        u = tl.load(node_f_ptr + 2 * plane + row + c)
        if HAS_DRAFT_LOGITS:
            p_x = tl.load(node_f_ptr + plane + row + c)
            ok = (p_x > 0) & (u * p_x * mass < tl.maximum(q_x - lam * p_x, 0.0))
            lam_rej = lam + mass
            mass_rej = tl.load(mass_ptr + (row + cur) * N + tl.minimum(k + 1, N - 1))
        else:
            repeated = tl.load(node_i_ptr + plane + row + c) > 0
            ok = (repeated == 0) & (u * mass < q_x)
            lam_rej = tl.full([BLOCK_R], 1.0, tl.float32)
            mass_rej = tl.where(repeated, mass, mass - q_x)
        ok = tl.where(greedy, tl.load(node_i_ptr + 3 * plane + row + cur) == c, ok)
        accept = child & ok
        reject = child & (ok == 0) & (greedy == 0)
        lam = tl.where(accept, 0.0, tl.where(reject, lam_rej, lam))
        mass = tl.where(accept, 1.0, tl.where(reject, mass_rej, mass))
        k = tl.where(accept, 0, tl.where(reject, k + 1, k))
        cur = tl.where(accept, c, cur)
        j = j + accept.to(tl.int32)
        tl.store(path_ptr + row + j, zero + c, mask=accept & live)
        tl.store(out_ptr + row + j - 1, x, mask=accept & live)

    tl.store(num_accepted_ptr + b, j, mask=live)
    if GREEDY_BONUS:
        tl.store(out_ptr + row + j, found_or_zero(tl.load(amax_ptr + b * NPOS + cur)), mask=live)
    tl.store(final_ptr + b, cur, mask=live)
    tl.store(lam_ptr + b, lam, mask=live)
    # The final node's children (all rejected), packed first: the deterministic residual removes them.
    kids = (present & (par == cur[:, None])).to(tl.int32)
    slot = tl.cumsum(kids, axis=1) - 1
    tl.store(removed_ptr + b64[:, None] * N + slot, tok, mask=(kids > 0) & in_row)
    tl.store(num_removed_ptr + b, tl.sum(kids, axis=1), mask=live)


@triton.jit
def emit_kernel(
    target_ptr, draft_ptr, temperature_ptr, min_p_ptr, seed_ptr, offset_ptr,
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr,
    num_accepted_ptr, final_ptr, lam_ptr, removed_ptr, num_removed_ptr,
    q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, ticket_ptr, out_ptr,
    B, NPOS, NCHUNK, stream, st_b, st_n, sd_b, sd_n,
    N: tl.constexpr, V: tl.constexpr, CHUNK: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr, FENCE: tl.constexpr,
):
    """grid (cdiv(B, BLOCK_R), NCHUNK): one pass over a vocab chunk of each row's final node f:
    Gumbel-max candidates argmax(std_q + G) and argmax(log max(q - lam p~, 0) + G), G keyed by
    (seed, offset, depth j, stream); p~ = p_f, or the indicator of the removed tokens; written
    per chunk [B, NCHUNK]. The program that takes the row tile's last ticket (ticket_ptr
    [cdiv(B, BLOCK_R)], zero at the start, left zero) merges the chunks in chunk order (ties to
    the lowest index) and writes out[b, j] = y: the residual's where a child of f was rejected
    and the residual has mass, else q's. (The merge was a launch of its own: one graph node more.)"""
    b, live = _tile_rows(B, BLOCK_R)
    c = tl.program_id(1)
    b64 = b.to(tl.int64)
    t = tl.load(temperature_ptr + b)
    temp = tl.where(t > 0, t, 1.0)
    greedy = t == 0
    min_p = tl.load(min_p_ptr + b)
    seed = tl.load(seed_ptr + b)
    offset = tl.load(offset_ptr + b)
    j = tl.load(num_accepted_ptr + b)
    f = tl.load(final_ptr + b)
    lam = tl.load(lam_ptr + b)
    rejected = (lam > 0) & (greedy == 0)
    mq, s2q, s3q, tkq, amq = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + f)
    df = tl.minimum(f, N - 2)
    if HAS_DRAFT_LOGITS:
        mp, s2p, s3p, tkp, amp = _stats(m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr, b * NPOS + N + df)
    else:
        num_removed = tl.where(rejected, tl.load(num_removed_ptr + b), 0)
        most_removed = tl.max(num_removed, axis=0)
    q_row = b64 * st_b + f * st_n
    p_row = b64 * sd_b + df * sd_n
    start = c * CHUNK
    zero = tl.zeros([BLOCK_R], tl.int32)
    q_best = tl.full([BLOCK_R], NEG_INF, tl.float32)
    q_arg = zero + start
    r_best = q_best
    r_arg = q_arg
    r_any = zero
    any_rejected = tl.max(rejected.to(tl.int32), axis=0) > 0
    for v0 in range(0, CHUNK, BLOCK_V):
        idx = (start + v0 + tl.arange(0, BLOCK_V))[None, :]
        inside = idx < V
        zq = tl.load(target_ptr + q_row[:, None] + idx, mask=inside, other=NEG_INF)
        std_q, q = standardised(zq, idx, temp[:, None], greedy[:, None], mq[:, None], s2q[:, None], s3q[:, None],
                                tkq[:, None], amq[:, None], min_p[:, None])
        # Gumbel-max in ratio form (kernels/verify/_triton_emit.py, NOISE_RATIO_MAX's note): keys q / E, r / E
        inv_e = 1.0 / exponential_from_bits(tile_bits(seed[:, None], offset[:, None], j[:, None], stream, start + v0,
                                                      idx, BLOCK_V))
        q_best, q_arg = _argmax_update(q_best, q_arg, tl.where(inside, noise_weight(std_q, q) * inv_e, NEG_INF), idx)
        if any_rejected:
            if HAS_DRAFT_LOGITS:
                zp = tl.load(draft_ptr + p_row[:, None] + idx, mask=inside & rejected[:, None], other=NEG_INF)
                _, p = standardised(zp, idx, temp[:, None], greedy[:, None], mp[:, None], s2p[:, None], s3p[:, None],
                                    tkp[:, None], amp[:, None], min_p[:, None])
            else:
                p = tl.zeros([BLOCK_R, BLOCK_V], tl.float32)
                for e in range(0, most_removed):
                    gone = tl.load(removed_ptr + b64 * N + e, mask=e < num_removed, other=-1)
                    p = tl.where(idx == gone[:, None], 1.0, p)
            r = tl.maximum(q - lam[:, None] * p, 0.0)
            positive = inside & rejected[:, None] & (r > 0)
            r_any = tl.maximum(r_any, tl.max(positive.to(tl.int32), axis=1))
            r_val = tl.where(positive, r * inv_e, NEG_INF)
            r_best, r_arg = _argmax_update(r_best, r_arg, r_val, idx)
    out = b * NCHUNK + c
    tl.store(q_val_ptr + out, q_best, mask=live)
    tl.store(q_idx_ptr + out, q_arg, mask=live)
    tl.store(r_val_ptr + out, r_best, mask=live)
    tl.store(r_idx_ptr + out, r_arg, mask=live)
    tl.store(r_any_ptr + out, r_any, mask=live)
    if last_program_of(ticket_ptr + tl.program_id(0), NCHUNK, FENCE):
        tl.debug_barrier()
        y_q, y_r, chunks_any = merge_chunk_candidates(q_val_ptr, q_idx_ptr, r_val_ptr, r_idx_ptr, r_any_ptr, b, NCHUNK,
                                                      BLOCK_C)
        y = tl.where(rejected & (chunks_any > 0), y_r, y_q)
        tl.store(out_ptr + b64 * N + j, y, mask=live)
