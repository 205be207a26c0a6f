"""The spec of moe_pairs in plain torch (also the oracle): each (token, expert) pair's product
with its expert's weight.

x [T, K]; experts [P] int64 (pair p reads token p // pairs_per_token and expert experts[p]);
weight [E, N, K]. out[p, n] = sum_k weight[experts[p], n, k] x[p // r, k] in float32; gated
(weight [E, 2I, K]: gate rows, then up rows): out[p, i] = silu(gate_i) * up_i, [P, I]; scale [P]:
out[p] *= scale[p]. Rounded once to x's dtype.
"""
import torch
import torch.nn.functional as F


def moe_pairs_reference(x: torch.Tensor, experts: torch.Tensor, weight: torch.Tensor, pairs_per_token: int,
                        scale: torch.Tensor | None = None, gated: bool = False) -> torch.Tensor:
    rows = x.float().repeat_interleave(pairs_per_token, 0)[:, :, None]  # [P, K, 1]
    out = torch.bmm(weight.index_select(0, experts).float(), rows)[..., 0]  # [P, N]
    if gated:
        gate, up = out.chunk(2, dim=-1)
        out = F.silu(gate) * up
    if scale is not None:
        out = out * scale.float()[:, None]
    return out.to(x.dtype)
