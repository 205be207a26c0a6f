"""recurrent_steps: a linear-recurrent layer's score call (the K + 1 tokens of a verify, from each row's committed
state or last snapshot, a snapshot written after every token) -- the Gated DeltaNet (Qwen3-Next / Qwen3.5, OLMo
Hybrid), Kimi Delta Attention (a decay per key channel), Mamba2's SSD (k = B, q = C, v = dt x) and MiniMax's
lightning attention (no delta rule); a chain's tokens, or a token tree's nodes each from its parent's state;
validation + dispatch. The math: reference.py.

Backends: "triton" (triton.py: one launch, the state tile in registers; CUDA, or the interpreter), "torch"
(reference.py, token by token: the spec; "cpp", on CPU tensors, runs it too: no C++ op of its own). backend=None: triton on CUDA,
else torch. The runners call it on their Triton path only (their CPU paths keep the block forms, which batch a
call's tokens into a few large ops).
"""
import torch

from .._backend import resolve_backend
from .reference import QK_NORM_EPS, recurrent_steps_reference

__all__ = ["recurrent_steps", "recurrent_steps_reference", "QK_NORM_EPS", "LAYOUTS", "check_rows", "steps_backend"]

LAYOUTS = ("kv", "vk")  # the state stored [Dk, Dv] (Gated DeltaNet, KDA, lightning) or [Dv, Dk] (Mamba2's [P, N])


def check_rows(batch: int, n: int, start, slot, real, parent) -> None:
    """A score call's rows as the recurrent kernels take them (this op's and kernels/causal_conv's): start [B] and slot
    [B, n] int64, real [B, n] bool, parent None or [B, n] int64; ValueError / TypeError naming what is off."""
    if tuple(start.shape) != (batch,) or tuple(slot.shape) != (batch, n) or tuple(real.shape) != (batch, n):
        raise ValueError(f"start must be [{batch}], slot and real [{batch}, {n}]: got {tuple(start.shape)}, "
                         f"{tuple(slot.shape)}, {tuple(real.shape)}")
    if start.dtype != torch.int64 or slot.dtype != torch.int64 or real.dtype != torch.bool:
        raise TypeError(f"start and slot are int64, real bool: got {start.dtype}, {slot.dtype}, {real.dtype}")
    if parent is not None and (not isinstance(parent, torch.Tensor) or tuple(parent.shape) != (batch, n)
                               or parent.dtype != torch.int64):
        raise ValueError(f"parent must be None or an int64 [{batch}, {n}] tensor, got {getattr(parent, 'shape', parent)}")


def steps_backend(backend, device: torch.device, op: str) -> str:
    """The backend a recurrent kernel runs (this op, kernels/causal_conv): "triton" (CUDA, or the interpreter), else
    "torch" -- backend "cpp", on CPU tensors, takes the torch form (no C++ op of its own)."""
    if backend == "cpp" and device.type != "cpu":
        raise ValueError(f"backend='cpp' runs on CPU tensors, got tensors on {device}")
    return "triton" if resolve_backend("torch" if backend == "cpp" else backend, device, op) == "triton" else "torch"


def _check(q, k, v, g, committed, snapshots, start, slot, real, beta, layout, parent=None, decay_rates=None):
    for name, t, ndim in (("q", q, 4), ("k", k, 4), ("v", v, 4), ("committed", committed, 4), ("snapshots", snapshots, 5),
                          ("start", start, 1), ("slot", slot, 2), ("real", real, 2)):
        if not isinstance(t, torch.Tensor) or t.dim() != ndim:
            raise ValueError(f"{name} must be a {ndim}-d tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    batch, n, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if tuple(v.shape[:2]) != (batch, n) or hk == 0 or hv % hk:
        raise ValueError(f"v must be [B={batch}, n={n}, Hv, Dv] with Hv a multiple of q's {hk} heads, got {tuple(v.shape)}")
    if decay_rates is not None:
        if not isinstance(decay_rates, torch.Tensor) or tuple(decay_rates.shape) != (hv, dk, dv) \
                or not decay_rates.is_floating_point() or decay_rates.device != q.device:
            raise ValueError(f"decay_rates must be None or a float [Hv, Dk, Dv] = {[hv, dk, dv]} tensor on q's device, "
                             f"got {getattr(decay_rates, 'shape', decay_rates)}")
        if not isinstance(g, torch.Tensor) or tuple(g.shape) != (batch, n, hv, dv):
            raise ValueError(f"g must be [B, n, Hv, Dv] = {[batch, n, hv, dv]} with decay_rates (a step a value column), "
                             f"got {getattr(g, 'shape', type(g).__name__)}")
    elif not isinstance(g, torch.Tensor) or tuple(g.shape) not in ((batch, n, hv), (batch, n, hv, dk)):
        raise ValueError(f"g must be [B, n, Hv] = {[batch, n, hv]} or [B, n, Hv, Dk] = {[batch, n, hv, dk]}, got "
                         f"{getattr(g, 'shape', type(g).__name__)}")
    if beta is not None and (not isinstance(beta, torch.Tensor) or tuple(beta.shape) != (batch, n, hv)):
        raise ValueError(f"beta must be None or [B, n, Hv] = {[batch, n, hv]}, got {getattr(beta, 'shape', beta)}")
    state = (dk, dv) if layout == "kv" else (dv, dk)
    if tuple(committed.shape[1:]) != (hv, *state) or committed.shape[0] < batch:
        raise ValueError(f"committed must be [>= {batch}, {hv}, {state[0]}, {state[1]}] (layout {layout!r}), got "
                         f"{tuple(committed.shape)}")
    if tuple(snapshots.shape[2:]) != (hv, *state) or snapshots.shape[0] < batch:
        raise ValueError(f"snapshots must be [>= {batch}, slots, {hv}, {state[0]}, {state[1]}] (layout {layout!r}), "
                         f"got {tuple(snapshots.shape)}")
    if committed.dtype != torch.float32 or snapshots.dtype != torch.float32:
        raise TypeError(f"the states are float32, got {committed.dtype} and {snapshots.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g)) + ((("beta", beta),) if beta is not None else ()):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a float tensor, got {t.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)) + ((("g", g),) if g.dim() == 4 else ()):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride along its last dim")
    check_rows(batch, n, start, slot, real, parent)
    for name, t in (("k", k), ("v", v), ("g", g), ("committed", committed), ("snapshots", snapshots), ("start", start),
                    ("slot", slot), ("real", real)) + ((("beta", beta),) if beta is not None else ()) + (
                    (("parent", parent),) if parent is not None else ()):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


def recurrent_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, committed: torch.Tensor,
                    snapshots: torch.Tensor, start: torch.Tensor, slot: torch.Tensor, real: torch.Tensor, *,
                    beta: torch.Tensor | None = None, qk_norm: bool = False, scale: float = 1.0, layout: str = "kv",
                    parent: torch.Tensor | None = None, decay_rates: torch.Tensor | None = None,
                    backend=None) -> torch.Tensor:
    """A score call's n tokens of B rows through a linear recurrence (reference.py's math):
    q, k [B, n, Hk, Dk] (any float dtype; value head h reads key head h // (Hv / Hk)), v [B, n, Hv, Dv],
    g [B, n, Hv] or [B, n, Hv, Dk] log-decays (with decay_rates A [Hv, Dk, Dv]: g [B, n, Hv, Dv], the log-decay
    A * g: Mamba1's), beta [B, n, Hv] (the delta rule) or None (S += k v^T),
    committed [>= B, Hv, Dk, Dv] and snapshots [>= B, slots, Hv, Dk, Dv] float32 ([.., Dv, Dk] for layout "vk"),
    start [B] int64 (-1: the committed state, else that snapshot), slot [B, n] int64 (where each token's snapshot
    goes; -1 none: a prefill's tokens but the last -- a token tree's parents need theirs), real [B, n] bool (False: a padded column, no change), parent [B, n] int64 or None (a token tree: each
    token continues the state after token parent[b, t] of the call, -1 the row's start; parents precede their
    children, as TokenTree's breadth-first order has them) -> o [B, n, Hv, Dv] float32 (S^T q a token);
    snapshots written in place. No host sync (graph safe)."""
    _check(q, k, v, g, committed, snapshots, start, slot, real, beta, layout, parent, decay_rates)
    if steps_backend(backend, q.device, "recurrent_steps") == "triton":
        from .triton import recurrent_steps_triton

        return recurrent_steps_triton(q, k, v, g, committed, snapshots, start, slot, real, beta, qk_norm, scale, layout,
                                      parent, decay_rates)
    return recurrent_steps_reference(q, k, v, g, committed, snapshots, start, slot, real, beta, qk_norm, scale, layout,
                                     parent, decay_rates)
