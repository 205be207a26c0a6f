"""specdec_fast.kernels: the kernels only (no model, no engine). Each op has a torch reference
beside its Triton and C++ implementations; every entry point takes backend=None|"triton"|"cpp"|"torch".
"""
from .attention import paged_attention
from .cache_ops import append_kv, compact_kv
from .linear import skinny_linear, skinny_linear_n
from .llama_ops import rms_norm, rope_cos_sin, rope_qk_, silu_mul
from .sampling_params import SamplingTensors, make_sampling_tensors
from .verify import chain_verify, sample, standardise

__all__ = [
    "chain_verify", "sample", "standardise", "SamplingTensors", "make_sampling_tensors",
    "append_kv", "compact_kv", "paged_attention", "skinny_linear", "skinny_linear_n",
    "rms_norm", "rope_cos_sin", "rope_qk_", "silu_mul",
]
