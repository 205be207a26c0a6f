"""paged_attention: N new queries per row over a paged KV cache, one pass (validation + dispatch).

Backends: "triton" (triton.py; CUDA, or CPU under TRITON_INTERPRET=1), "cpp"
(csrc/paged_attention.cpp, the CPU default when it builds), "torch" (reference.py: the spec).
"""
import math

import torch

from .._backend import resolve_backend
from .reference import paged_attention_reference

__all__ = ["paged_attention", "paged_attention_reference", "mla_attention", "MAX_TREE_QUERIES"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_TREE_QUERIES = 64  # one int64 bitmask per query row


def _tensor(name, x, ndim, dtypes=None):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")


def _check_static(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, max_query_len, tree_mask, scale):
    """Shapes, dtypes, devices: never reads tensor values."""
    _tensor("q", q, 3, FLOAT_DTYPES)
    _tensor("k_cache", k_cache, 4, FLOAT_DTYPES)
    _tensor("v_cache", v_cache, 4, FLOAT_DTYPES)
    _tensor("block_table", block_table, 2, (torch.int32,))
    _tensor("seq_lens", seq_lens, 1, (torch.int32,))
    _tensor("cu_query_lens", cu_query_lens, 1, (torch.int32,))
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"k_cache/v_cache dtype ({k_cache.dtype}/{v_cache.dtype}) must match q ({q.dtype})")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    T, Hq, D = q.shape
    _, block_size, Hkv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"k_cache head_dim {Dk} does not match q head_dim {D}")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k_cache kv heads ({Hkv})")
    if block_size < 1:
        raise ValueError("k_cache block_size (dim 1) must be >= 1")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must be contiguous in head_dim (stride(-1) == 1)")
    B = block_table.shape[0]
    if seq_lens.shape[0] != B:
        raise ValueError(f"seq_lens must have shape [{B}] (block_table rows), got {tuple(seq_lens.shape)}")
    if cu_query_lens.shape[0] != B + 1:
        raise ValueError(f"cu_query_lens must have shape [{B + 1}], got {tuple(cu_query_lens.shape)}")
    if not isinstance(max_query_len, int) or isinstance(max_query_len, bool) or max_query_len < 1:
        raise ValueError(f"max_query_len must be a positive int, got {max_query_len!r}")
    if tree_mask is not None:
        _tensor("tree_mask", tree_mask, 1, (torch.int64,))
        if tree_mask.shape[0] != T:
            raise ValueError(f"tree_mask must have shape [{T}] (one bitmask per query), got {tuple(tree_mask.shape)}")
        if max_query_len > MAX_TREE_QUERIES:
            raise ValueError(f"max_query_len {max_query_len} > {MAX_TREE_QUERIES}: a tree has at most {MAX_TREE_QUERIES} nodes per row")
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale)):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    named = {"k_cache": k_cache, "v_cache": v_cache, "block_table": block_table, "seq_lens": seq_lens,
             "cu_query_lens": cu_query_lens, "tree_mask": tree_mask}
    for name, x in named.items():
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}")


def _check_values(q, k_cache, block_table, seq_lens, cu_query_lens, max_query_len, tree_mask):
    """Value checks (they read tensors: a host sync)."""
    T = q.shape[0]
    num_blocks, block_size = k_cache.shape[:2]
    cu = cu_query_lens.long()
    lens = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or int(cu[-1]) != T:
        raise ValueError(f"cu_query_lens must start at 0 and end at T={T}, got {int(cu[0])}..{int(cu[-1])}")
    if bool((lens < 0).any()):
        raise ValueError("cu_query_lens must be non-decreasing")
    if lens.numel() and int(lens.max()) > max_query_len:
        raise ValueError(f"max_query_len {max_query_len} is below the longest query run {int(lens.max())}")
    if bool((seq_lens.long() < lens).any()):
        raise ValueError("seq_lens must be >= each row's query length (new tokens are already in the cache)")
    capacity = block_table.shape[1] * block_size
    if seq_lens.numel() and int(seq_lens.max()) > capacity:
        raise ValueError(f"seq_lens exceeds the block_table capacity {capacity} tokens")
    used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] * block_size < seq_lens[:, None]
    entries = block_table[used]
    if entries.numel() and (int(entries.min()) < 0 or int(entries.max()) >= num_blocks):
        raise ValueError(f"block_table has a used entry outside [0, {num_blocks})")
    if tree_mask is not None and T:
        if int(lens.max()) > MAX_TREE_QUERIES:
            raise ValueError(f"a row has {int(lens.max())} queries: a tree allows at most {MAX_TREE_QUERIES}")
        row = torch.repeat_interleave(torch.arange(lens.numel(), device=q.device), lens)
        i = torch.arange(T, device=q.device) - cu[:-1][row]
        self_bit = (tree_mask >> i) & 1
        beyond = torch.where(i < 63, tree_mask >> (i + 1).clamp(max=63), torch.zeros_like(tree_mask))
        if bool((self_bit == 0).any()) or bool((beyond != 0).any()):
            raise ValueError("tree_mask: query i of a row must set its own bit i and no bit above i (BFS order)")


def _check_sinks(sinks, q):
    """sinks: None or a float tensor [Hq] on q's device."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point() or tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(f"sinks must be a float tensor of shape [{q.shape[1]}] (one logit per query head), got "
                         f"{getattr(sinks, 'shape', type(sinks).__name__)}")
    if sinks.device != q.device:
        raise ValueError(f"sinks is on {sinks.device} but q is on {q.device}")


def _check_window_softcap(window, softcap, tree_mask, max_query_len, chunk=None):
    """window: None or an int >= 1 (and, under a tree, >= max_query_len); chunk: None or an int
    >= 1, with no window; softcap: None or a finite float > 0."""
    if chunk is not None:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be a positive int or None, got {chunk!r}")
        if window is not None:
            raise ValueError("chunk and window together: a layer's attention is chunked or slides, not both")
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int or None, got {window!r}")
        if tree_mask is not None and window < max_query_len:
            raise ValueError(f"window {window} < max_query_len {max_query_len} under a tree: a tree's window must "
                             "cover its deepest node's ancestors (the kernels slide the prefix only)")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(softcap) or softcap <= 0):
        raise ValueError(f"softcap must be a finite float > 0 or None, got {softcap!r}")


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, *, max_query_len: int,
                    tree_mask=None, scale=None, causal: bool = True, window: int | None = None,
                    softcap: float | None = None, sinks: torch.Tensor | None = None, chunk: int | None = None,
                    backend=None, check=True) -> torch.Tensor:
    """Attention of T packed new queries over a paged KV cache; causal, token-tree or block mask.

    q [T, Hq, D] fp16/bf16/fp32; k_cache, v_cache [num_blocks, block_size, Hkv, D] same dtype;
    block_table [B, max_blocks] int32; seq_lens [B] int32 (tokens in the cache, new ones
    included); cu_query_lens [B+1] int32 (row b's queries are q[cu[b]:cu[b+1]]);
    max_query_len: static upper bound on any row's query count (sizes the grid);
    tree_mask [T] int64 or None: bit j of query t = it may see new token j of its row.
    causal=False: the block mask (DFlash's draft block: every new token of a row is seen by every
    query of the row, both ways; no tree). Cost against causal: the same KV pages are read (the
    kernels read a row's new tokens once per tile either way); every query scores all n new
    tokens instead of i + 1 (n (n - 1) / 2 more dot products per head and row: 120 at n = 16,
    nothing beside a prefix of hundreds of tokens) and no mask is computed in the last chunks.
    Measured on CPU (bench/bench_attention.py --cpu-block-mask, attention_block_mask_cpu.json: 32 q /
    8 kv heads, D 128, fp32, 1 thread, process CPU time, commit 56f5b78): the C++ op's block mask
    costs 0.98-1.02x its causal pass at N = 8-16 over 256-4096 tokens, B 1 and 8 (the torch
    reference 0.84-1.01x); the Triton kernel's cost on a GPU is not measured yet.
    window: a sliding window (Mistral, Gemma's sliding layers): a query at position p sees no key
    at p - window or before; the query's position is prefix + i, or under a tree prefix + its
    depth, popcount(tree_mask[t]) - 1, and a tree needs window >= max_query_len. The kernels
    start each row's walk at its window (keys before it are not read). chunk: chunked attention
    (Llama 4's RoPE layers): a query at position p sees keys from (p // chunk) * chunk on, the
    start of its chunk (no window); under a tree a node sits at prefix + its depth and so does each
    of its ancestors; the walk starts at the first query's chunk. softcap: Gemma 2's
    attention soft-capping, scores s -> softcap * tanh(s / softcap) after the scale. sinks [Hq]
    float: GPT-OSS's attention sinks, one logit per query head in each softmax, weighing no value.
    scale defaults to 1/sqrt(D). check=False skips the value checks (no host sync).
    Returns out [T, Hq, D] in q's dtype. See reference.py for the exact semantics.
    """
    _check_static(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, max_query_len, tree_mask, scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if not causal and tree_mask is not None:
        raise ValueError("the block mask (causal=False) takes no tree_mask")
    _check_window_softcap(window, softcap, tree_mask, max_query_len, chunk)
    _check_sinks(sinks, q)
    softcap = None if softcap is None else float(softcap)
    sinks = None if sinks is None else sinks.float().contiguous()
    if check:
        _check_values(q, k_cache, block_table, seq_lens, cu_query_lens, max_query_len, tree_mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    name = resolve_backend(backend, q.device, "paged_attention")
    q = q.contiguous() if q.stride(-1) != 1 else q
    block_table, seq_lens, cu_query_lens = block_table.contiguous(), seq_lens.contiguous(), cu_query_lens.contiguous()
    tree_mask = tree_mask.contiguous() if tree_mask is not None else None
    if name == "torch":
        return paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, tree_mask, scale,
                                         causal, window, softcap, sinks, chunk)
    if name == "cpp":
        from .cpp import paged_attention_cpp

        return paged_attention_cpp(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, tree_mask, scale, causal,
                                   window, softcap, sinks, chunk)
    from .triton import MAX_HEAD_DIM, paged_attention_triton

    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"backend='triton' takes head_dim <= {MAX_HEAD_DIM}, got {q.shape[-1]}")

    return paged_attention_triton(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens,
                                  max_query_len=max_query_len, tree_mask=tree_mask, scale=scale, causal=causal,
                                  window=window, softcap=softcap, sinks=sinks, chunk=chunk)


def mla_attention(q, latent_cache, block_table, seq_lens, cu_query_lens, *, rank: int, max_query_len: int,
                  tree_mask=None, scale: float, backend=None, check=True) -> torch.Tensor:
    """Multi-head latent attention (MLA) with absorbed projections over a latent paged cache
    (runners/paged_mla.py): paged_attention with one KV head whose key is each entry [c, k_rot]
    and whose value is its first ``rank`` dims c; causal or token-tree mask.

    q [T, Hq, R + DR] (R = rank); latent_cache [num_blocks, block_size, 1, R + DR], q's dtype;
    block_table, seq_lens, cu_query_lens, max_query_len, tree_mask, check: as paged_attention.
    Returns out [T, Hq, R] in q's dtype: out[t, h] = sum_j softmax_j(scale * q[t, h] . e_j) e_j[:R]
    over the entries e_j query t sees. The "triton" backend runs kernels/attention/triton_mla.py
    (R <= 512, DR <= 128); "cpp" / "torch" run paged_attention with the cache as K and V and keep
    the first R dims of its output."""
    _check_static(q, latent_cache, latent_cache, block_table, seq_lens, cu_query_lens, max_query_len, tree_mask, scale)
    if latent_cache.shape[2] != 1:
        raise ValueError(f"latent_cache must hold one head (its entries are shared by every query head), got "
                         f"{latent_cache.shape[2]}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 < rank < q.shape[-1]:
        raise ValueError(f"rank must be an int in [1, {q.shape[-1]}) (the latent's dims before the rotated ones), "
                         f"got {rank!r}")
    if check:
        _check_values(q, latent_cache, block_table, seq_lens, cu_query_lens, max_query_len, tree_mask)
    name = resolve_backend(backend, q.device, "paged_attention")
    q = q.contiguous() if q.stride(-1) != 1 else q
    block_table, seq_lens, cu_query_lens = block_table.contiguous(), seq_lens.contiguous(), cu_query_lens.contiguous()
    tree_mask = tree_mask.contiguous() if tree_mask is not None else None
    if name == "triton":
        from .triton_mla import MAX_RANK, MAX_ROPE, mla_attention_triton

        if rank > MAX_RANK or q.shape[-1] - rank > MAX_ROPE:
            raise ValueError(f"backend='triton' MLA takes rank <= {MAX_RANK} and rotated dims <= {MAX_ROPE}, got "
                             f"{rank} and {q.shape[-1] - rank}")
        return mla_attention_triton(q, latent_cache, block_table, seq_lens, cu_query_lens, rank=rank,
                                    max_query_len=max_query_len, tree_mask=tree_mask, scale=float(scale))
    return paged_attention(q, latent_cache, latent_cache, block_table, seq_lens, cu_query_lens,
                           max_query_len=max_query_len, tree_mask=tree_mask, scale=float(scale), backend=name,
                           check=False)[..., :rank]
