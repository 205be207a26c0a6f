"""Triton kernels for append_kv and compact_kv (semantics: reference.py).

Both launch one grid whose size depends only on tensor shapes (T, B, layers, heads), read
every data-dependent value (cu_query_lens, seq_lens, block_table, path_positions) inside the
kernel and never sync, so they can be captured in a CUDA graph. Writes to unmapped positions
are masked off, as the reference drops them.
"""
import triton
import triton.language as tl


@triton.jit
def _slot(block_table_ptr, row, pos, max_blocks, num_blocks, stride_bt_row, stride_bt_col, BLOCK_SIZE: tl.constexpr, valid):
    """Flat int64 slot of ``pos`` in ``row`` and whether it is mapped (positions where ``valid``)."""
    logical = pos // BLOCK_SIZE
    ok = valid & (pos >= 0) & (logical < max_blocks)
    block = tl.load(block_table_ptr + row.to(tl.int64) * stride_bt_row + logical * stride_bt_col, mask=ok, other=-1)
    ok = ok & (block >= 0) & (block < num_blocks)
    return block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE, ok


@triton.jit
def _append_kv_kernel(
    k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, cu_ptr,
    batch, num_blocks, max_blocks, num_kv_heads, head_dim,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_bt_row, stride_bt_col,
    BLOCK_SIZE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (new token, group of heads): finds the token's row from cu_query_lens,
    # its slot from seq_lens + block_table, then copies [BLOCK_H, D] of K and of V.
    t = tl.program_id(0)
    rows = tl.arange(0, BLOCK_B)
    ends = tl.load(cu_ptr + 1 + rows, mask=rows < batch, other=2147483647)
    row = tl.sum((ends <= t).to(tl.int32), axis=0)  # == batch for padding tokens past cu[B]
    live = row < batch
    start = tl.load(cu_ptr + row)  # cu has batch + 1 entries, so row == batch is in bounds
    pos = tl.load(seq_lens_ptr + row, mask=live, other=0) + (t - start)
    slot, ok = _slot(block_table_ptr, row, pos, max_blocks, num_blocks, stride_bt_row, stride_bt_col, BLOCK_SIZE, live)

    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = ok & (h[:, None] < num_kv_heads) & (d[None, :] < head_dim)
    dst = slot * (num_kv_heads * head_dim) + h[:, None] * head_dim + d[None, :]
    t64 = t.to(tl.int64)
    k = tl.load(k_new_ptr + t64 * stride_k_t + h[:, None] * stride_k_h + d[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    v = tl.load(v_new_ptr + t64 * stride_v_t + h[:, None] * stride_v_h + d[None, :], mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def append_kv_triton(k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens) -> None:
    """See reference.append_kv_reference. Caches contiguous; k_new/v_new with unit last stride."""
    num_tokens, num_kv_heads, head_dim = k_new.shape
    num_blocks, block_size = k_cache.shape[:2]
    batch = cu_query_lens.shape[0] - 1
    block_d = triton.next_power_of_2(head_dim)
    # Up to 4096 elements per program (16 KB of fp32): enough work per program, few registers.
    block_h = min(triton.next_power_of_2(num_kv_heads), max(1, 4096 // block_d))
    grid = (num_tokens, triton.cdiv(num_kv_heads, block_h))
    _append_kv_kernel[grid](
        k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens,
        batch, num_blocks, block_table.shape[1], num_kv_heads, head_dim,
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1), block_table.stride(0), block_table.stride(1),
        BLOCK_SIZE=block_size, BLOCK_B=triton.next_power_of_2(max(batch, 1)), BLOCK_H=block_h, BLOCK_D=block_d,
    )


@triton.jit
def _compact_kv_kernel(
    caches_ptr, block_table_ptr, seq_lens_ptr, path_ptr,
    num_blocks, max_blocks, path_len, num_kv_heads, head_dim, stride_layer_kv,
    stride_bt_row, stride_bt_col, stride_path_row, stride_path_col,
    BLOCK_SIZE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (row, layer x {K,V} x head): gathers the path's [len, D] vectors into
    # registers, waits at a barrier, then scatters them, so overlapping moves read old values.
    row = tl.program_id(0)
    plane = tl.program_id(1)  # (layer * 2 + kv) * num_kv_heads + head
    lkv = plane // num_kv_heads
    head = plane % num_kv_heads
    j = tl.arange(0, BLOCK_P)
    node = tl.load(path_ptr + row.to(tl.int64) * stride_path_row + j * stride_path_col, mask=j < path_len, other=-1)
    length = tl.min(tl.where(node < 0, j, BLOCK_P), axis=0)  # the first -1 ends the path
    moves = (j < length) & (node != j)  # node == j is already in place
    base = tl.load(seq_lens_ptr + row)
    src, src_ok = _slot(block_table_ptr, row, base + node, max_blocks, num_blocks, stride_bt_row, stride_bt_col, BLOCK_SIZE, moves)
    dst, dst_ok = _slot(block_table_ptr, row, base + j, max_blocks, num_blocks, stride_bt_row, stride_bt_col, BLOCK_SIZE, moves)
    d = tl.arange(0, BLOCK_D)
    mask = (src_ok & dst_ok)[:, None] & (d[None, :] < head_dim)
    plane_ptr = caches_ptr + lkv.to(tl.int64) * stride_layer_kv + head * head_dim + d[None, :]
    slot_stride = num_kv_heads * head_dim
    vals = tl.load(plane_ptr + src[:, None] * slot_stride, mask=mask)
    tl.debug_barrier()
    tl.store(plane_ptr + dst[:, None] * slot_stride, vals, mask=mask)


def compact_kv_triton(caches, block_table, seq_lens, path_positions) -> None:
    """See reference.compact_kv_reference. caches contiguous [L, 2, NB, BS, Hkv, D]."""
    num_layers, _, num_blocks, block_size, num_kv_heads, head_dim = caches.shape
    batch, path_len = path_positions.shape
    grid = (batch, num_layers * 2 * num_kv_heads)
    _compact_kv_kernel[grid](
        caches, block_table, seq_lens, path_positions,
        num_blocks, block_table.shape[1], path_len, num_kv_heads, head_dim, caches.stride(1),
        block_table.stride(0), block_table.stride(1), path_positions.stride(0), path_positions.stride(1),
        BLOCK_SIZE=block_size, BLOCK_P=triton.next_power_of_2(path_len), BLOCK_D=triton.next_power_of_2(head_dim),
    )


__all__ = ["append_kv_triton", "compact_kv_triton"]
