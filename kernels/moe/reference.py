"""The spec of moe_pairs in plain torch (also the oracle): each (token, expert) pair's product
with its expert's weight, then the experts' activation.

x [T, K]; experts [P] int64 (pair p reads token p // pairs_per_token and expert experts[p]);
weight [E, R, K]; bias [E, R] or None. In float32:
    y[p, r] = sum_k weight[experts[p], r, k] x[p // pairs_per_token, k] + bias[experts[p], r]
act None:      out = y, [P, R]
act "silu":    gate rows, then up rows (R = 2I): out = silu(y[:, :I]) * y[:, I:], [P, I]
act "gpt_oss": gate / up interleaved (even / odd rows, R = 2I): g = min(y[:, 0::2], limit),
               u = clamp(y[:, 1::2], -limit, limit), out = (u + 1) * g * sigmoid(alpha g), [P, I]
act "relu2":   ungated (R = I): out = relu(y)^2, [P, R] (Nemotron-H's experts: transformers' "relu2")
scale [P]: out[p] *= scale[p]. Rounded once to x's dtype.
"""
import torch
import torch.nn.functional as F

ACTIVATIONS = (None, "silu", "gpt_oss", "relu2")
ACT_CODES = {None: 0, "silu": 1, "gpt_oss": 2, "relu2": 3}  # the compiled backends' activation argument
GATED = ("silu", "gpt_oss")  # the activations of a gate and an up row each: R = 2I rows, I outputs


def activate(y: torch.Tensor, act: str | None, alpha: float = 1.0, limit: float = float("inf")) -> torch.Tensor:
    """[.., R] -> the activation's [.., R / 2] (GATED), [.., R] (relu2), y itself (act None)."""
    if act == "silu":
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    if act == "gpt_oss":
        gate, up = y[..., 0::2].clamp(max=limit), y[..., 1::2].clamp(-limit, limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    if act == "relu2":
        return torch.square(F.relu(y))
    return y


def moe_pairs_reference(x: torch.Tensor, experts: torch.Tensor, weight: torch.Tensor, pairs_per_token: int,
                        scale: torch.Tensor | None = None, act: str | None = None, bias: torch.Tensor | None = None,
                        alpha: float = 1.0, limit: float = float("inf")) -> torch.Tensor:
    rows = x.float().repeat_interleave(pairs_per_token, 0)[:, :, None]  # [P, K, 1]
    y = torch.bmm(weight.index_select(0, experts).float(), rows)[..., 0]  # [P, R]
    if bias is not None:
        y = y + bias.index_select(0, experts).float()
    out = activate(y, act, alpha, limit)
    if scale is not None:
        out = out * scale.float()[:, None]
    return out.to(x.dtype)
