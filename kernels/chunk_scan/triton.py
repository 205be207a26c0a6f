"""chunk_scan in one Triton launch (the spec: reference.py).

One program per (row, head, BLOCK_V state columns): it loads its [Dk, BLOCK_V] tile of the starting state, walks the
C chunks in order with the tile in registers -- the delta rule's F = u - w S, the outputs qd S + a F, the state's
decay and its kd^T F update, three or four tl.dot products a chunk over [L, Dk] / [L, L] operands -- and stores the
last state over the first. The dots run on tensor cores in tf32 (precision "tf32": 10-bit mantissas, finer than the
bf16 / fp16 models' own rounding, and than FLA's chunked kernels, which multiply in the model dtype) or in three tf32
products a dot ("tf32x3": float32's precision, for float32 models; RecurrentStates.chunk_scan picks by the model dtype).
Operands are read through block pointers (with [L, Dk] tensors of addresses and masks the tf32x3 form spilled 796 bytes
a thread, 676 this way: ptxas -v, sm_90a, BLOCK_V 32).

What it replaces on CUDA: the chunk loop of runners/paged_qwen3_next.py's prefill (~10 launches a chunk), of Mamba2's
(mamba2.py scan: ~12) and lightning's (~10): a 4096-token prompt in chunks of 64 made ~640 launches a Gated DeltaNet
layer there; here one. Bytes: each chunk's qd / kd / w [L, Dk] and a [L, L] are read once per BLOCK_V program
(Dv / BLOCK_V times a head), u read and o written once. Not timed on a GPU.
"""
import torch
import triton
import triton.language as tl

from .._launch import cdiv, next_pow2

# State columns a program: tl.dot's least N. Measured (ptxas -v, sm_90a, fp32 operands, Dk = 128, one stage;
# tests/kernels/aot_compile_layer_ops.compile_chunk_scan): "tf32" dots at BLOCK_V 16 take 177-216 registers with chunks
# of 64 at 4 warps and 171 with chunks of 128 at 8, no spills; at BLOCK_V 32, or with "tf32x3"'s three products a dot,
# 255 and 80-2000 spilled bytes. ("ieee" lowers to FMAs whose operands sit whole in registers: 18 KB of spills.)
BLOCK_V = 16


@triton.jit
def _chunk_scan_kernel(qd_ptr, kd_ptr, a_ptr, u_ptr, w_ptr, decay_ptr, state_ptr, o_ptr, C, H,
                       ss_b, ss_h, ss_k, ss_v,
                       DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr, BLOCK_L: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DELTA: tl.constexpr, ROW_DECAY: tl.constexpr,
                       PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    v0 = tl.program_id(1) * BLOCK_V
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = v0 + tl.arange(0, BLOCK_V)
    mk = offs_k < DK
    m_state = mk[:, None] & (offs_v < DV)[None, :]
    state_at = state_ptr + b.to(tl.int64) * ss_b + h * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v
    s = tl.load(state_at, mask=m_state, other=0.0).to(tl.float32)
    first = pid.to(tl.int64) * C  # this (row, head)'s first chunk: the operands are [B, H, C, ...] contiguous
    for c in range(C):
        chunk = first + c
        # block pointers, not [L, Dk] tensors of addresses and masks (fewer registers live through the loop: above)
        fresh = tl.load(tl.make_block_ptr(u_ptr + chunk * (L * DV), (L, DV), (DV, 1), (0, v0), (BLOCK_L, BLOCK_V), (1, 0)),
                        boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        if DELTA:  # the chunk's updates after the carried state's share
            w = tl.load(tl.make_block_ptr(w_ptr + chunk * (L * DK), (L, DK), (DK, 1), (0, 0), (BLOCK_L, BLOCK_K), (1, 0)),
                        boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            fresh = fresh - tl.dot(w, s, input_precision=PRECISION)
        q = tl.load(tl.make_block_ptr(qd_ptr + chunk * (L * DK), (L, DK), (DK, 1), (0, 0), (BLOCK_L, BLOCK_K), (1, 0)),
                    boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        a = tl.load(tl.make_block_ptr(a_ptr + chunk * (L * L), (L, L), (L, 1), (0, 0), (BLOCK_L, BLOCK_L), (1, 0)),
                    boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        out = tl.dot(q, s, input_precision=PRECISION) + tl.dot(a, fresh, input_precision=PRECISION)
        tl.store(tl.make_block_ptr(o_ptr + chunk * (L * DV), (L, DV), (DV, 1), (0, v0), (BLOCK_L, BLOCK_V), (1, 0)),
                 out, boundary_check=(0, 1))
        # kd^T [Dk, L]: the chunk's [L, Dk] read column-major
        kt = tl.load(tl.make_block_ptr(kd_ptr + chunk * (L * DK), (DK, L), (1, DK), (0, 0), (BLOCK_K, BLOCK_L), (0, 1)),
                     boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        if ROW_DECAY:  # a factor a key row (padded rows: 1, their state stays 0)
            d = tl.load(decay_ptr + chunk * DK + offs_k, mask=mk, other=1.0).to(tl.float32)
            s = s * d[:, None]
        else:
            s = s * tl.load(decay_ptr + chunk).to(tl.float32)
        s = s + tl.dot(kt, fresh, input_precision=PRECISION)
    tl.store(state_at, s, mask=m_state)


def chunk_scan_triton(qd, kd, a, u, decay, state, w=None, precision: str = "tf32x3") -> torch.Tensor:
    """chunk_scan (validated by __init__.py) -> o [B, H, C, L, Dv] float32; state written in place."""
    batch, heads, chunks, size, dk = qd.shape
    dv = u.shape[-1]
    o = torch.empty(batch, heads, chunks, size, dv, dtype=torch.float32, device=u.device)
    if o.numel() == 0:
        return o
    qd, kd, a, u, decay = (t.contiguous() for t in (qd, kd, a, u, decay))
    w = w.contiguous() if w is not None else qd
    block_k = max(16, next_pow2(dk))
    block_v = min(BLOCK_V, max(16, next_pow2(dv)))
    block_l = max(16, next_pow2(size))  # tl.dot's least M and K; a chunk of fewer tokens is masked
    _chunk_scan_kernel[(batch * heads, cdiv(dv, block_v))](
        qd, kd, a, u, w, decay, state, o, chunks, heads, *state.stride(),
        DK=dk, DV=dv, L=size, BLOCK_L=block_l, BLOCK_K=block_k, BLOCK_V=block_v, DELTA=w is not qd,
        ROW_DECAY=decay.dim() == 4, PRECISION=precision,
        num_warps=4 if block_l * block_k <= 8192 else 8, num_stages=1)  # (3 stages: 262 KB of shared memory)
    return o
