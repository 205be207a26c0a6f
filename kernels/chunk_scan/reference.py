"""The spec of chunk_scan (kernels/chunk_scan/__init__.py): a prefill's linear recurrence carried across its chunks,
in torch ops, a chunk at a time. Per row b, head h and chunk c (L tokens), with S [Dk, Dv] float32 the state before
the chunk (the given one before chunk 0):

    F = u_c - w_c S          (the delta rule: the chunk's updates after the carried state's share; no w: F = u_c)
    o_c = qd_c S + a_c F     [L, Dv]: the carried state's share of each token's output plus the chunk's own
    S = decay_c * S + kd_c^T F    (decay_c one factor a head, or one a key row: broadcast over Dv)

Everything a chunk needs that does not depend on S -- qd (q times its decay from the chunk's start), kd (k times its
decay to the chunk's end), a (the causal within-chunk weights), u and w (the WY form's solved updates) -- the caller
computes for all chunks at once: what is left is the serial part, which this op runs.
"""
import torch


def chunk_scan_reference(qd, kd, a, u, decay, state, w=None) -> torch.Tensor:
    """Shapes as chunk_scan (kernels/chunk_scan/__init__.py) -> o [B, H, C, L, Dv] float32; state written in place
    with the state after the last chunk."""
    s = state.float()
    outs = []
    for c in range(qd.shape[2]):
        fresh = u[:, :, c].float()
        if w is not None:
            fresh = fresh - w[:, :, c].float() @ s
        outs.append(qd[:, :, c].float() @ s + a[:, :, c].float() @ fresh)
        d = decay[:, :, c].float()
        s = s * (d[..., None] if d.dim() == 3 else d[..., None, None]) + kd[:, :, c].float().transpose(-1, -2) @ fresh
    state.copy_(s)
    return torch.stack(outs, dim=2) if outs else u.new_zeros(u.shape, dtype=torch.float32)
