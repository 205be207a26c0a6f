"""The C++ CPU backend of append_kv and compact_kv (csrc/cache_ops.cpp), called through torch.ops."""
import torch

from .._cpp_build import load_cpu_ops


def append_kv_cpp(k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens) -> None:
    """See reference.append_kv_reference (in place; C++ over CPU tensors, parallel over tokens)."""
    load_cpu_ops()
    torch.ops.specdec_fast.append_kv(k_new, v_new, k_cache, v_cache, block_table, seq_lens, cu_query_lens)


def compact_kv_cpp(caches, block_table, seq_lens, path_positions) -> None:
    """See reference.compact_kv_reference (in place; C++, parallel over rows x layers x K/V)."""
    load_cpu_ops()
    torch.ops.specdec_fast.compact_kv(caches, block_table, seq_lens, path_positions)
