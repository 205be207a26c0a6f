"""The elementwise math of a Llama decoder layer for the paged runner's CPU / torch path:
RMSNorm, RoPE, SwiGLU.

With float32 CPU tensors and the C++ ops built, each is one call of a fused op
(kernels/llama_ops, csrc/llama_fused.cpp) instead of 3 to 7 torch ops: a draft step of the demo
pair spent most of its time dispatching small ops. Elsewhere, plain torch with transformers'
op order. (The Triton path -- CUDA -- uses kernels/llama_ops/triton.py and
kernels/cache_ops/triton_rope.py instead: runners/paged_llama.py _decode_triton.)
"""
from functools import lru_cache

import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rms_norm_reference, rotate_half_apply


@lru_cache(maxsize=None)
def fused_layer_math(dtype: torch.dtype, device_type: str) -> bool:
    """Whether the fused C++ ops serve tensors of this dtype on this device type."""
    if dtype != torch.float32 or device_type != "cpu":
        return False
    from ..kernels._backend import cpp_op_available

    return all(cpp_op_available(op) for op in ("rms_norm", "rope_qk_", "silu_mul", "rope_cos_sin"))


def layer_norm_params(module) -> tuple:
    """(weight, bias, eps) of an nn.LayerNorm, as F.layer_norm takes them after the shape (the
    LayerNorm families' runners: StarCoder2, GPT-NeoX, OPT, GPT-BigCode)."""
    return module.weight, module.bias, module.eps


def linear_params(*modules) -> tuple:
    """((weight, bias), ...) of nn.Linear-like modules, in order (references: no copies)."""
    return tuple((m.weight, m.bias) for m in modules)


def norm_params(module) -> tuple | None:
    """(weight, eps) of an RMSNorm-like module, whichever name its eps has (variance_epsilon: Llama,
    OLMo, Cohere; eps: Gemma), or None for no module (Cohere's absent q / k norms)."""
    if module is None:
        return None
    eps = getattr(module, "variance_epsilon", None)
    return module.weight, module.eps if eps is None else eps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, fused: bool) -> torch.Tensor:
    """transformers' LlamaRMSNorm / Qwen3RMSNorm over the last dim of x [..., H] (float32 statistics)."""
    if fused and x.stride(-1) == 1:
        if x.dim() == 2:  # the reshape/view calls would be no-ops: skip them (~1 us each)
            return torch.ops.specdec_fast.rms_norm(x, weight, eps)
        return torch.ops.specdec_fast.rms_norm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)
    return rms_norm_reference(x, weight, eps)  # skips the no-op casts in float32


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype,
                 fused: bool = False):
    """positions [T] -> cos, sin [T, D] in dtype, with transformers' float32 math
    (position * inv_freq, cat(freqs, freqs), cos/sin * attention_scaling, cast). fused: one C++
    call instead of 6 ops (its cos/sin are rounded from double: the last bit may differ)."""
    if fused and dtype == torch.float32:
        cos, sin = torch.ops.specdec_fast.rope_cos_sin(positions, inv_freq, scaling)
        return cos, sin
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scaling != 1.0:  # * 1.0 is exact: skip the calls
        cos, sin = cos * scaling, sin * scaling
    if dtype != torch.float32:
        cos, sin = cos.to(dtype), sin.to(dtype)
    return cos, sin


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fused: bool):
    """q [T, Hq, D], k [T, Hk, D], cos/sin [T, D] -> rotated (q, k); in place when fused."""
    if fused and q.stride(-1) == 1 and k.stride(-1) == 1 and q.shape[-1] <= 512:
        torch.ops.specdec_fast.rope_qk_(q, k, cos, sin)
        return q, k
    return rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)


def gated_act(gate: torch.Tensor, up: torch.Tensor, act, silu: bool, fused: bool) -> torch.Tensor:
    """act(gate) * up for gate, up [T, F]; act is the model's act_fn (silu: F.silu directly)."""
    if silu and fused:
        return torch.ops.specdec_fast.silu_mul(gate, up)
    return (F.silu(gate) if silu else act(gate)) * up
