"""conv_steps: a recurrent layer's causal depthwise convolution over a score call's tokens (the Gated DeltaNet's, KDA's,
Mamba2's, Mamba1's, LFM2's short convolution), a chain's or a token tree's, from each row's starting window, every
token's window kept as its snapshot; validation + dispatch. The math: reference.py.

Backends: "triton" (triton.py: one launch; CUDA, or the interpreter), "torch" (reference.py: the spec; "cpp", on CPU
tensors, runs it too: no C++ op of its own). backend=None: triton on CUDA, else torch.
"""
import torch

from ..recurrent import check_rows, steps_backend
from .reference import chain_parents, conv_steps_reference, window_sources

__all__ = ["conv_steps", "conv_steps_reference", "chain_parents", "window_sources"]


def _check(x, weight, bias, committed, snapshots, start, slot, real, parent):
    for name, t, ndim in (("x", x, 3), ("weight", weight, 2), ("committed", committed, 3), ("snapshots", snapshots, 4),
                          ("start", start, 1), ("slot", slot, 2), ("real", real, 2)):
        if not isinstance(t, torch.Tensor) or t.dim() != ndim:
            raise ValueError(f"{name} must be a {ndim}-d tensor, got {getattr(t, 'shape', type(t).__name__)}")
    batch, n, channels = x.shape
    kernel = weight.shape[1]
    if weight.shape[0] != channels or kernel < 2:
        raise ValueError(f"weight must be [C = {channels}, K >= 2], got {tuple(weight.shape)}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (channels,)):
        raise ValueError(f"bias must be None or [{channels}], got {getattr(bias, 'shape', bias)}")
    if tuple(committed.shape[1:]) != (channels, kernel - 1) or committed.shape[0] < batch:
        raise ValueError(f"committed must be [>= {batch}, {channels}, {kernel - 1}], got {tuple(committed.shape)}")
    if tuple(snapshots.shape[2:]) != (channels, kernel - 1) or snapshots.shape[0] < batch:
        raise ValueError(f"snapshots must be [>= {batch}, slots, {channels}, {kernel - 1}], got {tuple(snapshots.shape)}")
    check_rows(batch, n, start, slot, real, parent)
    for name, t in (("x", x), ("weight", weight), ("committed", committed), ("snapshots", snapshots)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a float tensor, got {t.dtype}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name} needs a unit stride along its last dim")
    for name, t in (("weight", weight), ("bias", bias), ("committed", committed), ("snapshots", snapshots),
                    ("start", start), ("slot", slot), ("real", real), ("parent", parent)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def conv_steps(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, committed: torch.Tensor,
               snapshots: torch.Tensor, start: torch.Tensor, slot: torch.Tensor, real: torch.Tensor, *,
               parent: torch.Tensor | None = None, silu: bool = False, backend=None) -> torch.Tensor:
    """x [B, n, C] (the call's inputs as rows, each row's real tokens last; unit stride along C), weight [C, K], bias
    [C] or None, committed [>= B, C, K - 1] and snapshots [>= B, slots, C, K - 1] (the windows, oldest first), start
    [B] int64 (-1: the committed window, else that snapshot), slot [B, n] int64 (where each token's window goes), real
    [B, n] bool, parent [B, n] int64 or None (a token tree: each token's parent among the call's, -1 a root; parents
    before their children) -> y [B, n, C] in weight's dtype (silu applied where asked); snapshots written in place.
    No host sync (graph safe)."""
    _check(x, weight, bias, committed, snapshots, start, slot, real, parent)
    if steps_backend(backend, x.device, "conv_steps") == "triton":
        from .triton import conv_steps_triton

        return conv_steps_triton(x, weight, bias, committed, snapshots, start, slot, real, parent, silu)
    return conv_steps_reference(x, weight, bias, committed, snapshots, start, slot, real, parent, silu)
