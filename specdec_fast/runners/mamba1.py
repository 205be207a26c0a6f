"""A Mamba (Mamba1) mixer on the paged runners (pure Mamba LMs and Falcon-Mamba: runners/paged_mamba_lm.py; Jamba:
runners/paged_jamba.py), its state rolled back by runners/paged_recurrent.py.

The math is transformers 5.24's MambaMixer / FalconMambaMixer / JambaMambaMixer on their torch path
(mamba_selective_scan, the forward over a sequence: what a prefill and a verify call of several tokens run), eval
mode, per token (C channels of intermediate_size, state N, time-step rank R):
    [x | z] = in_proj(h)                          x, z [C]
    x = silu(causal depthwise conv1d(x))          (kernel K, bias; a state of the last K - 1 inputs)
    dt, B, C' = split(x_proj(x))                  [R], [N], [N]; Falcon-Mamba: each RMS-normed (weightless);
                                                  Jamba: each by its RMSNorm (dt_layernorm / b_ / c_layernorm)
    dt = softplus(dt_proj.weight @ dt + dt_proj.bias)                                   [C]
    S_t = exp(dt A) * S_{t-1} + (dt x) B^T        S [C, N] float32, A = -exp(A_log) [C, N]
    y = S_t C' + D x;  out = out_proj(y * silu(z))
Every call runs the tokens one by one from each row's state (transformers' scan loop; a score call's K + 1
tokens write a snapshot after each, a prefill keeps the last state only). On the Triton path a call's scan is one
launch, a score call's and a prefill's (_fused_scan: kernels/recurrent, the [C, N] state one head decayed by A dt,
y = S C' in float32; a prefill's tokens keep no snapshot but the last, which is committed); on the CPU backends a
long prompt's prefill is a loop of its length in torch ops. Not timed on a GPU. Padded positions (a row's first
columns) neither decay nor update the state.
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rms_norm_reference
from ._linear import linear
from .paged_recurrent import prefill_conv


# Tokens whose scan inputs (the decay and the update, [B, chunk, C, N] float32 each) exist at once: a 2k-token
# prompt's would take 2 x 1.07 GB a row at Falcon-Mamba-7B's 8192 channels x 16 otherwise
SCAN_CHUNK = 256


class Mamba1:
    """A Mamba1 mixer's tensors (references) and sizes: in_proj / x_proj / out_proj (weight, bias), the convolution
    [C, K] and its bias, dt_proj's weight [C, R] and bias [C], A_log [C, N], D [C]; the norms of dt, B and C: None
    (Mamba's), Falcon-Mamba's weightless ones (their eps: rms_eps) or Jamba's ((weight, eps) each: norms)."""

    # x_proj's products summed over the ranks that hold the other channels (a tensor-parallel rank's; else as is)
    reduce = staticmethod(lambda t: t)

    def __init__(self, mixer):
        self.in_proj, self.x_proj, self.out = ((m.weight, m.bias) for m in (mixer.in_proj, mixer.x_proj, mixer.out_proj))
        self.conv, self.conv_bias = mixer.conv1d.weight[:, 0], mixer.conv1d.bias
        self.dt_weight, self.dt_bias = mixer.dt_proj.weight, mixer.dt_proj.bias
        self.a_log, self.d = mixer.A_log, mixer.D
        self.rank, self.state = mixer.time_step_rank, mixer.ssm_state_size
        self.channels, self.kernel = self.conv.shape
        self.rms_eps = getattr(mixer, "rms_eps", None)  # FalconMambaMixer's mixer_rms_eps
        norms = [getattr(mixer, f"{name}_layernorm", None) for name in ("dt", "b", "c")]
        self.norms = None if self.rms_eps is not None or norms[0] is None else tuple(
            (norm.weight, norm.variance_epsilon) for norm in norms)  # JambaMambaMixer's: Llama's RMSNorm

    @property
    def shapes(self) -> tuple:
        """(conv state (C, K - 1), recurrent state (C, N)): PagedRecurrentRunner's recurrent_shapes entry."""
        return (self.channels, self.kernel - 1), (self.channels, self.state)

    def _weightless(self, t: torch.Tensor) -> torch.Tensor:
        """FalconMambaWeightlessRMSNorm over the last dim (float32, then t's dtype)."""
        t32 = t.float()
        return (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + self.rms_eps)).type_as(t)

    def time_step(self, x: torch.Tensor, real: torch.Tensor) -> tuple:
        """The convolution's output x [B, n, C] (after silu, model dtype) of a call's rows -> dt [B, n, C] (model
        dtype, 0 at padding), B and C' [B, n, N] (model dtype)."""
        dt, b, c = torch.split(self.reduce(linear(x, *self.x_proj)), [self.rank, self.state, self.state], dim=-1)
        if self.rms_eps is not None:
            dt, b, c = self._weightless(dt), self._weightless(b), self._weightless(c)
        elif self.norms is not None:  # Jamba's: x_normed in the input dtype, times the weight
            dt, b, c = (rms_norm_reference(t, *norm) for t, norm in zip((dt, b, c), self.norms))
        dt = dt @ self.dt_weight.t()  # MambaMixer: dt_proj.weight @ time_step (its bias added in the scan)
        return F.softplus(dt + self.dt_bias.to(dt.dtype)) * real[..., None], b, c

    def ssm_inputs(self, x: torch.Tensor, real: torch.Tensor) -> tuple:
        """The convolution's output x [B, n, C] (after silu, model dtype) of a call's rows -> the update
        (dt B^T) x [B, n, C, N] float32 (in mamba_selective_scan's order), C' [B, n, N] (model dtype), the decay
        exp(dt A) [B, n, C, N] (1 at padding: no decay; the update 0 there)."""
        dt, b, c = self.time_step(x, real)
        update = dt[..., None] * b.float()[..., None, :] * x.float()[..., None]
        return update, c, torch.exp(-self.a_log.float().exp() * dt[..., None])

    def output(self, y: torch.Tensor, x: torch.Tensor, z: torch.Tensor, dtype, index: torch.Tensor) -> torch.Tensor:
        """y [B, n, C] (S C'), x [B, n, C] the convolution's output (each row's tokens, padding first), z [T, C] (the
        call's packed tokens), index [B, n] (_row_layout's) -> out_proj((y + D x) * silu(z)) [T, H], D in float32
        (as transformers passes it)."""
        total, rows = z.shape[0], index.reshape(-1)
        packed = torch.zeros(total + 1, self.channels, dtype=y.dtype, device=y.device)
        packed.index_copy_(0, rows, y.reshape(rows.shape[0], -1))
        xs = torch.zeros(total + 1, self.channels, dtype=x.dtype, device=x.device)
        xs.index_copy_(0, rows, x.reshape(rows.shape[0], -1))
        return linear(((packed[:total] + xs[:total] * self.d.float()) * F.silu(z)).to(dtype), *self.out)


def mamba1_forward(net: Mamba1, st, h: torch.Tensor, rows: tuple, prefilling: bool) -> torch.Tensor:
    """One Mamba1 layer over a call's tokens h [T, H] (rows: PagedRecurrentRunner._row_layout's) -> its output
    [T, H]: token by token from zero states in a prefill (the last ones committed), from each row's state (committed,
    or the last snapshot) in a score call, a snapshot written after each token."""
    index, real, slot, start, _ = rows
    batch, n = index.shape
    x, z = linear(h, *net.in_proj).chunk(2, dim=-1)
    by_row = torch.cat((x, torch.zeros_like(x[:1])))[index]  # [B, n, C]: each row's tokens last, padding zeros
    ids = torch.arange(batch, device=h.device)
    if prefilling:
        y, last = prefill_conv(by_row.transpose(1, 2), net.conv, net.conv_bias, net.kernel)
        st.conv[:batch].copy_(last)
        xs = F.silu(y).to(x.dtype).transpose(1, 2)  # [B, n, C]
        if st.fused:  # the Triton path: the prompt's scan in one launch (kernels/recurrent), its last state kept
            st.rec[:batch].zero_()
            keep_last = torch.full_like(slot, -1)
            keep_last[:, -1] = 0  # (every row's last column is a real token: each row's padding comes first)
            out = _fused_scan(net, st, xs, rows._replace(slot=keep_last))
            st.rec[:batch].copy_(st.rec_tent[:batch, 0])
            return net.output(out, xs, z, h.dtype, index)
        state = torch.zeros(batch, *net.shapes[1], dtype=torch.float32, device=h.device)
    else:  # each row's windows (RecurrentStates.conv_steps), the scan from its state
        xs = st.conv_steps(by_row, net.conv, net.conv_bias, rows, silu=True).to(x.dtype)  # [B, n, C]
        if st.by_steps(rows):  # the Triton path (one launch: the scan, every snapshot), or a token tree
            return net.output(_fused_scan(net, st, xs, rows), xs, z, h.dtype, index)
        state = st.start_rec(batch, start)
    outs = []
    for begin in range(0, n, SCAN_CHUNK):  # the scan's inputs a chunk at a time: [B, chunk, C, N] each, not [B, n, C, N]
        update, c, decay = net.ssm_inputs(xs[:, begin:begin + SCAN_CHUNK], real[:, begin:begin + SCAN_CHUNK])
        for i in range(update.shape[1]):
            state = decay[:, i] * state + update[:, i]  # exp(dt A) * S + (dt B^T) x
            # S C' in the model dtype, as transformers' scan multiplies them
            outs.append((state.to(c.dtype) @ c[:, i, :, None])[..., 0])
            if not prefilling:  # the snapshot after this token (a padded step writes the spare slot)
                st.rec_tent[ids, slot[:, begin + i]] = state
    if prefilling:
        st.rec[:batch].copy_(state)
    return net.output(torch.stack(outs, dim=1), xs, z, h.dtype, index)


def _fused_scan(net: Mamba1, st, xs: torch.Tensor, rows: tuple) -> torch.Tensor:
    """A score call's scan through kernels/recurrent (RecurrentStates.steps): one head whose state [C, N] is [Dv, Dk]
    (layout "vk"), keys B and queries C' [N], values dt x [C], decayed by exp(A[c, k] dt_c) (decay_rates: A^T, the
    step dt a value column) -> y = S C' [B, n, C] float32 (transformers' slow path multiplies S C' in the model dtype:
    these differ by its rounding)."""
    dt, b, c = net.time_step(xs, rows.real)
    dt = dt.float()
    v = (dt * xs.float())[:, :, None]  # [B, n, 1, C]
    rates = -net.a_log.float().exp().t()[None]  # [1, N, C]
    return st.steps(c[:, :, None], b[:, :, None], v, dt[:, :, None], rows, layout="vk", decay_rates=rates)[:, :, 0]
