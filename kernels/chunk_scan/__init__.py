"""chunk_scan: the serial part of a linear-recurrent layer's chunked prefill (the Gated DeltaNet of Qwen3-Next /
Qwen3.5 and OLMo Hybrid, Mamba2's SSD, MiniMax's lightning attention): the state carried from chunk to chunk, each
chunk's outputs from it; validation + dispatch. The math: reference.py.

The layers' prefills compute every chunk's S-independent terms (decayed q and k, the within-chunk weights, the
delta rule's solved updates) in a few batched torch ops, then this op walks the chunks. In torch ops that walk is
~6-10 launches a chunk (a 4k-token prompt in chunks of 64: ~500 a layer); the Triton kernel is one launch a layer.

Backends: "triton" (triton.py: one launch, the state tile in registers, tl.dot on tensor cores; CUDA, or the interpreter),
"torch" (reference.py: the spec; "cpp", on CPU tensors, runs it too: no C++ op of its own). backend=None: triton on
CUDA, else torch.
"""
import torch

from ..recurrent import steps_backend
from .reference import chunk_scan_reference

__all__ = ["chunk_scan", "chunk_scan_reference", "PRECISIONS"]


def _check(qd, kd, a, u, decay, state, w):
    for name, t in (("qd", qd), ("kd", kd), ("a", a), ("u", u), ("state", state)) + ((("w", w),) if w is not None
                                                                                       else ()):
        if not isinstance(t, torch.Tensor) or t.dim() != (4 if name == "state" else 5):
            raise ValueError(f"{name} must be a {4 if name == 'state' else 5}-d tensor, got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    batch, heads, chunks, size, dk = qd.shape
    dv = u.shape[-1]
    if tuple(kd.shape) != tuple(qd.shape) or (w is not None and tuple(w.shape) != tuple(qd.shape)):
        raise ValueError(f"kd{' and w' if w is not None else ''} must have qd's shape {tuple(qd.shape)}, got "
                         f"{tuple(kd.shape)}{'' if w is None else ', ' + str(tuple(w.shape))}")
    if tuple(a.shape) != (batch, heads, chunks, size, size):
        raise ValueError(f"a must be [B, H, C, L, L] = {[batch, heads, chunks, size, size]}, got {tuple(a.shape)}")
    if tuple(u.shape[:4]) != (batch, heads, chunks, size):
        raise ValueError(f"u must be [B, H, C, L, Dv] = {[batch, heads, chunks, size, 'Dv']}, got {tuple(u.shape)}")
    if not isinstance(decay, torch.Tensor) or tuple(decay.shape) not in ((batch, heads, chunks),
                                                                          (batch, heads, chunks, dk)):
        raise ValueError(f"decay must be [B, H, C] = {[batch, heads, chunks]} or [B, H, C, Dk] = "
                         f"{[batch, heads, chunks, dk]}, got {getattr(decay, 'shape', type(decay).__name__)}")
    if tuple(state.shape) != (batch, heads, dk, dv):
        raise ValueError(f"state must be [B, H, Dk, Dv] = {[batch, heads, dk, dv]}, got {tuple(state.shape)}")
    if state.dtype != torch.float32:
        raise TypeError(f"the state is float32, got {state.dtype}")
    for name, t in (("qd", qd), ("kd", kd), ("a", a), ("u", u), ("decay", decay)) + ((("w", w),) if w is not None
                                                                                       else ()):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a float tensor, got {t.dtype}")
        if t.device != state.device:
            raise ValueError(f"{name} is on {t.device} but the state is on {state.device}")


PRECISIONS = ("tf32x3", "tf32")  # the Triton kernel's dots: float32's precision (three tf32 products), or one tf32


def chunk_scan(qd: torch.Tensor, kd: torch.Tensor, a: torch.Tensor, u: torch.Tensor, decay: torch.Tensor,
               state: torch.Tensor, *, w: torch.Tensor | None = None, precision: str = "tf32x3",
               backend=None) -> torch.Tensor:
    """A prefill's chunks in order (reference.py's math), B rows x H heads, C chunks of L tokens:
    qd, kd [B, H, C, L, Dk] (q decayed from the chunk's start, k decayed to its end), a [B, H, C, L, L] (each token's
    weights on the chunk's tokens, causal), u [B, H, C, L, Dv] (the chunk's updates), w [B, H, C, L, Dk] or None (the
    delta rule: the updates' share of the carried state), decay [B, H, C] or [B, H, C, Dk] (the chunk's whole decay a
    head or a key row), state [B, H, Dk, Dv] float32 (any strides: a transposed view holds Mamba2's [P, N] state),
    the start in and the state after the last chunk out, in place -> o [B, H, C, L, Dv] float32. Padding a prompt
    to whole chunks: tokens with k = 0 and no decay leave the state as it is. precision: the Triton kernel's products
    (PRECISIONS; the torch form's are float32's). No host sync (graph safe)."""
    _check(qd, kd, a, u, decay, state, w)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if steps_backend(backend, state.device, "chunk_scan") == "triton":
        from .triton import chunk_scan_triton

        return chunk_scan_triton(qd, kd, a, u, decay, state, w, precision)
    return chunk_scan_reference(qd, kd, a, u, decay, state, w)
