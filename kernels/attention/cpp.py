"""Wrapper of the C++ CPU op torch.ops.specdec_fast.paged_attention (csrc/paged_attention.cpp)."""
import torch

from .._cpp_build import load_cpu_ops


def paged_attention_cpp(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, tree_mask, scale: float,
                        causal: bool = True, window: int | None = None, softcap: float | None = None, sinks=None,
                        chunk: int | None = None):
    """Validated CPU inputs (see __init__.py) -> out [T, Hq, D] in q's dtype. The op takes
    window 0, softcap 0.0 and chunk 0 for none; sinks float32 [Hq] or None."""
    if not load_cpu_ops():
        raise RuntimeError("the C++ CPU ops did not build")
    return torch.ops.specdec_fast.paged_attention(
        q.contiguous(), k_cache, v_cache, block_table.contiguous(), seq_lens.contiguous(),
        cu_query_lens.contiguous(), None if tree_mask is None else tree_mask.contiguous(), float(scale), bool(causal),
        int(window or 0), float(softcap or 0.0), sinks, int(chunk or 0))
