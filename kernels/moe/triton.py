"""Triton moe_pairs: one program per (pair, tile of BLOCK_N output rows) streams its expert's rows
of the weight once against the pair's token (a GEMV per pair: decode and verify steps route a few
tokens to top-k experts each). No host sync and static shapes: graph safe. The gated form reads
the gate rows and the up rows of the same outputs in one program and writes silu(gate) * up (the
SwiGLU of transformers' MoE experts), so the [P, 2I] product is never written.

Against the torch path it replaces (runners/_moe.py gathered: index_select copies the chosen
experts' weights, then batched products read the copy), a pair's weights are read once instead of
three times (read, written, read); pairs that chose the same expert each read it (L2 may serve the
repeats). Predicted, not measured: no GPU has run it.
"""
import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["N", "K"])
def _moe_pairs_kernel(x_ptr, e_ptr, w_ptr, s_ptr, out_ptr, N, K, s_xt, s_we, s_wn, s_ot,
                      PAIRS_PER_TOKEN: tl.constexpr, GATED: tl.constexpr, HAS_SCALE: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[p, n] (n < N: the output width, I when GATED) for pair p = program_id(0)."""
    p = tl.program_id(0)
    expert = tl.load(e_ptr + p).to(tl.int64)
    token = (p // PAIRS_PER_TOKEN).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = w_ptr + expert * s_we + n.to(tl.int64)[:, None] * s_wn  # [BLOCK_N, 1]: the (gate) rows
    acc = tl.zeros([BLOCK_N], tl.float32)
    up = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        xv = tl.load(x_ptr + token * s_xt + k, mask=k_ok, other=0.0).to(tl.float32)
        mask = n_ok[:, None] & k_ok[None, :]
        w = tl.load(rows + k[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(w * xv[None, :], 1)
        if GATED:  # the up row of output n sits N rows below its gate row
            wu = tl.load(rows + N * s_wn + k[None, :], mask=mask, other=0.0).to(tl.float32)
            up += tl.sum(wu * xv[None, :], 1)
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * up
    if HAS_SCALE:
        acc = acc * tl.load(s_ptr + p).to(tl.float32)
    tl.store(out_ptr + p.to(tl.int64) * s_ot + n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


BLOCK_N, BLOCK_K = 32, 128  # a pair's tile: 32 output rows (64 weight rows gated) x 128 of K a step


def moe_pairs_triton(x, experts, weight, pairs_per_token: int, scale=None, gated: bool = False) -> torch.Tensor:
    """Validated inputs (kernels/moe/__init__.py) -> out [P, N] (N = weight's rows, half when gated)."""
    pairs = experts.shape[0]
    width = weight.shape[1] // 2 if gated else weight.shape[1]
    out = torch.empty(pairs, width, dtype=x.dtype, device=x.device)
    if pairs == 0:
        return out
    _moe_pairs_kernel[(pairs, triton.cdiv(width, BLOCK_N))](
        x, experts, weight, experts if scale is None else scale, out, width, x.shape[1],
        x.stride(0), weight.stride(0), weight.stride(1), out.stride(0),
        PAIRS_PER_TOKEN=pairs_per_token, GATED=gated, HAS_SCALE=scale is not None, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        num_warps=4)
    return out
