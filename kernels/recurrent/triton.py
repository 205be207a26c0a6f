"""recurrent_steps in one Triton launch (the spec: reference.py).

One program per (row, value head, BLOCK_V columns of the state): it loads its [Dk, BLOCK_V] tile of the row's
starting state (the committed one or a snapshot: start), then runs the call's n tokens in order with the tile in
registers -- decay, the delta rule's correction (or the plain outer-product update), the output columns, and the
snapshot tile stored to the token's slot. q / k are read in the model dtype and normalised in the program (qk_norm),
so the caller's L2 norms, head repeats, masks and the state gathers are not separate launches either. A token tree
(parent given): each token starts from its parent's state -- the tile in registers where the parent is the token
before, else the snapshot the same program stored a few tokens before (a barrier after each store) -- or from the
row's start (kept in registers beside the state) where it has no parent in the call. Mamba1 (decay_rates): its [C, N]
state is one head whose tile decays by exp(A[c, k] dt_c), the rates tile read once.

What it replaces on CUDA (counted in the torch block forms of runners/paged_qwen3_next.py _score_block, kda.py's
steps, mamba2.py's scan and lightning.py's scan): ~20 launches a layer and call for the Gated DeltaNet's block
(two where-gathers of the state, masks, three matmuls, a triangular solve, the snapshots' einsum and scatter),
~9 a token for KDA's loop, ~12 for Mamba2's and ~15 for lightning's chunk. Bytes: the starting tile read once,
each snapshot tile written once (the torch forms write every snapshot through a [B, n, ...] temporary first).
Not timed on a GPU.

Sizes: BLOCK_K = next_pow2(Dk) (the whole key side in registers: <= 256 in every family here), BLOCK_V chosen so
the tile is at most TILE_ELEMENTS float32. A padded column loads k = 0, g = 0, beta = 0: the state passes through
unchanged (exactly: x exp(0) + 0), so no [Dk, BLOCK_V] select is kept live.
"""
import torch
import triton
import triton.language as tl

from .._launch import cdiv, next_pow2
from .reference import QK_NORM_EPS

# The state tile a program keeps in registers, 16 float32 a thread at 4 warps. Measured (ptxas -v, sm_90a, Dk = 128,
# bench/verify_stream_ptx.registers): a [128, 16] tile compiles to 96 registers (Gated DeltaNet, KDA) and 128
# (Mamba2's [P, N] layout), a [128, 32] one to 255 and 168 -- two blocks an SM at most; no spills either way. A
# token tree's form keeps the start tile too: 128 (reloading it from memory at each root instead: 220); Mamba1's
# [16, 128] tiles with their rates 120 (160 with parents). Smaller tiles take fewer warps (512 elements a warp).
TILE_ELEMENTS = 2048


@triton.jit
def _start_tile(committed_ptr, snap_ptr, start, b, h, sc_b, sc_h, sn_b, sn_s, sn_h, tile_c, tile_n, m2):
    """The program's [BLOCK_K, BLOCK_V] tile of the row's starting state: committed (start < 0) or snapshot start."""
    if start < 0:
        tile = tl.load(committed_ptr + b.to(tl.int64) * sc_b + h * sc_h + tile_c, mask=m2, other=0.0)
    else:
        tile = tl.load(snap_ptr + b.to(tl.int64) * sn_b + start * sn_s + h * sn_h + tile_n, mask=m2, other=0.0)
    return tile.to(tl.float32)


@triton.jit
def _recurrent_steps_kernel(q_ptr, k_ptr, v_ptr, g_ptr, rates_ptr, beta_ptr, real_ptr, start_ptr, slot_ptr, parent_ptr,
                            committed_ptr, snap_ptr, o_ptr, n, HV, RATIO, scale,
                            sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sg_b, sg_t, sg_h, sa_h, sa_k, sa_v,
                            sb_b, sb_t, sb_h, sr_b, sr_t, sl_b, sl_t, sp_b, sp_t, sc_b, sc_h, sc_k, sc_v,
                            sn_b, sn_s, sn_h, sn_k, sn_v, so_b, so_t, so_h,
                            DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                            G_MODE: tl.constexpr, DELTA: tl.constexpr, QK_NORM: tl.constexpr, EPS: tl.constexpr,
                            HAS_PARENT: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // HV
    h = pid % HV
    hk = h // RATIO
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mk = offs_k < DK
    mv = offs_v < DV
    m2 = mk[:, None] & mv[None, :]
    tile_c = offs_k[:, None] * sc_k + offs_v[None, :] * sc_v
    tile_n = offs_k[:, None] * sn_k + offs_v[None, :] * sn_v
    if G_MODE == 2:  # decay rates a key row and value column (Mamba1's A): read once, times each token's step
        rates = tl.load(rates_ptr + h * sa_h + offs_k[:, None] * sa_k + offs_v[None, :] * sa_v, mask=m2, other=0.0)
    start = tl.load(start_ptr + b)
    state = _start_tile(committed_ptr, snap_ptr, start, b, h, sc_b, sc_h, sn_b, sn_s, sn_h, tile_c, tile_n, m2)
    first = state
    for t in range(n):
        if HAS_PARENT:  # a token tree: continue from the parent's state (its snapshot, this program's own store)
            p = tl.load(parent_ptr + b * sp_b + t * sp_t)
            if p == t - 1:  # the token before: its state is the tile in registers
                state = state
            elif p < 0:  # a root of the call: the row's start
                state = first
            else:
                at_p = tl.load(slot_ptr + b * sl_b + p * sl_t)
                state = tl.load(snap_ptr + b.to(tl.int64) * sn_b + at_p * sn_s + h * sn_h + tile_n, mask=m2, other=0.0)
        on = tl.load(real_ptr + b * sr_b + t * sr_t) != 0
        # a padded column: k = 0, no decay, beta 0 -- the state passes unchanged (exactly), no [Dk, BLOCK_V] select
        kt = tl.load(k_ptr + b * sk_b + t * sk_t + hk * sk_h + offs_k, mask=mk & on, other=0.0).to(tl.float32)
        qt = tl.load(q_ptr + b * sq_b + t * sq_t + hk * sq_h + offs_k, mask=mk, other=0.0).to(tl.float32)
        if QK_NORM:
            kt = kt * tl.rsqrt(tl.sum(kt * kt, axis=0) + EPS)
            qt = qt * tl.rsqrt(tl.sum(qt * qt, axis=0) + EPS)
        qt = qt * scale
        vt = tl.load(v_ptr + b * sv_b + t * sv_t + h * sv_h + offs_v, mask=mv & on, other=0.0).to(tl.float32)
        if G_MODE == 1:  # a log-decay a key row
            gt = tl.load(g_ptr + b * sg_b + t * sg_t + h * sg_h + offs_k, mask=mk & on, other=0.0).to(tl.float32)
            state = state * tl.exp(gt)[:, None]
        elif G_MODE == 2:  # the rates times a step a value column
            gt = tl.load(g_ptr + b * sg_b + t * sg_t + h * sg_h + offs_v, mask=mv & on, other=0.0).to(tl.float32)
            state = state * tl.exp(rates * gt[None, :])
        else:  # one a head
            gt = tl.load(g_ptr + b * sg_b + t * sg_t + h * sg_h, mask=on, other=0.0).to(tl.float32)
            state = state * tl.exp(gt)
        if DELTA:
            beta = tl.load(beta_ptr + b * sb_b + t * sb_t + h * sb_h, mask=on, other=0.0).to(tl.float32)
            delta = (vt - tl.sum(state * kt[:, None], axis=0)) * beta
            state = state + kt[:, None] * delta[None, :]
        else:
            state = state + kt[:, None] * vt[None, :]
        out = tl.sum(state * qt[:, None], axis=0)
        tl.store(o_ptr + b * so_b + t * so_t + h * so_h + offs_v, out, mask=mv)
        at = tl.load(slot_ptr + b * sl_b + t * sl_t)  # -1: no snapshot (a prefill keeps its last token's only)
        tl.store(snap_ptr + b.to(tl.int64) * sn_b + at * sn_s + h * sn_h + tile_n, state, mask=m2 & (at >= 0))
        if HAS_PARENT:  # a child's load of this snapshot sees the whole tile, whichever threads hold it then
            tl.debug_barrier()


def recurrent_steps_triton(q, k, v, g, committed, snapshots, start, slot, real, beta, qk_norm, scale,
                           layout, parent=None, decay_rates=None) -> torch.Tensor:
    """recurrent_steps (validated by __init__.py) -> o [B, n, Hv, Dv] float32."""
    batch, n, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    o = torch.empty(batch, n, hv, dv, dtype=torch.float32, device=q.device)
    if batch == 0 or n == 0:
        return o
    block_k = next_pow2(dk)
    block_v = min(next_pow2(dv), max(1, TILE_ELEMENTS // block_k))
    real = real.view(torch.uint8) if real.dtype == torch.bool else real
    g_mode = 2 if decay_rates is not None else 1 if g.dim() == 4 else 0
    rates = decay_rates if decay_rates is not None else committed  # (an unread pointer where there are none)
    # the state's strides over (key, value): the stored layout's last two dims in that order
    ck, cv = (committed.stride(2), committed.stride(3)) if layout == "kv" else (committed.stride(3), committed.stride(2))
    nk, nv = (snapshots.stride(3), snapshots.stride(4)) if layout == "kv" else (snapshots.stride(4), snapshots.stride(3))
    beta_arg = beta if beta is not None else g
    _recurrent_steps_kernel[(batch * hv, cdiv(dv, block_v))](
        q, k, v, g, rates, beta_arg, real, start, slot, slot if parent is None else parent, committed, snapshots, o, n, hv,
        hv // hk, float(scale),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), g.stride(2),
        *((decay_rates.stride(0), decay_rates.stride(1), decay_rates.stride(2)) if decay_rates is not None else (0, 0, 0)),
        beta_arg.stride(0), beta_arg.stride(1), beta_arg.stride(2), real.stride(0), real.stride(1), slot.stride(0),
        slot.stride(1), *(slot if parent is None else parent).stride(),
        committed.stride(0), committed.stride(1), ck, cv,
        snapshots.stride(0), snapshots.stride(1), snapshots.stride(2), nk, nv,
        o.stride(0), o.stride(1), o.stride(2),
        DK=dk, DV=dv, BLOCK_K=block_k, BLOCK_V=block_v, G_MODE=g_mode, DELTA=beta is not None,
        QK_NORM=bool(qk_norm), EPS=QK_NORM_EPS, HAS_PARENT=parent is not None, num_warps=max(1, min(4, block_k * block_v // 512)))
    return o
