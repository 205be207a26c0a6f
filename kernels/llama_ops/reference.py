"""The spec of the fused Llama-layer elementwise ops in plain torch (also the test oracle).

    rms_norm(x [T, H], weight [H], eps)  -> weight * (x * rsqrt(mean(x^2, -1) + eps))   [T, H]
        (transformers' LlamaRMSNorm: statistics in float32; in float16/bfloat16 the normalised
        value is rounded to x's dtype before the weight multiplies it)
    add_rms_norm(x [T, H], delta [T, H] or None, weight [H], eps) -> (residual, out):
        residual = x + delta (in x's dtype), out = rms_norm(residual, weight, eps)
        (a decoder layer's residual add followed by the next RMSNorm)
    rope_qk_(q [T, Hq, D], k [T, Hk, D], cos [T, D], sin [T, D]) -> None, in place:
        x <- x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
        (cos/sin row t applies to every head of token t)
    silu_mul(gate [T, F], up [T, F])     -> silu(gate) * up = gate / (1 + exp(-gate)) * up  [T, F]
    rope_cos_sin(positions [T], inv_freq [D/2], scaling) -> cos, sin [T, D] float32:
        angle = float32(position) * inv_freq (float32), cat(angle, angle), cos/sin * scaling
        (transformers' rotary embedding; the C++ op rounds cos/sin from double once)
"""
import torch
import torch.nn.functional as F


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H], weight [H] -> [..., H] (transformers' RMSNorm op order; float32 statistics)."""
    if x.dtype == torch.float32:  # the casts would be no-ops: skip their calls (per-op cost on CPU)
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """x, delta [T, H] (delta None: no add), weight [H] -> (residual x + delta, its RMSNorm)."""
    residual = x if delta is None else x + delta
    return residual, rms_norm_reference(residual, weight, eps)


def rotate_half_apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D], cos/sin [T, R] (R <= D, even) -> x * cos + rotate_half(x) * sin over the first R
    dims (a new tensor); R < D, a partial rotary embedding (GLM-4.5's, transformers' order):
    the other D - R dims pass as they are."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat((rotate_half_apply(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    half = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    return x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s


def rope_qk_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotates q [T, Hq, D] and k [T, Hk, D] in place with cos/sin [T, D]."""
    q.copy_(rotate_half_apply(q, cos, sin))
    k.copy_(rotate_half_apply(k, cos, sin))


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [T, F] -> silu(gate) * up [T, F]."""
    return F.silu(gate) * up


def rope_cos_sin_reference(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float):
    """positions [T] int, inv_freq [D/2] float32 -> cos, sin [T, D] float32."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling
