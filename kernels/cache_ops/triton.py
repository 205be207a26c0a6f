"""Triton kernels for append_kv and compact_kv (semantics: reference.py).

Both launch one grid whose size depends only on tensor shapes (T, B, layers, heads), read
every data-dependent value (cu_query_lens, seq_lens, block_table, path_positions) inside the
kernel and never sync, so they can be captured in a CUDA graph. Writes to unmapped positions
are masked off, as the reference drops them.
"""
import triton
import triton.language as tl

from .._launch import cdiv, next_pow2, tile_of


# Elements per program: 4096 (16 KB of fp32) keeps registers low on a GPU and, under the
# interpreter, few programs (each interpreted program costs ~10 ms on the CI box, measured).
TILE_ELEMENTS = 4096


# Ints that follow the call's tokens and the pool's size: not specialised (one compiled variant
# for every length: tests/kernels/test_compile_variants.py).
@triton.jit(do_not_specialize=["num_tokens", "batch", "num_blocks", "max_blocks"])
def _append_kv_kernel(
    k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, cu_ptr,
    num_tokens, batch, num_blocks, max_blocks, num_kv_heads, head_dim,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_bt_row, stride_bt_col,
    BLOCK_SIZE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # One program per (BLOCK_T new tokens, BLOCK_C of the Hkv*D columns): finds each token's row
    # from cu_query_lens, its slot from seq_lens + block_table, then copies K and V.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rows = tl.arange(0, BLOCK_B)
    ends = tl.load(cu_ptr + 1 + rows, mask=rows < batch, other=2147483647)
    row = tl.sum((ends[None, :] <= t[:, None]).to(tl.int32), axis=1)  # == batch past cu[B]
    live = (row < batch) & (t < num_tokens)
    start = tl.load(cu_ptr + row, mask=live, other=0)
    pos = tl.load(seq_lens_ptr + row, mask=live, other=0) + (t - start)
    # slot = block_table[row, pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE, where mapped
    # (written out in each kernel: a nested @triton.jit call costs ~7 ms per call interpreted)
    ok = live & (pos >= 0) & (pos // BLOCK_SIZE < max_blocks)
    block = tl.load(block_table_ptr + row.to(tl.int64) * stride_bt_row + (pos // BLOCK_SIZE) * stride_bt_col, mask=ok, other=-1)
    ok = ok & (block >= 0) & (block < num_blocks)
    slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE

    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # column = head * D + d
    head, d = c // head_dim, c % head_dim
    mask = ok[:, None] & (c[None, :] < num_kv_heads * head_dim)
    dst = slot[:, None] * (num_kv_heads * head_dim) + c[None, :]
    t64 = t.to(tl.int64)[:, None]
    k = tl.load(k_new_ptr + t64 * stride_k_t + (head * stride_k_h + d)[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    v = tl.load(v_new_ptr + t64 * stride_v_t + (head * stride_v_h + d)[None, :], mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def append_kv_triton(k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens) -> None:
    """See reference.append_kv_reference. Caches contiguous; k_new/v_new with unit last stride."""
    num_tokens, num_kv_heads, head_dim = k_new.shape
    num_blocks, block_size = k_cache.shape[:2]
    batch = cu_query_lens.shape[0] - 1
    block_c = min(next_pow2(num_kv_heads * head_dim), TILE_ELEMENTS)
    block_b = next_pow2(max(batch, 1))
    # the row search compares a [BLOCK_T, BLOCK_B] tile: keep it within 2 * TILE_ELEMENTS too
    block_t = tile_of(num_tokens, max(1, min(TILE_ELEMENTS // block_c, 2 * TILE_ELEMENTS // block_b)))
    grid = (cdiv(num_tokens, block_t), cdiv(num_kv_heads * head_dim, block_c))
    _append_kv_kernel[grid](
        k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens,
        num_tokens, batch, num_blocks, block_table.shape[1], num_kv_heads, head_dim,
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1), block_table.stride(0), block_table.stride(1),
        BLOCK_SIZE=block_size, BLOCK_B=block_b, BLOCK_T=block_t, BLOCK_C=block_c,
    )


@triton.jit(do_not_specialize=["num_blocks", "max_blocks"])
def _compact_kv_kernel(
    caches_ptr, block_table_ptr, seq_lens_ptr, path_ptr,
    num_blocks, max_blocks, path_len, slot_elements, stride_layer_kv,
    stride_bt_row, stride_bt_col, stride_path_row, stride_path_col,
    BLOCK_SIZE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # One program per (row, layer x {K,V}, BLOCK_C of the Hkv*D columns of a slot): gathers the
    # path's [len, BLOCK_C] values into registers, waits at a barrier, then scatters them, so
    # overlapping moves read old values.
    row = tl.program_id(0)
    lkv = tl.program_id(1)  # layer * 2 + kv
    j = tl.arange(0, BLOCK_P)
    node = tl.load(path_ptr + row.to(tl.int64) * stride_path_row + j * stride_path_col, mask=j < path_len, other=-1)
    length = tl.min(tl.where(node < 0, j, BLOCK_P), axis=0)  # the first -1 ends the path
    moves = (j < length) & (node != j)  # node == j is already in place
    base = tl.load(seq_lens_ptr + row)
    table_row = block_table_ptr + row.to(tl.int64) * stride_bt_row
    src_pos, dst_pos = base + node, base + j  # slots as in the append kernel, mapped or masked
    src_ok = moves & (src_pos >= 0) & (src_pos // BLOCK_SIZE < max_blocks)
    src_block = tl.load(table_row + (src_pos // BLOCK_SIZE) * stride_bt_col, mask=src_ok, other=-1)
    src_ok = src_ok & (src_block >= 0) & (src_block < num_blocks)
    src = src_block.to(tl.int64) * BLOCK_SIZE + src_pos % BLOCK_SIZE
    dst_ok = moves & (dst_pos >= 0) & (dst_pos // BLOCK_SIZE < max_blocks)
    dst_block = tl.load(table_row + (dst_pos // BLOCK_SIZE) * stride_bt_col, mask=dst_ok, other=-1)
    dst_ok = dst_ok & (dst_block >= 0) & (dst_block < num_blocks)
    dst = dst_block.to(tl.int64) * BLOCK_SIZE + dst_pos % BLOCK_SIZE
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (src_ok & dst_ok)[:, None] & (c[None, :] < slot_elements)
    plane_ptr = caches_ptr + lkv.to(tl.int64) * stride_layer_kv + c[None, :]
    vals = tl.load(plane_ptr + src[:, None] * slot_elements, mask=mask)
    tl.debug_barrier()
    tl.store(plane_ptr + dst[:, None] * slot_elements, vals, mask=mask)


def compact_kv_triton(caches, block_table, seq_lens, path_positions) -> None:
    """See reference.compact_kv_reference. caches contiguous [L, 2, NB, BS, Hkv, D]."""
    num_layers, _, num_blocks, block_size, num_kv_heads, head_dim = caches.shape
    batch, path_len = path_positions.shape
    slot_elements = num_kv_heads * head_dim
    block_p = next_pow2(path_len)
    block_c = min(next_pow2(slot_elements), max(16, TILE_ELEMENTS // block_p))
    grid = (batch, num_layers * 2, cdiv(slot_elements, block_c))
    _compact_kv_kernel[grid](
        caches, block_table, seq_lens, path_positions,
        num_blocks, block_table.shape[1], path_len, slot_elements, caches.stride(1),
        block_table.stride(0), block_table.stride(1), path_positions.stride(0), path_positions.stride(1),
        BLOCK_SIZE=block_size, BLOCK_P=block_p, BLOCK_C=block_c,
    )


__all__ = ["append_kv_triton", "compact_kv_triton"]
