"""append_kv, rope_append_kv and compact_kv: the paged-KV cache's small kernels, with validation
and dispatch. rope_append_kv is a Llama layer's RoPE (+ Qwen3 q/k norm) fused with append_kv.

Backends: "triton" (CUDA, or TRITON_INTERPRET=1), "cpp" (csrc/cache_ops.cpp, the CPU default
when it builds), "torch" (reference.py: the spec; see it for the exact semantics). Triton and
C++ run one launch with no host sync (CUDA-graph capturable); check=True adds value checks
that read tensors (a sync), check=False (the engine's choice) skips them.
"""
import torch

from .._backend import resolve_backend
from .reference import append_kv_reference, compact_kv_reference, path_lengths, rope_append_kv_reference

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

__all__ = ["append_kv", "rope_append_kv", "compact_kv", "append_kv_reference", "rope_append_kv_reference",
           "compact_kv_reference"]


def _tensor(name: str, t, dtype=None, ndim: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")


def _same_device(device: torch.device, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but the cache is on {device}")


def _check_rows(block_table, seq_lens, batch: int, what: str) -> None:
    _tensor("block_table", block_table, torch.int32, 2)
    _tensor("seq_lens", seq_lens, torch.int32, 1)
    if block_table.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(
            f"block_table [B, max_blocks] and seq_lens [B] must have B = {batch} rows ({what}), "
            f"got block_table {tuple(block_table.shape)} and seq_lens {tuple(seq_lens.shape)}"
        )
    if block_table.shape[1] < 1:
        raise ValueError(f"block_table must have at least one column, got shape {tuple(block_table.shape)}")


def _check_mapped(name: str, block_table, rows, pos, num_blocks: int, block_size: int) -> None:
    """Raises unless every position ``pos`` of row ``rows`` (flat int64 tensors) is mapped."""
    if pos.numel() == 0:
        return
    capacity = block_table.shape[1] * block_size
    bad = (pos < 0) | (pos >= capacity)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name}: row {int(rows[i])} position {int(pos[i])} lies outside its block_table (capacity {capacity} tokens)")
    block = block_table.long()[rows, torch.div(pos, block_size, rounding_mode="floor")]
    bad = (block < 0) | (block >= num_blocks)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{name}: row {int(rows[i])} position {int(pos[i])} maps to block {int(block[i])}, "
            f"not a block of the cache [0, {num_blocks})"
        )


def _check_append(k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens, check: bool):
    """append_kv's checks (values only when check); -> k_new, v_new, seq_lens, cu_query_lens with
    unit last stride / contiguous."""
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        _tensor(name, t, None, 3)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _tensor(name, t, None, 4)
    if k_cache.dtype not in CACHE_DTYPES:
        raise TypeError(f"k_cache must be float32, float16 or bfloat16, got {k_cache.dtype}")
    for name, t in (("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new)):
        if t.dtype != k_cache.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from k_cache dtype {k_cache.dtype}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} differs from k_cache shape {tuple(k_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous [num_blocks, block_size, Hkv, D] tensors")
    if v_new.shape != k_new.shape or k_new.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k_new and v_new must both be [T, Hkv, D] = [T, {k_cache.shape[2]}, {k_cache.shape[3]}] to match the cache, "
            f"got k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)}"
        )
    _tensor("cu_query_lens", cu_query_lens, torch.int32, 1)
    if cu_query_lens.shape[0] < 1:
        raise ValueError("cu_query_lens must hold B+1 >= 1 offsets, got an empty tensor")
    batch = cu_query_lens.shape[0] - 1
    _check_rows(block_table, seq_lens, batch, "cu_query_lens has B+1 entries")
    device = k_cache.device
    _same_device(device, v_cache=v_cache, k_new=k_new, v_new=v_new, block_table=block_table, seq_lens=seq_lens, cu_query_lens=cu_query_lens)
    num_blocks, block_size = k_cache.shape[:2]
    if check and batch > 0:
        cu = cu_query_lens.long()
        if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) > k_new.shape[0]:
            raise ValueError(f"cu_query_lens must start at 0, never decrease and end <= T = {k_new.shape[0]}, got {cu.tolist()}")
        if bool((seq_lens < 0).any()):
            raise ValueError(f"seq_lens must be >= 0, got {seq_lens.tolist()}")
        counts = cu[1:] - cu[:-1]
        rows = torch.repeat_interleave(torch.arange(batch, device=device), counts)
        offsets = torch.arange(int(cu[-1]), device=device) - cu[:-1].repeat_interleave(counts)
        _check_mapped("append_kv", block_table, rows, seq_lens.long()[rows] + offsets, num_blocks, block_size)
    seq_lens, cu_query_lens = seq_lens.contiguous(), cu_query_lens.contiguous()  # no-ops unless strided
    if k_new.stride(-1) != 1:
        k_new = k_new.contiguous()
    if v_new.stride(-1) != 1:
        v_new = v_new.contiguous()
    return k_new, v_new, seq_lens, cu_query_lens


def append_kv(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_query_lens: torch.Tensor,
    *,
    backend: str | None = None,
    check: bool = True,
) -> None:
    """Writes new tokens' K/V into their paged slots, in place; seq_lens is not advanced.

    k_new, v_new [T, Hkv, D] (packed ragged); k_cache, v_cache [num_blocks, block_size, Hkv, D]
    contiguous, same dtype as k_new (float32/float16/bfloat16); block_table [B, max_blocks],
    seq_lens [B], cu_query_lens [B+1], all int32 on the cache's device. Row b's i-th new token
    goes to position seq_lens[b] + i. check=False skips the checks that read values (no sync).
    """
    k_new, v_new, seq_lens, cu_query_lens = _check_append(k_new, v_new, k_cache, v_cache, block_table, seq_lens,
                                                          cu_query_lens, check)
    if k_new.shape[0] == 0 or cu_query_lens.shape[0] == 1:
        return
    device = k_cache.device
    chosen = resolve_backend(backend, device, "append_kv")
    if chosen == "triton":
        from .triton import append_kv_triton

        append_kv_triton(k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens)
    elif chosen == "cpp":
        from .cpp import append_kv_cpp

        append_kv_cpp(k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens)
    else:
        append_kv_reference(k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens)


def rope_append_kv(q, k, v, cos, sin, k_cache, v_cache, block_table, seq_lens, cu_query_lens, *, qk_norm=None,
                   q_scale=None, backend: str | None = None, check: bool = True) -> None:
    """RoPE of q (in place) and k, then k, v appended to the paged cache (reference.py has the
    semantics). q [T, Hq, D], k, v [T, Hkv, D] (strided views allowed, unit last stride), cos, sin
    [T, R] in q's dtype, D even (R = D; fewer: a partial rotary embedding, the first R rotated); the cache arguments as append_kv's; qk_norm None or
    (q_weight [D], q_eps, k_weight [D], k_eps); q_scale None or [T] in q's dtype or float32: each
    token's rotated query times it, the product rounded to q's dtype (Ministral 3's temperature, in
    the model dtype; Llama 4's, float32). Backends: "triton" (one launch; the CUDA
    default) or "torch" (the reference; None picks it for CPU tensors)."""
    _tensor("q", q, None, 3)
    if q.dtype != k_cache.dtype:
        raise TypeError(f"q dtype {q.dtype} differs from k_cache dtype {k_cache.dtype}")
    t, _, dim = q.shape
    if dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {dim}")
    for name, c in (("cos", cos), ("sin", sin)):
        _tensor(name, c, q.dtype, 2)
        if c.shape[0] != t or c.shape[1] > dim or c.shape[1] % 2 or c.shape != cos.shape or c.shape[1] == 0:
            raise ValueError(f"{name} must have shape [{t}, R] (R even, at most {dim}, as cos), got {tuple(c.shape)}")
    if k.shape[0] != t:
        raise ValueError(f"k must have q's {t} tokens, got shape {tuple(k.shape)}")
    if qk_norm is not None:
        if len(qk_norm) != 4 or any(tuple(qk_norm[i].shape) != (dim,) or qk_norm[i].dtype != q.dtype for i in (0, 2)):
            raise ValueError(f"qk_norm must be (q_weight [{dim}], q_eps, k_weight [{dim}], k_eps) in q's dtype")
        _same_device(k_cache.device, q_weight=qk_norm[0], k_weight=qk_norm[2])
    if q_scale is not None:
        _tensor("q_scale", q_scale, None, 1)
        if q_scale.dtype not in (q.dtype, torch.float32):
            raise TypeError(f"q_scale must be {q.dtype} (q's dtype) or torch.float32, got {q_scale.dtype}")
        if q_scale.shape[0] != t:
            raise ValueError(f"q_scale must have shape [{t}], got {tuple(q_scale.shape)}")
        _same_device(k_cache.device, q_scale=q_scale)
    _same_device(k_cache.device, q=q, cos=cos, sin=sin)
    if backend == "cpp":
        raise ValueError("rope_append_kv has no C++ backend ('triton' or 'torch')")
    chosen = resolve_backend(backend, k_cache.device, "append_kv") if backend is not None or q.is_cuda else "torch"
    if chosen != "triton":
        _check_append(k, v, k_cache, v_cache, block_table, seq_lens, cu_query_lens, check)
        rope_append_kv_reference(q, k, v, cos, sin, k_cache, v_cache, block_table, seq_lens, cu_query_lens, qk_norm,
                                 q_scale)
        return
    if q.stride(-1) != 1:
        raise ValueError("q must have unit last stride (it is rotated in place)")
    k, v, seq_lens, cu_query_lens = _check_append(k, v, k_cache, v_cache, block_table, seq_lens, cu_query_lens, check)
    from .triton_rope import rope_append_kv_triton

    rope_append_kv_triton(q, k, v, cos.contiguous(), sin.contiguous(), k_cache, v_cache, block_table.contiguous(),
                          seq_lens, cu_query_lens, qk_norm, q_scale=None if q_scale is None else q_scale.contiguous())


def compact_kv(
    caches: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    path_positions: torch.Tensor,
    *,
    backend: str | None = None,
    check: bool = True,
) -> None:
    """Moves each row's accepted tree path to contiguous slots seq_lens[b] + 0..len_b-1, in place.

    caches [num_layers, 2, num_blocks, block_size, Hkv, D] contiguous (all layers, K and V);
    block_table [B, max_blocks], seq_lens [B], path_positions [B, P] (node indices relative to
    seq_lens, the first -1 ends a row's path), all int32 on the cache's device. One launch
    covers every layer. check=False skips the checks that read values (no sync).
    """
    _tensor("caches", caches, None, 6)
    if caches.dtype not in CACHE_DTYPES:
        raise TypeError(f"caches must be float32, float16 or bfloat16, got {caches.dtype}")
    if caches.shape[1] != 2:
        raise ValueError(f"caches must be [num_layers, 2, num_blocks, block_size, Hkv, D] (K and V), got shape {tuple(caches.shape)}")
    if not caches.is_contiguous():
        raise ValueError("caches must be contiguous")
    _tensor("path_positions", path_positions, torch.int32, 2)
    batch = path_positions.shape[0]
    _check_rows(block_table, seq_lens, batch, "path_positions is [B, P]")
    device = caches.device
    _same_device(device, block_table=block_table, seq_lens=seq_lens, path_positions=path_positions)
    num_blocks, block_size = caches.shape[2:4]
    if check and batch > 0 and path_positions.shape[1] > 0:
        if bool((seq_lens < 0).any()):
            raise ValueError(f"seq_lens must be >= 0, got {seq_lens.tolist()}")
        lengths = path_lengths(path_positions)
        j = torch.arange(path_positions.shape[1], device=device)
        on_path = j[None, :] < lengths[:, None]
        rows = torch.arange(batch, device=device)[:, None].expand_as(on_path)[on_path]
        base = seq_lens.long()[rows]
        _check_mapped("compact_kv (path source)", block_table, rows, base + path_positions.long()[on_path], num_blocks, block_size)
        _check_mapped("compact_kv (destination)", block_table, rows, base + j[None, :].expand_as(on_path)[on_path], num_blocks, block_size)
    seq_lens = seq_lens.contiguous()  # a no-op unless strided
    if batch == 0 or path_positions.shape[1] == 0 or caches.numel() == 0:
        return

    chosen = resolve_backend(backend, device, "compact_kv")
    if chosen == "triton":
        from .triton import compact_kv_triton

        compact_kv_triton(caches, block_table, seq_lens, path_positions)
    elif chosen == "cpp":
        from .cpp import compact_kv_cpp

        compact_kv_cpp(caches, block_table, seq_lens, path_positions)
    else:
        compact_kv_reference(caches, block_table, seq_lens, path_positions)
