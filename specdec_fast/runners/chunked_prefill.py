"""A linear-recurrent layer's prefill in chunks (the Gated DeltaNet's, KDA's, Mamba2's SSD, lightning attention's):
from the state before the prompt, each chunk's S-independent terms for many chunks at once in a few batched torch ops,
then the state carried across the chunks by kernels/chunk_scan (RecurrentStates.chunk_scan: one Triton launch on the
Triton path, a torch loop on the others) -- the form of FLA's and transformers' chunked kernels.

With per row and head a log-decay G_t summed over the chunk up to token t (a head's: scalar_decay_prefill; a key
row's: row_decay_prefill) and the chunk's state S_0:
    o_t = e^(G_t) q_t S_0 + sum_(j <= t) e^(G_t - G_j) (q_t . k_j) f_j
    S_L = e^(G_L) S_0 + sum_j e^(G_L - G_j) k_j f_j^T
where f = v (Mamba2, lightning) or, under the delta rule (beta given), the solution of the chunk's unit
lower-triangular system (I + strictly_lower(beta_i k_i . k_j e^(G_i - G_j))) f = beta (v - e^(G) k S_0), solved for
its two right-hand sides apart (u = the v part, w = the S_0 part: f = u - w S_0, the WY form).

Padding: a row's own padding (its first columns) has k = v = 0 and no decay; the tokens that fill the last chunk are
zeros too, so neither changes the state. The chunks' terms are made a group of chunks at a time, the group sized so
its temporaries stay near PREFILL_BYTES (a [B, H, group, L] tensor or [.., L, Dk] a key row's decays; the state
carried between groups by the same op).
"""
import torch

# The bytes a group of chunks' terms may take at once (their few largest temporaries counted), a count: a row of
# Qwen3-Next (32 value heads of 128, chunks of 64) makes 2176 tokens a group; of Nemotron-H 8B (128 heads), 576.
PREFILL_BYTES = 256 << 20


def _group_tokens(size: int, per_chunk_bytes: int) -> int:
    """Tokens a group of chunks: as many whole chunks as PREFILL_BYTES allows, at least one."""
    return size * max(1, PREFILL_BYTES // max(1, per_chunk_bytes))


def _as_chunks(t: torch.Tensor, size: int) -> torch.Tensor:
    """[B, H, n, ...] -> [B, H, C, L, ...], the last chunk's missing tokens zeros."""
    n = t.shape[2]
    pad = -n % size
    if pad:
        t = torch.cat((t, t.new_zeros(*t.shape[:2], pad, *t.shape[3:])), dim=2)
    return t.reshape(*t.shape[:2], (n + pad) // size, size, *t.shape[3:])


def _solved(system: torch.Tensor, rhs: tuple) -> tuple:
    """Each of rhs [.., L, D] through the unit lower-triangular system [.., L, L] (its stored diagonal not read)."""
    return tuple(torch.linalg.solve_triangular(system, r, upper=False, unitriangular=True) for r in rhs)


def scalar_decay_prefill(scan, q, k, v, g, state: torch.Tensor, size: int, beta=None) -> torch.Tensor:
    """q, k [B, H, n, Dk], v [B, H, n, Dv] float32, g [B, H, n] float32 (a log-decay a head and token), beta [B, H, n]
    (the delta rule) or None, state [B, H, Dk, Dv] float32 (the start in, the state after the last token out, in
    place: any strides), chunks of ``size`` tokens -> o [B, H, n, Dv] float32. scan: kernels/chunk_scan.chunk_scan's
    signature with the backend chosen (the layer's RecurrentStates.chunk_scan)."""
    batch, heads, n, dk = k.shape
    per_chunk = batch * heads * size * (3 * size + 4 * dk + 2 * v.shape[-1]) * 4
    step = _group_tokens(size, per_chunk)
    lower = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    strict, eye = lower.tril(-1), torch.eye(size, device=q.device)
    outs = []
    for begin in range(0, n, step):
        part = slice(begin, begin + step)
        qc, kc, vc = (_as_chunks(t[:, :, part], size) for t in (q, k, v))  # [B, H, C, L, D]
        total = g[:, :, part].shape[-1]
        cum = _as_chunks(g[:, :, part], size).cumsum(-1)  # [B, H, C, L]: the log-decay from the chunk's start
        gap = torch.where(lower, cum[..., :, None] - cum[..., None, :], float("-inf")).exp()  # [.., i, j]: j <= i
        lead, last = cum[..., None].exp(), cum[..., -1:]  # e^G from the chunk's start; G at its end
        w = None
        if beta is not None:
            bc = _as_chunks(beta[:, :, part], size)[..., None]
            k_beta = kc * bc
            # (I + strictly_lower(k_beta k^T . gap)) f = ...: each token's correction given the earlier ones'
            system = (k_beta @ kc.transpose(-1, -2) * gap).masked_fill(~strict, 0.0) + eye
            vc, w = _solved(system, (vc * bc, k_beta * lead))
        a = (qc @ kc.transpose(-1, -2)) * gap
        o = scan(qc * lead, kc * (last - cum)[..., None].exp(), a, vc, last[..., 0].exp(), state, w=w)
        outs.append(o.flatten(2, 3)[:, :, :total])
    return torch.cat(outs, dim=2)


def row_decay_prefill(scan, q, k, v, g, beta, state: torch.Tensor, size: int) -> torch.Tensor:
    """KDA's form: q, k, g [B, H, n, Dk] (g a log-decay a key row and token), v [B, H, n, Dv], beta [B, H, n], float32;
    state [B, H, Dk, Dv] float32 in place (as scalar_decay_prefill) -> o [B, H, n, Dv] float32. The decays between a
    chunk's tokens are [.., L, L, Dk] (transformers' chunk_kimi_delta_attention's terms, its op order)."""
    batch, heads, n, dk = k.shape
    per_chunk = batch * heads * size * size * dk * 4 * 3  # the decays and the two products over them
    step = _group_tokens(size, per_chunk)
    causal = torch.triu(torch.ones(size, size, dtype=torch.bool, device=q.device), diagonal=0)
    strict = torch.triu(torch.ones(size, size, dtype=torch.bool, device=q.device), diagonal=1)
    eye = torch.eye(size, device=q.device)
    outs = []
    for begin in range(0, n, step):
        part = slice(begin, begin + step)
        qc, kc, vc, gc = (_as_chunks(t[:, :, part], size) for t in (q, k, v, g))  # [B, H, C, L, D]
        total = g[:, :, part].shape[2]
        bc = _as_chunks(beta[:, :, part], size)[..., None]
        gc = gc.cumsum(dim=-2)
        k_beta = kc * bc
        decay = (gc.unsqueeze(-2) - gc.unsqueeze(-3)).masked_fill(strict[..., None], float("-inf")).exp()
        system = (k_beta.unsqueeze(-2) * kc.unsqueeze(-3) * decay).sum(dim=-1).masked_fill(causal, 0) + eye
        u, w = _solved(system, (vc * bc, k_beta * gc.exp()))
        a = (qc.unsqueeze(-2) * kc.unsqueeze(-3) * decay).sum(dim=-1).masked_fill(strict, 0)
        last = gc[..., -1:, :]  # [B, H, C, 1, Dk]
        o = scan(qc * gc.exp(), kc * (last - gc).exp(), a, u, last[..., 0, :].exp(), state, w=w)
        outs.append(o.flatten(2, 3)[:, :, :total])
    return torch.cat(outs, dim=2)
