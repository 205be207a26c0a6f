"""specdec_fast.kernels: the kernels only (no model, no engine). Each op has a torch reference
beside its Triton and C++ implementations; every entry point takes backend=None|"triton"|"cpp"|"torch".

Where this folder lives: in the source tree it is the top-level kernels/, a sibling of
specdec_fast/ and csrc/; setup.py's package_dir installs it as specdec_fast.kernels (and
csrc/ as specdec_fast.csrc), so `from .kernels import ...` inside specdec_fast/ resolves here
although specdec_fast/ has no kernels/ subfolder. Never import it as a top-level `kernels`
(a different PyPI package owns that name). A lower layer: nothing here imports from
specdec_fast outside this folder; imports inside it are relative. The C++ backend's loader
is _cpp_build.py (it finds csrc/ beside this folder, in the tree and in a wheel alike).
"""
from .attention import paged_attention
from .cache_ops import append_kv, compact_kv
from .linear import skinny_linear, skinny_linear_n
from .llama_ops import rms_norm, rope_cos_sin, rope_qk_, silu_mul
from .penalties import PenaltyTensors, add_tokens, make_penalty_tensors
from .sampling_params import SamplingTensors, make_sampling_tensors
from .verify import chain_verify, sample, standardise

__all__ = [
    "chain_verify", "sample", "standardise", "SamplingTensors", "make_sampling_tensors",
    "PenaltyTensors", "make_penalty_tensors", "add_tokens",
    "append_kv", "compact_kv", "paged_attention", "skinny_linear", "skinny_linear_n",
    "rms_norm", "rope_cos_sin", "rope_qk_", "silu_mul",
]
