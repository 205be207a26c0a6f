"""Triton moe_pairs, the "pair" schedule: one program per (pair, tile of BLOCK_N outputs) streams
its expert's rows of the weight once against the pair's token (a GEMV per pair: decode and verify
steps route a few tokens to top-k experts each). No host sync and static shapes: graph safe. A
gated activation reads the gate rows and the up rows of its outputs in one program and writes the
activation, so the [P, 2I] product is never written. Also the pieces both schedules share:
`_tile_rows` (which weight rows a tile of outputs reads), `_load` and `_finish` (bias,
activation, scale).

Row tiles, by activation: none, BLOCK_N rows; SwiGLU (gate rows, then up rows), the BLOCK_N gate
rows and the BLOCK_N up rows N below them, two accumulators; GPT-OSS (gate / up interleaved),
the 2 BLOCK_N consecutive rows as one tile, split into gate and up only at the end: read as two
stride-2 tiles, no load could be wider than 2 bytes (seen in the sm_90a PTX).

Against the torch path it replaces (runners/_moe.py gathered: index_select copies the chosen
experts' weights, then batched products read the copy), a pair's weights are read once instead of
three times (read, written, read); pairs that chose the same expert each read it (L2 may serve the
repeats; the "expert" schedule, triton_grouped.py, reads it once). Predicted, not measured: no GPU
has run it.
"""
import torch
import triton
import triton.language as tl

from .reference import ACT_CODES, GATED


@triton.jit
def _tile_rows(tile, N, BLOCK_N: tl.constexpr, TILE_ROWS: tl.constexpr):
    """Output tile `tile` (outputs tile * BLOCK_N ...) -> (its first accumulator's weight rows,
    which of them exist). TILE_ROWS (tile_rows()): BLOCK_N rows (no activation, and SwiGLU's
    gate rows: its up rows lie N below), or GPT-OSS's 2 BLOCK_N interleaved gate / up rows."""
    rows = tile * TILE_ROWS + tl.arange(0, TILE_ROWS)
    return rows, rows < N * (TILE_ROWS // BLOCK_N)


@triton.jit
def _load(ptrs, mask_a, mask_b, EVEN_A: tl.constexpr, EVEN_B: tl.constexpr):
    """A tile's load, masked only along the axes that are not whole tiles (EVEN_*): a mask along
    the contiguous axis of unknown size splits its 16-byte loads into 2-byte ones (seen in the
    sm_90a PTX of both schedules)."""
    if EVEN_A and EVEN_B:
        return tl.load(ptrs)
    if EVEN_A:
        return tl.load(ptrs, mask=mask_b, other=0.0)
    if EVEN_B:
        return tl.load(ptrs, mask=mask_a, other=0.0)
    return tl.load(ptrs, mask=mask_a & mask_b, other=0.0)


@triton.jit
def _finish(acc, up, b_ptr, rows, rows_ok, N, s_ptr, pairs, pairs_ok, alpha, limit,
            ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Float32 products [M, R] (acc: the rows of _tile_rows; up: SwiGLU's up rows; rows / rows_ok
    [1, R]) -> [M, BLOCK_N]: the bias (b_ptr: the expert's row), the activation, times the pairs'
    scale (pairs / pairs_ok [M, 1])."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=rows_ok, other=0.0).to(tl.float32)
        if ACT == 1:
            up += tl.load(b_ptr + N + rows, mask=rows_ok, other=0.0).to(tl.float32)
    if ACT == 1:
        acc = acc / (1.0 + tl.exp(-acc)) * up
    if ACT == 2:
        gate, up = tl.split(tl.reshape(acc, [acc.shape[0], BLOCK_N, 2]))
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        acc = (up + 1.0) * (gate / (1.0 + tl.exp(-alpha * gate)))
    if ACT == 3:  # relu2 (ungated)
        acc = tl.maximum(acc, 0.0)
        acc = acc * acc
    if HAS_SCALE:
        acc = acc * tl.load(s_ptr + pairs, mask=pairs_ok, other=0.0).to(tl.float32)
    return acc


@triton.jit(do_not_specialize=["N", "K"])
def _moe_pairs_kernel(x_ptr, e_ptr, w_ptr, b_ptr, s_ptr, out_ptr, N, K, s_xt, s_we, s_wn, s_wk, s_be, s_ot,
                      alpha, limit,
                      PAIRS_PER_TOKEN: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      HAS_SCALE: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TILE_ROWS: tl.constexpr):
    """out[p, n] (n < N: the output width, I when gated) for pair p = program_id(0)."""
    p = tl.program_id(0)
    expert = tl.load(e_ptr + p).to(tl.int64)
    token = (p // PAIRS_PER_TOKEN).to(tl.int64)
    rows, rows_ok = _tile_rows(tl.program_id(1), N, BLOCK_N, TILE_ROWS)
    at = w_ptr + expert * s_we + rows.to(tl.int64)[:, None] * s_wn  # [R, 1]
    acc = tl.zeros([rows.shape[0]], tl.float32)
    up = tl.zeros([rows.shape[0]], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        xv = _load(x_ptr + token * s_xt + k, k_ok, k_ok, EVEN_K, True).to(tl.float32)
        cols = k.to(tl.int64)[None, :] * s_wk
        acc += tl.sum(_load(at + cols, rows_ok[:, None], k_ok[None, :], EVEN_N, EVEN_K).to(tl.float32) * xv[None, :], 1)
        if ACT == 1:
            w_up = _load(at + N * s_wn + cols, rows_ok[:, None], k_ok[None, :], EVEN_N, EVEN_K)
            up += tl.sum(w_up.to(tl.float32) * xv[None, :], 1)
    out = _finish(acc[None, :], up[None, :], b_ptr + expert * s_be, rows[None, :], rows_ok[None, :], N, s_ptr,
                  p, True, alpha, limit, ACT, HAS_BIAS, HAS_SCALE, BLOCK_N)  # [1, BLOCK_N]
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + p.to(tl.int64) * s_ot + n[None, :], out.to(out_ptr.dtype.element_ty), mask=(n < N)[None, :])


BLOCK_N, BLOCK_K = 32, 128  # a pair's tile: 32 outputs (64 weight rows gated) x 128 of K a step


def tile_rows(act, block_n: int) -> int:
    """Weight rows in a tile's first accumulator (_tile_rows): 2 BLOCK_N for GPT-OSS's interleaved rows."""
    return 2 * block_n if act == "gpt_oss" else block_n


def output_width(weight, act) -> int:
    """The outputs per pair: the weight's rows, half of them under a gated activation."""
    return weight.shape[1] // 2 if act in GATED else weight.shape[1]


def bias_args(bias, placeholder) -> tuple:
    """(the bias pointer, its expert stride); a placeholder pointer without bias. The kernels read
    the bias at [expert * s_be + row]: a unit stride along the rows is made here."""
    if bias is None:
        return placeholder, 0
    bias = bias if bias.stride(1) == 1 else bias.contiguous()
    return bias, bias.stride(0)


def moe_pairs_triton(x, experts, weight, pairs_per_token: int, scale=None, act=None, bias=None,
                     alpha: float = 1.0, limit: float = float("inf")) -> torch.Tensor:
    """Validated inputs (kernels/moe/__init__.py) -> out [P, N] (N = output_width)."""
    pairs = experts.shape[0]
    width = output_width(weight, act)
    out = torch.empty(pairs, width, dtype=x.dtype, device=x.device)
    if pairs == 0 or width == 0:
        return out
    b, s_be = bias_args(bias, experts)
    _moe_pairs_kernel[(pairs, triton.cdiv(width, BLOCK_N))](
        x, experts, weight, b, experts if scale is None else scale, out, width, x.shape[1],
        x.stride(0), weight.stride(0), weight.stride(1), weight.stride(2), s_be, out.stride(0),
        float(alpha), float(min(limit, 3e38)),
        PAIRS_PER_TOKEN=pairs_per_token, ACT=ACT_CODES[act], HAS_BIAS=bias is not None,
        HAS_SCALE=scale is not None, EVEN_N=width % BLOCK_N == 0, EVEN_K=x.shape[1] % BLOCK_K == 0,
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, TILE_ROWS=tile_rows(act, BLOCK_N), num_warps=4)
    return out
