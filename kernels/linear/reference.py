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
