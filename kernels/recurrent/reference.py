"""The spec of recurrent_steps (kernels/recurrent/__init__.py): a linear-recurrent layer's score call, token by
token, in torch ops. Per row b, value head h (key head h // (Hv / Hk)) and token t, with S [Dk, Dv] float32:

    S0 = committed[b, h]           where start[b] < 0, else snapshots[b, start[b], h]
    q, k = q_t, k_t (float32);     qk_norm: q, k = x * rsqrt(sum(x^2) + 1e-6) each;  q = q * scale
    D = exp(g_t)                   g [.., Hv] one log-decay a head (broadcast over S), or [.., Hv, Dk] one a key row;
                                   with decay_rates A [Hv, Dk, Dv]: D = exp(A * g_t), g [.., Hv, Dv] a step a value
                                   column (Mamba1: a channel's dt times its A row)
    S' = D * S
    delta: S' = S' + k (beta_t (v_t - S'^T k))^T      (Gated DeltaNet, KDA)
    else:  S' = S' + k v_t^T                          (Mamba2's SSD with k = B, v = dt x; lightning attention)
    (a token tree, parent given: S = the state after token parent[b, t] of this call, or S0 where it is -1)
    S = S' where real[b, t], else S (a padded column changes nothing)
    o_t = S^T q                    [Dv] float32
    snapshots[b, slot[b, t], h] = S  (slot -1: none kept; a prefill keeps its last token's only)

(layout "vk": the state is stored [Dv, Dk], Mamba2's [P, N]; the same math.) Every real token's snapshot lands
where runners/paged_recurrent.py's commit reads it; padded columns write the unchanged state to the slot they are
given (the spare one)."""
import torch

QK_NORM_EPS = 1e-6  # transformers' l2norm (Gated DeltaNet, KDA) and FLA's


def recurrent_steps_reference(q, k, v, g, committed, snapshots, start, slot, real, beta=None, qk_norm=False,
                              scale=1.0, layout="kv", parent=None, decay_rates=None) -> torch.Tensor:
    """Shapes as recurrent_steps (kernels/recurrent/__init__.py) -> o [B, n, Hv, Dv] float32; snapshots written."""
    batch, n, hk = q.shape[:3]
    hv = v.shape[2]
    ratio = hv // hk
    ids = torch.arange(batch, device=q.device)
    fresh = (start < 0).view(-1, 1, 1, 1)
    first = torch.where(fresh, committed[:batch], snapshots[ids, start.clamp(min=0)]).float()
    if layout == "vk":
        first = first.transpose(-1, -2)  # [B, Hv, Dk, Dv]
    state = first
    outs = []
    for t in range(n):
        if parent is not None:  # a token tree: the parent's state (its snapshot, written above), or the row's start
            p = parent[:, t]
            stored = snapshots[ids, slot.gather(1, p.clamp(min=0)[:, None])[:, 0]].float()
            state = torch.where((p < 0).view(-1, 1, 1, 1), first, stored.transpose(-1, -2) if layout == "vk" else stored)
        qt, kt = (x[:, t].float().repeat_interleave(ratio, dim=1) for x in (q, k))  # [B, Hv, Dk]
        if qk_norm:
            qt, kt = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + QK_NORM_EPS) for x in (qt, kt))
        qt = qt * scale
        vt = v[:, t].float()  # [B, Hv, Dv]
        gt = g[:, t].float()
        if decay_rates is not None:  # rates [Hv, Dk, Dv] times a step a value column [B, Hv, Dv]
            decay = (decay_rates.float() * gt[:, :, None, :]).exp()
        else:
            decay = gt.exp()[..., None] if gt.dim() == 3 else gt.exp()[..., None, None]  # [B, Hv, Dk | 1, 1]
        updated = state * decay
        if beta is not None:
            delta = (vt - (updated * kt[..., None]).sum(-2)) * beta[:, t].float()[..., None]
            updated = updated + kt[..., None] * delta[..., None, :]
        else:
            updated = updated + kt[..., None] * vt[..., None, :]
        state = torch.where(real[:, t].view(-1, 1, 1, 1), updated, state)
        outs.append((state * qt[..., None]).sum(-2))
        at, kept = slot[:, t].clamp(min=0), (slot[:, t] >= 0).view(-1, 1, 1, 1)  # slot -1: no snapshot
        snapshots[ids, at] = torch.where(kept, (state.transpose(-1, -2) if layout == "vk" else state).to(snapshots.dtype),
                                         snapshots[ids, at])
    return torch.stack(outs, dim=1)
