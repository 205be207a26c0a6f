"""The spec of paged attention for N new queries per row, in plain torch (also the oracle).

Layout (per layer): k_cache, v_cache [num_blocks, block_size, Hkv, D]; block_table [B, max_blocks]
int32 (row b's logical block i is physical block block_table[b, i]); seq_lens [B] int32 counts
row b's tokens INCLUDING its n_b new ones (already appended). q [T, Hq, D] packs the rows'
queries: row b owns q[cu[b]:cu[b+1]], n_b = cu[b+1] - cu[b]; its prefix P_b = seq_lens[b] - n_b;
new query i sits at position P_b + i.

Mask: every query sees the whole prefix. Among the new tokens, query i sees token j iff j <= i
(causal) and, with a tree, bit j of tree_mask[t] is set (t = cu[b] + i: its ancestors and
itself, nodes in BFS order). causal=False is the block mask (DFlash's draft block): every query
sees every new token of its row, both ways.

Sliding window (window W): a query at position p sees no key at a position <= p - W (transformers'
sliding layers keep a key while q_pos - k_pos < W). Query i of a chain or block sits at P_b + i;
under a tree at P_b + its depth, popcount(tree_mask[t]) - 1 (its ancestors among the new tokens),
and a tree's window must be at least the row's query count, so that it never hides an ancestor
(whose positions the kernels do not know): only the prefix slides out. Chunked attention (chunk
C, Llama 4's RoPE layers): a query at position p sees keys from position (p // C) * C on, the
start of its chunk (transformers' chunked_overlay, positions counted without pads); under a tree
a node and each of its ancestors sit at prefix + their depths, so the ancestors hidden are those
of depth below the node's chunk start - prefix. Soft-capping (softcap c,
Gemma 2): each scaled score s becomes c * tanh(s / c) before the mask and the softmax. Sinks
(sinks [Hq], GPT-OSS's learned per-head logits): each query head's softmax runs over its visible
scores and its sink, whose probability weighs no value (the output's weights sum to less than 1).
Softmax in fp32; output [T, Hq, D] in q's dtype.
"""
import math

import torch

# Rows are attended together, padded to the longest, in chunks of at most this many fp32 values of
# dense K/V and scores (4 MB): long rows go one at a time, short ones by the thousand. Process CPU
# ms, 1 thread, 32 q / 8 kv heads, D 128 (this 2-core EPYC, commit a963b19), one row a chunk /
# 2^20 / 2^26 values / the per-row loop this replaced: B=8 ctx 2048 N=5 74 / 73 / 317 / 396;
# B=64 ctx 512 N=5 151 / 164 / 518 / 307; B=3000 ctx 20 N=5 (4 / 2 heads, D 16) 743 / 28 / 25 / 422.
CHUNK_VALUES = 1 << 20


def gather_rows_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` positions of each row of ``block_table`` [R, max_blocks] as a dense
    [R, length, Hkv, D] tensor. Past a row's own tokens it holds whatever its table's entries
    point at (entries outside [0, num_blocks) read block 0): callers mask those positions."""
    num_blocks, block_size = cache.shape[:2]
    pages = block_table[:, :-(-length // block_size)].long().clamp(0, num_blocks - 1)
    return cache[pages].flatten(1, 2)[:, :length]  # [R, nb, bs, Hkv, D] -> [R, length, Hkv, D]


def tree_depths(tree_bits: torch.Tensor) -> torch.Tensor:
    """Each query's depth in its tree, popcount(bits) - 1 (its ancestors among the row's new
    tokens), for int64 bitmasks of any shape (bit 63 included: the sign bit)."""
    shifts = torch.arange(64, device=tree_bits.device)
    return ((tree_bits[..., None] >> shifts) & 1).sum(-1) - 1


def visible_keys(new_tokens: torch.Tensor, lengths: torch.Tensor, query_len: int, max_len: int,
                 tree_bits: torch.Tensor | None, causal: bool, window: int | None = None,
                 chunk: int | None = None) -> torch.Tensor:
    """[R, query_len, max_len] bool: query i of row r may see the token at position j. Rows hold
    lengths[r] tokens (new_tokens[r] of them new, at the end); every query sees the whole
    prefix; new token jj (= j - prefix) is seen by query i iff jj <= i (causal) and, with a tree,
    bit jj of tree_bits[r, i] is set ([R, query_len] int64: its ancestors and itself); with
    causal=False (the block mask) every new token of the row is seen. window: keys at positions
    <= the query's position - window are hidden (the query's position: prefix + i, or prefix + its
    tree depth). chunk: keys at positions before the start of the query's chunk, (position // chunk)
    * chunk, are hidden; under a tree a new token's position is prefix + its own depth."""
    i = torch.arange(query_len, device=lengths.device)[None, :, None]
    j = torch.arange(max_len, device=lengths.device)[None, None, :]
    prefix = (lengths - new_tokens)[:, None, None]
    new = j - prefix  # the new-token index of position j (negative in the prefix)
    allowed = (new <= i) if causal else torch.ones_like(new, dtype=torch.bool)
    if tree_bits is not None:
        allowed = allowed & (((tree_bits[:, :, None] >> new.clamp(0, 63)) & 1) == 1)
    seen = (new < 0) | ((j < lengths[:, None, None]) & allowed)
    if window is not None:
        offset = i if tree_bits is None else tree_depths(tree_bits)[:, :, None]
        seen = seen & (j > prefix + offset - window)
    if chunk is not None:
        if tree_bits is None:
            seen = seen & (j >= (prefix + i) // chunk * chunk)
        else:  # a node at prefix + its depth; a new key (an ancestor) too, at prefix + ITS depth
            depth = tree_depths(tree_bits)  # [R, query_len]: query i's; key jj's is depth[:, jj]
            key_depth = torch.gather(depth, 1, new[:, 0].clamp(0, query_len - 1))[:, None, :]  # [R, 1, max_len]
            key_position = torch.where(new < 0, j, prefix + key_depth)
            seen = seen & (key_position >= (prefix + depth[:, :, None]) // chunk * chunk)
    return seen


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_query_lens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    scale: float | None = None,
    causal: bool = True,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """out [T, Hq, D] (q's dtype). A spec, not a fast path: it waits on the device for the longest
    row and query count and, per pass of rows, for its real queries (a boolean index). Rows are
    padded to the longest and attended together, several rows a pass (CHUNK_VALUES); padded keys
    are masked and their V zeroed (a slot past a row's end may hold NaN), padded queries are
    computed and dropped."""
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.zeros_like(q)
    cu, lengths = cu_query_lens.long(), seq_lens.long()
    first, new_tokens = cu[:-1], cu[1:] - cu[:-1]  # [B]: row b's first query and its count
    if T == 0 or new_tokens.numel() == 0 or int(new_tokens.max()) == 0:
        return out
    query_len, max_len = int(new_tokens.max()), int(lengths.max())
    row_values = max_len * (2 * Hkv * D + Hq * query_len) + query_len * Hq * D
    rows_per_pass = max(1, CHUNK_VALUES // row_values)  # not `chunk`: that is the attention chunk
    i = torch.arange(query_len, device=q.device)
    for r0 in range(0, lengths.numel(), rows_per_pass):
        rows = slice(r0, r0 + rows_per_pass)
        k = gather_rows_kv(k_cache, block_table[rows], max_len).float()  # [R, L, Hkv, D]
        v = gather_rows_kv(v_cache, block_table[rows], max_len).float()
        in_row = torch.arange(max_len, device=q.device)[None, :] < lengths[rows, None]  # [R, L]
        v = torch.where(in_row[:, :, None, None], v, 0.0)
        token = (first[rows, None] + i).clamp(max=T - 1)  # [R, n]: the packed index of query i of row r
        real = i[None, :] < new_tokens[rows, None]
        qr = q[token].float().view(*token.shape, Hkv, Hq // Hkv, D)  # [R, n, Hkv, group, D]
        scores = torch.einsum("rikgd,rjkd->rkgij", qr, k) * scale  # [R, Hkv, group, n, L]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        tree_bits = None if tree_mask is None else tree_mask[token]
        visible = visible_keys(new_tokens[rows], lengths[rows], query_len, max_len, tree_bits, causal, window,
                               chunk)
        scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
        if sinks is not None:  # one more logit per query head, dropped after the softmax
            sink = sinks.float().view(1, Hkv, Hq // Hkv, 1, 1).expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("rkgij,rjkd->rikgd", probs, v).flatten(2, 3)  # [R, n, Hq, D]
        out[token[real]] = o[real].to(q.dtype)
    return out
