"""Lightning attention (MiniMax-Text-01 / MiniMax-M1's linear attention layers) on the paged runners
(runners/paged_minimax.py), its state rolled back by runners/paged_recurrent.py.

The math is transformers 5.24's MiniMaxLightningAttention, eval mode, per head h of H (head_dim D) and token t:
    [q | k | v] = act(qkv_proj(x)) per head                      each [D]; act the config's hidden_act
    S_t = lambda_h S_{t-1} + k_t^T v_t                            S [D, D], lambda_h = exp(-slope_h)
    o_t = q_t S_t
    out = out_proj(sigmoid(output_gate(x)) * norm(o))            norm: an RMSNorm over the H D outputs
slope_h = 2^(-8 (h + 1) / H) (1 - layer / (layers - 1 + 1e-5) + 1e-5): the module's slope_rate buffer, read.
transformers runs a prompt in blocks (block_size, the decays of the block form) and a cached call token by
token: the same sums. Here a call's tokens run in chunks of CHUNK columns: within a chunk
    o_t = lambda^(r_t - p) q_t S_p + sum_{s <= t} lambda^(r_t - r_s) (q_t . k_s) v_s
(r: a token's rank among its row's real tokens, p: the rank of the last real token before the chunk, S_p the
state after it), in float32 with the state (transformers keeps it in the model dtype). A score call's tokens
write the state after each as its snapshot; a prefill keeps the last. Padded positions (a row's first columns)
have k = v = 0 and no rank of their own: they neither decay nor update the state. On the Triton path a score call
is one launch instead (kernels/recurrent: the state tile in registers, token by token, every snapshot stored from
it). A prefill runs the chunked form of runners/chunked_prefill.py (a decay of exp(-slope) at each real token), its
carry across the chunks one launch on the Triton path (kernels/chunk_scan). Not timed on a GPU.
"""
import torch

from ._linear import linear
from .chunked_prefill import scalar_decay_prefill
from .paged_olmo2 import llama_rms_norm

# Columns a chunk: the intra-chunk weights are [B, H, CHUNK, CHUNK] float32 (a prefill's whole prompt at once would
# be [B, H, n, n]: 64 heads x 4k^2 x 4 B = 4 GB a row at MiniMax-Text-01's width)
CHUNK = 64


# MiniMaxLightningAttention's output norm: MiniMaxRMSNorm(H D) at its default eps (not the config's rms_norm_eps)
NORM_EPS = 1e-6


def slope_rates(heads: int, layer: int, layers: int) -> torch.Tensor:
    """MiniMaxLightningAttention.get_slope_rate's [H] float32, its op order (what the module's slope_rate buffer
    holds before any cast): 2^(-8 (h + 1) / H) (1 - layer / (layers - 1 + 1e-5) + 1e-5)."""
    base = 1 / (2 ** (8 / heads))
    return base ** (torch.arange(heads) + 1) * (1 - layer / (layers - 1 + 1e-5) + 1e-5)


class Lightning:
    """A lightning attention layer's tensors (references) and sizes: qkv_proj, output_gate, out_proj (weight, bias),
    the output norm (weight, eps), its activation, slope [heads] float32 (a tensor-parallel rank's: its heads')."""

    def __init__(self, qkv, gate, out, norm, act, heads: int, dim: int, slope: torch.Tensor):
        self.qkv, self.gate, self.out, self.norm, self.act = qkv, gate, out, norm, act
        self.heads, self.dim, self.slope = heads, dim, slope

    @classmethod
    def of(cls, module) -> "Lightning":
        """From a MiniMaxLightningAttention (its slope_rate buffer read: a bf16 model's holds it rounded)."""
        qkv, gate, out = ((m.weight, m.bias) for m in (module.qkv_proj, module.output_gate, module.out_proj))
        return cls(qkv, gate, out, (module.norm.weight, module.norm.variance_epsilon), module.act_fn,
                   module.num_attention_heads, module.head_dim, module.slope_rate.detach().reshape(-1).float())

    @property
    def shapes(self) -> tuple:
        """(no convolution: a 0-wide window, the recurrent state (H, D, D)): PagedRecurrentRunner's entry."""
        return (1, 0), (self.heads, self.dim, self.dim)


def _powers(slope: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """lambda^e = exp(-slope e) for exponents e [B, ...] (clamped at 0: a padded column's) -> [B, H, ...]."""
    e = exponent.clamp(min=0).float()
    return torch.exp(-slope.view(1, -1, *(1,) * (e.dim() - 1)) * e.unsqueeze(1))


def lightning_scan(slope: torch.Tensor, q, k, v, rank, state) -> tuple:
    """A score call's chunks: q, k, v [B, H, n, D] float32 (zero at padding), rank [B, n] (each real token's rank in
    its row; -1 before the first), state [B, H, D, D] float32 (after the row's earlier tokens) -> (o [B, H, n, D], the
    state after the last column, the state after each column [B, n, H, D, D]). (A prefill, which keeps the last state
    only: runners/chunked_prefill.py.)"""
    outs, states = [], []
    n = q.shape[2]
    for c0 in range(0, n, CHUNK):
        c1 = min(c0 + CHUNK, n)
        qc, kc, vc, rc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], rank[:, c0:c1]
        before = rank[:, c0 - 1] if c0 else torch.full_like(rank[:, 0], -1)  # p: the rank the state holds
        causal = torch.ones(c1 - c0, c1 - c0, dtype=torch.bool, device=q.device).tril()
        weights = torch.where(causal, _powers(slope, rc[:, :, None] - rc[:, None, :]), 0.0)  # [B, H, c, c]
        from_state = _powers(slope, rc - before[:, None])[..., None]  # [B, H, c, 1]
        outs.append((qc @ kc.transpose(-1, -2) * weights) @ vc + (qc * from_state) @ state)
        # S_t = lambda^(r_t - p) S_p + sum_{s <= t} lambda^(r_t - r_s) k_s^T v_s
        update = torch.einsum("bhts,bhsd,bhse->bthde", weights, kc, vc)
        states.append(from_state.transpose(1, 2)[..., None] * state[:, None] + update)
        state = states[-1][:, -1]
    return torch.cat(outs, dim=2), state, torch.cat(states, dim=1)


def lightning_forward(net: Lightning, st, h: torch.Tensor, rows: tuple, prefilling: bool, norm=llama_rms_norm) -> torch.Tensor:
    """One lightning attention layer over a call's tokens h [T, hidden] (rows: PagedRecurrentRunner._row_layout's)
    -> its output [T, hidden] (a tensor-parallel rank's partial: out_proj over its heads' columns): from zero states
    in a prefill (the last ones committed), from each row's state (committed, or the last snapshot) in a score call,
    a snapshot written after each token. norm(o [T, H D], (weight, eps)): the output norm (a tensor-parallel rank's
    takes the mean square over every rank's heads)."""
    index, real, slot, start, _ = rows
    batch, n = index.shape
    total, heads, dim = h.shape[0], net.heads, net.dim
    qkv = net.act(linear(h, *net.qkv)).view(total, heads, 3 * dim)
    by_row = torch.cat((qkv, torch.zeros_like(qkv[:1])))[index].float()  # [B, n, H, 3D]: padding zeros
    q, k, v = by_row.permute(0, 2, 1, 3).split(dim, dim=-1)  # [B, H, n, D] each
    if not prefilling and st.by_steps(rows):  # the Triton path (one launch: the scan, every snapshot), or a token tree
        g = (-net.slope)[None, None].expand(batch, n, heads)  # the head's decay at every real token
        q, k, v = by_row.split(dim, dim=-1)  # [B, n, H, D] each
        o = st.steps(q, k, v, g, rows).transpose(1, 2)  # [B, H, n, D]
    elif prefilling:  # chunks (runners/chunked_prefill.py), a real token decaying its head's state by exp(-slope)
        g = -net.slope.to(h.device)[None, :, None] * real[:, None, :]  # [B, H, n]: padding no decay
        o = scalar_decay_prefill(st.chunk_scan, q, k, v, g, st.rec[:batch].zero_(), CHUNK)
    else:  # the snapshot after each token (a padded column writes the spare slot)
        rank = real.long().cumsum(1) - 1
        o, _, after = lightning_scan(net.slope, q, k, v, rank, st.start_rec(batch, start))
        st.rec_tent[torch.arange(batch, device=h.device)[:, None], slot] = after
    packed = torch.zeros(total + 1, heads * dim, dtype=h.dtype, device=h.device)
    packed.index_copy_(0, index.reshape(-1), o.transpose(1, 2).reshape(batch * n, -1).to(h.dtype))
    gated = torch.sigmoid(linear(h, *net.gate)) * norm(packed[:total], net.norm)
    return linear(gated, *net.out)
