"""The spec of skinny_linear in plain torch (also the CPU fallback and the test oracle).

    y [M, N] = x [M, K] @ weight.T (+ bias [N]) (+ residual [M, N])

weight is [N, K] (nn.Linear) or any view of that shape, e.g. the transpose of a contiguous
[K, N] tensor (GPT-2's Conv1D). The product is summed in some order (every backend its own);
then bias is added, then the result is added to residual (``residual + (x @ W.T + b)``, the
order of a transformer's ``h = h + linear(...)``).
"""
import torch
import torch.nn.functional as F


def skinny_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                            residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K], weight [N, K], bias [N] or None, residual [M, N] or None -> y [M, N] in x's dtype."""
    y = F.linear(x, weight, bias)
    return y if residual is None else residual + y


def skinny_linear_n_reference(x: torch.Tensor, weights, biases) -> list:
    """x [M, K], weights [N_i, K], biases [N_i] or None each -> [x @ W_i.T + b_i] (a list)."""
    return [F.linear(x, w, b) for w, b in zip(weights, biases)]


def fused_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                           residual: torch.Tensor | None = None, *, prologue: str = "none",
                           norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """The spec of the Triton kernel's fused prologues (kernels/linear/triton.py), summed in float64:
      "none":     y = x @ W.T
      "rms_norm": y = rsqrt(mean(x^2) + eps) * (dtype(x * norm_weight) @ W.T)  (float32 statistic)
      "silu_mul": x = [gate | up] [M, 2K]: y = dtype(dtype(silu(gate)) * up) @ W.T
    then y = dtype(y + bias), then dtype(residual + y). x [M, K or 2K], weight [N, K] -> [M, N]."""
    if prologue not in ("none", "rms_norm", "silu_mul"):
        raise ValueError(f"unknown prologue {prologue!r}")
    dtype, k = x.dtype, weight.shape[1]
    if prologue == "silu_mul":
        gate, up = x[:, :k].float(), x[:, k:2 * k].float()
        x = (F.silu(gate).to(dtype).float() * up).to(dtype)
    scale = None
    if prologue == "rms_norm":
        xf = x.float()
        scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps).double()
        x = (xf * norm_weight.float()).to(dtype)
    y = x.double() @ weight.double().T
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias.double()
    y = y.to(dtype)
    return y if residual is None else (residual.double() + y.double()).to(dtype)
