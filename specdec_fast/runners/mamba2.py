"""A Mamba2 mixer on the paged hybrid runners (Nemotron-H: runners/paged_nemotron_h.py; Granite 4.0-H:
paged_granite_hybrid.py; Falcon-H1: paged_falcon_h1.py, with its variations in the Mamba2 class), its state
rolled back by runners/paged_recurrent.py.

The math is transformers 5.24's NemotronHMamba2Mixer on its torch path (mamba2_chunk_scan: the forward over a
sequence, what a prefill and a verify call of several tokens run), eval mode, per token (H heads of P, G groups
of state size N, each group serving H / G heads; C = H P + 2 G N channels):
    [z | xBC | dt] = in_proj(h)                   z [H P], xBC [C], dt [H]
    xBC = silu(causal depthwise conv1d(xBC))      (kernel K, bias; a state of the last K - 1 inputs)
    x, B, C = split(xBC)                          x [H, P], B / C [G, N]
    dt = clamp(softplus(dt + dt_bias), min=time_step_min);  A = -exp(A_log)          [H]
    S_t = exp(dt_t A) S_{t-1} + (dt_t x_t) B_t^T  S [H, P, N], float32
    y_t = S_t C_t + D x_t                         [H, P], float32
    out = out_proj(cast(weight * group_rms(y * silu(z))))  (RMS over groups of H P / G channels, float32)
transformers' one-token decode step (mamba2_selective_state_update) does not clamp dt; its forward does, and
a draft's verify runs the forward: here every call clamps (the same unless softplus falls under
time_step_min, 0.001 in the configs).

A call's n tokens run at once from each row's state (block): with a_t = dt_t A and their running sum G_t
over the call, x~_j = dt_j x_j,
    y_t = e^(G_t) S_0 C_t + sum_(j <= t) e^(G_t - G_j) (C_t . B_j) x~_j + D x_t
    S_t = e^(G_t) S_0 + sum_(j <= t) e^(G_t - G_j) x~_j B_j^T
(mamba2_chunk_scan's within-chunk form, SSD), every snapshot S_t from one einsum; a prefill runs it in chunks
of PREFILL_CHUNK from zero states (runners/chunked_prefill.py: q = C, k = B, v = x~ over the state's [N, P] view),
the state carried (only the last one kept); on the Triton path a score call's scan is one launch instead
(kernels/recurrent: the [P, N] state tile in registers, token by token, every snapshot stored from it), and so is a
prefill's carry across its chunks (kernels/chunk_scan). Padded positions (a row's first columns) neither decay nor update
the state. Not timed on a GPU.
"""
import torch
import torch.nn.functional as F

from ._linear import linear
from .chunked_prefill import scalar_decay_prefill
from .paged_recurrent import prefill_conv

# tokens a chunk of the prefill's scan (the math is exact at any size; transformers' chunk_size is 128): 64, as the other
# recurrent prefills, because the Triton carry's chunks of 128 need 147 KB of shared memory (sm_90a, Dk = 128), over
# the 99 KB of an RTX 30xx / 40xx; chunks of 64, 61 KB (tests/kernels/aot_compile_layer_ops.compile_chunk_scan)
PREFILL_CHUNK = 64


class Mamba2:
    """A Mamba2 mixer's tensors (references) and sizes: in_proj / out_proj (weight, bias), the convolution [C, K]
    and its bias, dt_bias / A_log / D [H], the gated norm's weight [H P] and eps (or None), time_step_min; and
    Falcon-H1's variations: its input scale (ssm_in_multiplier), its per-channel scale of the projection
    (mup_vector, float32: the projection is float32 after it), its norm optional or before the gate (norm_kind:
    "gate_norm" silu(z) then the group norm, Nemotron-H's / Granite's; "norm_gate" the norm then silu(z); "gate"
    silu(z) alone)."""

    def __init__(self, mixer):
        self.in_proj, self.out = (mixer.in_proj.weight, mixer.in_proj.bias), (mixer.out_proj.weight, mixer.out_proj.bias)
        self.conv, self.conv_bias = mixer.conv1d.weight[:, 0], mixer.conv1d.bias
        self.dt_bias, self.a_log, self.d = mixer.dt_bias, mixer.A_log, mixer.D
        norm = mixer.norm
        self.norm = None if isinstance(norm, torch.nn.Identity) else (norm.weight, norm.variance_epsilon)
        self.norm_kind = "gate" if self.norm is None else "norm_gate" if getattr(norm, "norm_before_gate", False) \
            else "gate_norm"
        self.in_scale = float(getattr(mixer, "ssm_in_multiplier", 1.0))
        mup = getattr(mixer, "mup_vector", None)
        self.mup = None if mup is None else mup.reshape(-1)
        self.heads, self.head_dim, self.groups, self.state = (mixer.num_heads, mixer.head_dim, mixer.n_groups,
                                                              mixer.ssm_state_size)
        self.channels, self.kernel = self.conv.shape
        self.dt_min = float(mixer.time_step_limit[0])
        # A tensor-parallel rank whose one group's channels other ranks share (runners/paged_nemotron_h_tp.py): the
        # gated norm's sum of squares [T, 1, 1] summed over those ranks (None: the group is this rank's alone), and
        # the group's whole width
        self.group_sum, self.group_width = None, None

    @property
    def shapes(self) -> tuple:
        """(conv state (C, K - 1), recurrent state (H, P, N)): PagedRecurrentRunner's recurrent_shapes entry."""
        return (self.channels, self.kernel - 1), (self.heads, self.head_dim, self.state)

    def project(self, h: torch.Tensor) -> tuple:
        """h [T, H] -> z [T, H P], xBC [T, C], dt [T, H] (raw; float32 after Falcon-H1's mup_vector)."""
        inner = self.heads * self.head_dim
        projected = linear(h if self.in_scale == 1.0 else h * self.in_scale, *self.in_proj)
        if self.mup is not None:
            projected = projected * self.mup
        return torch.split(projected, [inner, self.channels, self.heads], dim=-1)

    def ssm_inputs(self, xbc: torch.Tensor, dt: torch.Tensor, real: torch.Tensor, per_head: bool = True) -> tuple:
        """The convolution's output xBC [B, n, C] (after silu, model dtype) and raw dt [B, n, H] of a call's rows
        -> float32 x [B, n, H, P], x~ = dt x, B / C per head [B, n, H, N] (per group [B, n, G, N] unless per_head),
        a = dt A [B, n, H] (0 at padding: no decay; x~ 0 there too: no update)."""
        batch, n = real.shape
        inner, width = self.heads * self.head_dim, self.groups * self.state
        x, b, c = torch.split(xbc, [inner, width, width], dim=-1)
        x = x.float().reshape(batch, n, self.heads, self.head_dim)
        per = self.heads // self.groups if per_head else 1
        b, c = (t.float().reshape(batch, n, self.groups, self.state) for t in (b, c))
        if per > 1:  # (the Triton path reads each head's group in its kernel: no copy there)
            b, c = b.repeat_interleave(per, dim=2), c.repeat_interleave(per, dim=2)
        dt = F.softplus(dt + self.dt_bias.to(dt.dtype)).clamp(min=self.dt_min).float() * real[..., None]
        a = -self.a_log.float().exp() * dt  # [B, n, H]
        return x, x * dt[..., None], b, c, a

    def scan(self, x, xt, b, c, a, s0: torch.Tensor) -> tuple:
        """A score call's block form (module docstring) of n tokens from states s0 [B, H, P, N] -> (y [B, n, H, P]
        float32 (D x included), every state S_t [B, n, H, P, N]). (A prefill's chunks: runners/chunked_prefill.py.)"""
        n = x.shape[1]
        cum = a.transpose(1, 2).cumsum(-1)  # [B, H, n]
        lower = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        gap = torch.where(lower, cum[..., :, None] - cum[..., None, :], float("-inf")).exp()  # [B, H, t, j]
        bh, ch, xh = (t.transpose(1, 2) for t in (b, c, xt))  # [B, H, n, N|P]
        scores = gap * (ch @ bh.transpose(-1, -2))  # [B, H, t, j]
        lead = cum.exp()[..., None]  # [B, H, n, 1]
        y = lead * (ch @ s0.transpose(-1, -2)) + scores @ xh  # [B, H, n, P]
        y = y.transpose(1, 2) + self.d.float()[:, None] * x
        states = lead[..., None] * s0[:, :, None] + torch.einsum("bhtj,bhjp,bhjn->bhtpn", gap, xh, bh)
        return y, states.transpose(1, 2)

    def output(self, y: torch.Tensor, z: torch.Tensor, dtype) -> torch.Tensor:
        """y [T, H P] float32, z [T, H P] -> out_proj of the gate and group norm (norm_kind: NemotronHRMSNormGated,
        FalconH1RMSNormGated either way, or Falcon-H1's silu(z) alone)."""
        if self.norm_kind == "gate":
            return linear((y * F.silu(z)).to(dtype), *self.out)
        weight, eps = self.norm
        gated = y * F.silu(z.float()) if self.norm_kind == "gate_norm" else y
        groups = gated.view(*gated.shape[:-1], self.groups, -1)
        if self.group_sum is None:
            square = groups.pow(2).mean(-1, keepdim=True)
        else:  # the group's channels over several ranks: its mean square from every rank's sum
            square = self.group_sum(groups.pow(2).sum(-1, keepdim=True)) / self.group_width
        normed = (weight * (groups * torch.rsqrt(square + eps)).view_as(gated))
        if self.norm_kind == "norm_gate":
            normed = normed * F.silu(z.float())
        return linear(normed.to(dtype), *self.out)


def mamba2_forward(net: Mamba2, st, h: torch.Tensor, rows: tuple, prefilling: bool) -> torch.Tensor:
    """One Mamba2 layer over a call's tokens h [T, H] (rows: PagedRecurrentRunner._row_layout's) -> its output
    [T, H]: a prefill in chunks from zero states (the last ones committed); a score call from each row's state
    (committed, or the last snapshot), a snapshot written after each token."""
    index, real, slot, start, _ = rows
    batch, n = index.shape
    total = h.shape[0]
    z, xbc, dt = net.project(h)
    by_row, dt = (torch.cat((t, torch.zeros_like(t[:1])))[index] for t in (xbc, dt))  # [B, n, ...], padding zeros
    if prefilling:
        y, last = prefill_conv(by_row.transpose(1, 2), net.conv, net.conv_bias, net.kernel)
        st.conv[:batch].copy_(last)
        x, xt, b, c, a = net.ssm_inputs(F.silu(y).to(xbc.dtype).transpose(1, 2), dt, real)
        # q = C, k = B, v = x~ over the state's [N, P] view (stored [P, N]), a log-decay dt A a head and token
        state = st.rec[:batch].zero_()
        o = scalar_decay_prefill(st.chunk_scan, *(t.transpose(1, 2) for t in (c, b, xt, a)), state.transpose(-1, -2),
                                 PREFILL_CHUNK)
        y = o.transpose(1, 2) + net.d.float()[:, None] * x
    else:  # a score call: the convolution's windows from each row's (RecurrentStates.conv_steps), then the scan
        y = st.conv_steps(by_row, net.conv, net.conv_bias, rows, silu=True)  # [B, n, C]
        if st.by_steps(rows):  # the Triton path (one launch: the scan, every snapshot; q = C, k = B), or a token tree
            x, xt, b, c, a = net.ssm_inputs(y, dt, real, per_head=False)
            y = st.steps(c, b, xt, a, rows, layout="vk") + net.d.float()[:, None] * x
        else:
            x, xt, b, c, a = net.ssm_inputs(y, dt, real)
            y, states = net.scan(x, xt, b, c, a, st.start_rec(batch, start))
            st.rec_tent[torch.arange(batch, device=h.device)[:, None], slot] = states  # padding to the spare slot
    packed = torch.zeros(total + 1, net.heads * net.head_dim, dtype=torch.float32, device=h.device)
    packed.index_copy_(0, index.reshape(-1), y.reshape(batch * n, -1))
    return net.output(packed[:total], z, h.dtype)
