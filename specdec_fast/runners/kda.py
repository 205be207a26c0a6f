"""Kimi Delta Attention (KDA: Kimi Linear's recurrent layers) on the paged runners (runners/paged_kimi_linear.py), its
state rolled back by runners/paged_recurrent.py.

The math is transformers 5.24's KimiLinearDeltaAttention, eval mode, per head h of H (head_dim D) and token t:
    q, k, v = silu(causal depthwise conv1d([q_proj x | k_proj x | v_proj x]))     (kernel K, no bias)
    q, k = l2norm(q), l2norm(k) (x / sqrt(sum x^2 + 1e-6), float32);  q = q * (1 / sqrt(D))
    g = -exp(A_log_h) softplus(f_b(f_a x) + dt_bias)       [D]: a decay per key channel (the difference from the
                                                           Gated DeltaNet's one per head), softplus linear past 20
    beta = sigmoid(b_proj x)                              (one a head)
    S = S * exp(g)[:, None];  S = S + k (beta (v - k^T S))^T;  o = q^T S            S [D, D] float32
    out = o_proj(RMSNormGated(o, g_b(g_a x)))             (a norm over each head's D, its weight in float32, times
                                                           sigmoid of the gate in float32)
A score call runs its tokens one by one from each row's state (transformers' recurrent rule, op for op), writing a
snapshot after each (on the Triton path one launch: kernels/recurrent, the state tile in registers); a prefill runs
transformers' chunk form (chunk_kimi_delta_attention's algebra, its forward substitution as one triangular solve a
chunk: runners/chunked_prefill.py row_decay_prefill) in chunks of CHUNK tokens from a zero state, keeping the last
(the carry across the chunks one launch on the Triton path: kernels/chunk_scan with a decay a key row). Padded
positions (a row's first columns) have q = k = v = 0, g = 0 and beta = 0: no decay, no update. Not timed on a GPU.
"""
import torch
import torch.nn.functional as F

from ._linear import linear
from .chunked_prefill import row_decay_prefill
from .paged_recurrent import prefill_conv

CHUNK = 64  # transformers' chunk_size; a chunk's decays are [B, H, CHUNK, CHUNK, D] float32 (chunked_prefill groups them)


class Kda:
    """A KDA layer's tensors (references) and sizes: q / k / v / b / f_a / f_b / g_a / g_b / o projections (weight,
    bias), the convolution [3 H D, K], A_log [H], dt_bias [H D], the gated norm (weight, eps); H heads of D (a
    tensor-parallel rank's: its heads)."""

    def __init__(self, q, k, v, conv, f_a, f_b, a_log, dt_bias, b, g_a, g_b, norm, out, heads: int, dim: int):
        self.q, self.k, self.v, self.conv, self.f_a, self.f_b = q, k, v, conv, f_a, f_b
        self.a_log, self.dt_bias, self.b, self.g_a, self.g_b, self.norm, self.out = a_log, dt_bias, b, g_a, g_b, norm, out
        self.heads, self.dim = heads, dim
        self.channels, self.kernel = conv.shape

    @classmethod
    def of(cls, module) -> "Kda":
        """From a KimiLinearDeltaAttention (its own tensors; the convolution a view [C, K])."""
        gate = module.forget_gate
        return cls(*((m.weight, m.bias) for m in (module.q_proj, module.k_proj, module.v_proj)), module.conv1d.weight[:, 0],
                   *((m.weight, m.bias) for m in (gate.f_a_proj, gate.f_b_proj)), gate.A_log.reshape(-1), gate.dt_bias,
                   *((m.weight, m.bias) for m in (module.b_proj, module.g_a_proj, module.g_b_proj)),
                   (module.o_norm.weight, module.o_norm.variance_epsilon), (module.o_proj.weight, module.o_proj.bias),
                   module.num_heads, module.head_dim)

    @property
    def shapes(self) -> tuple:
        """(conv state (3 H D, K - 1), recurrent state (H, D, D)): PagedRecurrentRunner's recurrent_shapes entry."""
        return (self.channels, self.kernel - 1), (self.heads, self.dim, self.dim)

    def gates(self, h: torch.Tensor) -> tuple:
        """h [T, hidden] -> (g [T, H, D] float32: the log decays; beta [T, H], model dtype)."""
        a = linear(linear(h, *self.f_a), *self.f_b).float() + self.dt_bias.float()
        softplus = torch.where(a > 20.0, a, torch.log(1.0 + torch.exp(a)))  # transformers' (its bound, not F.softplus')
        g = -self.a_log.float().exp()[:, None] * softplus.view(h.shape[0], self.heads, self.dim)
        return g, torch.sigmoid(linear(h, *self.b))

    def heads_of(self, y: torch.Tensor) -> tuple:
        """The convolution's output y [..., 3 H D] (model dtype, after silu) -> q (1 / sqrt(D)), k (L2-normed), v
        [..., H, D] float32."""
        lead = y.shape[:-1]
        q, k, v = (t.reshape(*lead, self.heads, self.dim).float() for t in y.split(self.heads * self.dim, dim=-1))
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)  # transformers' l2norm: sqrt and /, FLA's order
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        return q * (1 / self.dim ** 0.5), k, v  # transformers' scale, multiplied

    def output(self, o: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """o [T, H, D] (the model dtype, as transformers casts the rule's output) -> o_proj(RMSNormGated(o, gate))."""
        weight, eps = self.norm
        gate = linear(linear(h, *self.g_a), *self.g_b).view(o.shape)
        o32 = o.float()
        normed = weight.float() * (o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + eps))
        return linear((normed * torch.sigmoid(gate.float())).to(o.dtype).reshape(o.shape[0], -1), *self.out)


def kda_forward(net: Kda, st, h: torch.Tensor, rows: tuple, prefilling: bool) -> torch.Tensor:
    """One KDA layer over a call's tokens h [T, hidden] (rows: PagedRecurrentRunner._row_layout's) -> its output
    [T, hidden]: the chunk form from zero states in a prefill (the last ones committed), token by token from each
    row's state (committed, or the last snapshot) in a score call, a snapshot written after each token."""
    index, real, slot, start, _ = rows
    batch, n = index.shape
    total = h.shape[0]
    mixed = torch.cat([linear(h, *p) for p in (net.q, net.k, net.v)], dim=-1)
    g, beta = net.gates(h)
    # each row's tokens in order, its padding (first) zeros: no input, no decay, no update
    by_row, g, beta = (torch.cat((t, torch.zeros_like(t[:1])))[index] for t in (mixed, g, beta))
    ids = torch.arange(batch, device=h.device)
    if prefilling:
        y, last = prefill_conv(by_row.transpose(1, 2), net.conv, None, net.kernel)  # [B, C, n]
        st.conv[:batch].copy_(last)
        q, k, v = net.heads_of(F.silu(y).to(by_row.dtype).transpose(1, 2))  # [B, n, H, D]
        o = row_decay_prefill(st.chunk_scan, *(t.transpose(1, 2) for t in (q, k, v, g)), beta.float().transpose(1, 2),
                              st.rec[:batch].zero_(), CHUNK).transpose(1, 2)  # [B, n, H, D]
    elif st.by_steps(rows):  # the Triton path (one launch: the rule, the L2 norms, every snapshot), or a token tree
        y = st.conv_steps(by_row, net.conv, None, rows, silu=True)  # [B, n, 3 H D]
        q, k, v = (t.view(batch, n, net.heads, net.dim) for t in y.split(net.heads * net.dim, dim=-1))
        o = st.steps(q, k, v, g, rows, beta=beta, qk_norm=True, scale=net.dim ** -0.5)
    else:
        state = st.start_rec(batch, start)
        q, k, v = net.heads_of(st.conv_steps(by_row, net.conv, None, rows, silu=True))
        outs = []
        for t in range(n):  # transformers' recurrent rule
            on = real[:, t, None, None, None]
            decayed = state * g[:, t].exp().unsqueeze(-1)
            kv_mem = (decayed * k[:, t].unsqueeze(-1)).sum(dim=-2)
            delta = (v[:, t] - kv_mem) * beta[:, t].float().unsqueeze(-1)
            state = torch.where(on, decayed + k[:, t].unsqueeze(-1) * delta.unsqueeze(-2), state)
            outs.append((state * q[:, t].unsqueeze(-1)).sum(dim=-2))
            st.rec_tent[ids, slot[:, t]] = state  # a padded column writes the spare slot
        o = torch.stack(outs, dim=1)
    packed = torch.zeros(total + 1, net.heads, net.dim, dtype=h.dtype, device=h.device)
    packed.index_copy_(0, index.reshape(-1), o.to(h.dtype).reshape(batch * n, net.heads, net.dim))
    return net.output(packed[:total], h)
