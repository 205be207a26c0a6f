"""The paged-KV cache ops in plain torch: the spec, the CPU fallback and the test oracle.

Layout (docs/architecture.md §5):
    k_cache, v_cache    [num_blocks, block_size, Hkv, D], one pair per layer
    caches              [num_layers, 2, num_blocks, block_size, Hkv, D] (all layers; [:, 0] is K,
                        [:, 1] is V; caches[l, 0] and caches[l, 1] are the per-layer k/v caches)
    block_table [B, max_blocks] int32: row b's logical block i -> physical block; an entry < 0
                or >= num_blocks means "no block" (PagedKVCache fills unreserved entries with -1)
    seq_lens    [B] int32: tokens already in the cache for row b (committed)
The token at position pos of row b lives in the slot
    block_table[b, pos // block_size] * block_size + pos % block_size
of the cache flattened to [num_blocks * block_size, Hkv, D]. A position is *mapped* when
0 <= pos < max_blocks * block_size and its block entry lies in [0, num_blocks); writes to
unmapped positions are dropped (every backend: memory safety without a host sync; the public
entry points with check=True raise before that can happen).

append_kv(k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens):
    new tokens are packed ragged, k_new/v_new [T, Hkv, D]; row b owns tokens
    cu_query_lens[b] .. cu_query_lens[b+1]-1 (cu_query_lens [B+1] int32, non-decreasing,
    cu_query_lens[0] == 0, cu_query_lens[B] <= T; tokens past cu_query_lens[B] are padding and
    are ignored). The i-th new token of row b is written at position seq_lens[b] + i, K and V
    alike, in place. seq_lens is NOT advanced (PagedKVCache.commit does that).

rope_append_kv(q, k, v, cos, sin, k_cache, v_cache, block_table, seq_lens, cu_query_lens, qk_norm=None):
    a Llama layer's RoPE and KV append: with qk_norm = (q_weight [D], q_eps, k_weight [D], k_eps)
    (Qwen3) each head of q and k is first RMS-normalised over its D values (llama_ops
    rms_norm semantics); then q [T, Hq, D] is overwritten with rope(q) and rope(k), v are
    appended as append_kv does (k and v themselves are only read). rope(x) = x * cos +
    rotate_half(x) * sin with cos/sin [T, D] in x's dtype (llama_ops reference).

compact_kv(caches, block_table, seq_lens, path_positions):
    after scoring a token tree, row b's new tokens sit at positions seq_lens[b] + n for tree
    node n = 0, 1, ... (node index within the row's new tokens). path_positions [B, P] int32
    lists the accepted path's node indices in order; the first -1 ends the path (len_b entries
    before it; everything after it is padding). For every layer, K and V:
        new[seq_lens[b] + j] = old[seq_lens[b] + path_positions[b, j]]   for j < len_b
    all reads happen before any write (a gather, then a scatter), so any mapping is exact,
    overlapping or not. Slots not written keep their values; seq_lens is NOT advanced (the
    engine then commits len_b). Rows are independent: they must not share physical blocks.
"""
import torch


def slot_of(block_table: torch.Tensor, row, pos: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    """Flat slots (int64) of positions ``pos`` [N] of ``row`` (an int, or an int64 tensor [N]: the
    row of each position); -1 where the position is unmapped."""
    pos = pos.long()
    max_blocks = block_table.shape[1]
    logical = torch.div(pos, block_size, rounding_mode="floor")
    in_table = (pos >= 0) & (logical < max_blocks)
    block = block_table.long()[row, logical.clamp(0, max_blocks - 1)]
    mapped = in_table & (block >= 0) & (block < num_blocks)
    return torch.where(mapped, block * block_size + pos % block_size, torch.full_like(pos, -1))


def append_kv_reference(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_query_lens: torch.Tensor,
) -> None:
    """Writes k_new/v_new [T, Hkv, D] into k_cache/v_cache [NB, BS, Hkv, D] in place (see module doc)."""
    num_blocks, block_size = k_cache.shape[:2]
    k_flat = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    v_flat = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    cu = cu_query_lens.long()
    counts = (cu[1:] - cu[:-1]).clamp(min=0)
    rows = torch.repeat_interleave(torch.arange(counts.numel(), device=cu.device), counts)
    rows = rows[:k_new.shape[0]]  # tokens past T do not exist: dropped with their rows' tails
    token = torch.arange(rows.numel(), device=cu.device)  # token t is new token t - cu[row] of its row
    slots = slot_of(block_table, rows, seq_lens.long()[rows] + token - cu[rows], num_blocks, block_size)
    keep = (slots >= 0).nonzero()[:, 0]  # unmapped positions are dropped
    k_flat.index_copy_(0, slots[keep], k_new.index_select(0, keep))
    v_flat.index_copy_(0, slots[keep], v_new.index_select(0, keep))


def rope_append_kv_reference(q, k, v, cos, sin, k_cache, v_cache, block_table, seq_lens, cu_query_lens,
                             qk_norm=None, q_scale=None) -> None:
    """q [T, Hq, D] rotated in place (then times q_scale [T], rounded, where given); rope(k) and v
    [T, Hkv, D] appended (see the module doc)."""
    from ..llama_ops.reference import rms_norm_reference, rotate_half_apply

    if qk_norm is not None:
        q_weight, q_eps, k_weight, k_eps = qk_norm
        q.copy_(rms_norm_reference(q, q_weight, q_eps))
        k = rms_norm_reference(k, k_weight, k_eps)
    q.copy_(rotate_half_apply(q, cos, sin))
    if q_scale is not None:
        q.copy_(q * q_scale[:, None, None])
    append_kv_reference(rotate_half_apply(k, cos, sin), v, k_cache, v_cache, block_table, seq_lens, cu_query_lens)


def path_lengths(path_positions: torch.Tensor) -> torch.Tensor:
    """len_b [B] int64: the number of entries of each row before its first negative entry."""
    return (path_positions >= 0).long().cumprod(1).sum(1)


def compact_kv_reference(
    caches: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    path_positions: torch.Tensor,
) -> None:
    """Moves each row's accepted tree path to contiguous positions, all layers, K and V (module doc)."""
    num_layers, two, num_blocks, block_size = caches.shape[:4]
    flat = caches.view(num_layers, two, num_blocks * block_size, *caches.shape[4:])
    step = torch.arange(path_positions.shape[1], device=caches.device)
    on_path = step[None, :] < path_lengths(path_positions)[:, None]  # [B, P]: entry j of row b is moved
    rows = torch.arange(path_positions.shape[0], device=caches.device)[:, None].expand_as(on_path)[on_path]
    base = seq_lens.long()[rows]
    src = slot_of(block_table, rows, base + path_positions[on_path].long(), num_blocks, block_size)
    dst = slot_of(block_table, rows, base + step.expand_as(on_path)[on_path], num_blocks, block_size)
    keep = ((src >= 0) & (dst >= 0)).nonzero()[:, 0]
    gathered = flat.index_select(2, src[keep])  # a copy: every read before any write
    flat.index_copy_(2, dst[keep], gathered)
