"""The spec of conv_steps (kernels/causal_conv/__init__.py): a recurrent layer's causal depthwise convolution over a
score call's tokens (Gated DeltaNet, KDA, Mamba2, Mamba1, LFM2's short convolution), each token's window its own input
and the K - 1 before it along its row, or along its ancestors in a token tree, past the call's first token the row's
starting window; every token's window (its last K - 1 inputs) kept as its snapshot. In torch ops.

Per row b, channel c and token t (K the kernel width):
    S0 = committed[b] where start[b] < 0, else snapshots[b, start[b]]         [C, K - 1], oldest first
    the token j levels above t: its parent (parent[b, t], or in a chain the token before where that one is real),
    and so on; past the call (no such token) the window continues with S0's last entries
    window_t = [input j = K - 1 levels up, ..., 1 level up, x_t]              [C, K]
    y_t = sum_k window_t[:, k] weight[:, k] (float32, rounded once to weight's dtype) + bias; silu(y_t) where asked
    snapshots[b, slot[b, t]] = window_t[:, 1:]
(runners/paged_recurrent.py's depthwise is the same sum and rounding.) A padded column (real False, a row's first
columns) is no token's parent; its own output and snapshot (the spare slot) are never read.
"""
import torch
import torch.nn.functional as F


def chain_parents(real: torch.Tensor) -> torch.Tensor:
    """A chain's parents [B, n] int64: the column before where it is real, else -1 (each row's real tokens last)."""
    before = torch.arange(real.shape[1], device=real.device) - 1
    return torch.where(F.pad(real, (1, 0))[:, :-1], before, -1).expand_as(real)


def window_sources(parent: torch.Tensor, kernel: int) -> torch.Tensor:
    """parent [B, n] -> each token's window sources [B, n, K], oldest first, as indices into [S0 (K - 1) | the call's
    inputs (n)]: K - 1 + i for the call's token i, K - 1 - m for the m-th entry past the call."""
    batch, n = parent.shape
    node = torch.arange(n, device=parent.device).expand(batch, n)
    cols, beyond = [kernel - 1 + node], torch.zeros_like(node)
    for _ in range(kernel - 1):
        up = torch.where(node >= 0, parent.gather(1, node.clamp(min=0)), -1)
        beyond = beyond + (up < 0).long()
        cols.append(torch.where(up >= 0, kernel - 1 + up, kernel - 1 - beyond))
        node = up
    return torch.stack(cols[::-1], dim=-1)


def conv_steps_reference(x, weight, bias, committed, snapshots, start, slot, real, parent=None,
                         silu=False) -> torch.Tensor:
    """Shapes as conv_steps (kernels/causal_conv/__init__.py) -> y [B, n, C] in weight's dtype; snapshots written."""
    batch, n, channels = x.shape
    kernel = weight.shape[1]
    ids = torch.arange(batch, device=x.device)
    first = torch.where((start < 0)[:, None, None], committed[:batch], snapshots[ids, start.clamp(min=0)])
    sources = window_sources(chain_parents(real) if parent is None else parent, kernel)  # [B, n, K]
    inputs = torch.cat((first.to(x.dtype), x.transpose(1, 2)), dim=-1)  # [B, C, K - 1 + n]
    windows = inputs.gather(2, sources.reshape(batch, 1, -1).expand(-1, channels, -1)).view(batch, channels, n, kernel)
    y = (windows.float() * weight.float()[:, None, :]).sum(-1).to(weight.dtype)
    if bias is not None:
        y = y + bias[:, None]
    if silu:
        y = F.silu(y)
    snapshots[ids[:, None], slot] = windows[..., 1:].transpose(1, 2).to(snapshots.dtype)
    return y.transpose(1, 2).contiguous()  # [B, n, C], as the kernel writes it
