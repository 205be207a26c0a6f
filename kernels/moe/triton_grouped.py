"""Triton moe_pairs, the "expert" schedule: the pairs sorted by expert (kernels/moe group_pairs),
one program per (expert, tile of BLOCK_N outputs) that walks the pairs its expert was chosen by,
BLOCK_M at a time, each against its expert's weight tile: tl.dot on [BLOCK_M, BLOCK_K] x
[BLOCK_K, BLOCK_N]. For wide verify batches and prefills, where many pairs share experts.

Why: the runner's alternatives for many pairs were every expert over every token (E / k times the
FLOPs and, as a Python loop, 3 E launches a layer: 384 at Qwen3-30B-A3B's 128 experts) or the
chosen experts only (a host sync per expert). Here a layer's experts are two launches plus the
sort's four (argsort, gather, arange, searchsorted), each chosen expert's weights are streamed
once per BLOCK_M of its pairs (once for decode-sized batches), and an expert no pair chose costs
its programs one load of two offsets.
Grids depend on shapes only: no host sync, graph safe. Load balance follows the routing: an
expert that many pairs chose keeps its programs longer. Predicted, not measured (no GPU has run
it): a verify step of B 8 x (K + 1) 5 = 40 tokens, top 8 of 128 experts (320 pairs over ~118
distinct experts) reads ~118 / 128 of the experts' weights where every-expert read all of them,
in 2 launches instead of 384.
"""
import torch
import triton
import triton.language as tl

from .triton import ACT_CODES, _finish, _load, _tile_rows, bias_args, output_width, tile_rows


@triton.jit
def _dot(a, b, acc, DOT_F32: tl.constexpr):
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit(do_not_specialize=["N", "K"])
def _moe_grouped_kernel(x_ptr, order_ptr, offsets_ptr, w_ptr, b_ptr, s_ptr, out_ptr, N, K,
                        s_xt, s_we, s_wn, s_wk, s_be, s_ot, alpha, limit,
                        PAIRS_PER_TOKEN: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_SCALE: tl.constexpr, DOT_F32: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        TILE_ROWS: tl.constexpr):
    """out[order[offsets[e]:offsets[e + 1]], n] for expert e = program_id(0), n in tile program_id(1)."""
    e = tl.program_id(0)
    start = tl.load(offsets_ptr + e)
    end = tl.load(offsets_ptr + e + 1)
    rows, rows_ok = _tile_rows(tl.program_id(1), N, BLOCK_N, TILE_ROWS)
    at = w_ptr + e.to(tl.int64) * s_we + rows.to(tl.int64)[None, :] * s_wn  # [1, R]
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    for m0 in range(start, end, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        m_ok = m < end
        pairs = tl.load(order_ptr + m, mask=m_ok, other=0)  # [BLOCK_M] pair ids
        x_at = x_ptr + (pairs // PAIRS_PER_TOKEN)[:, None] * s_xt  # [BLOCK_M, 1]: each pair's token
        acc = tl.zeros([BLOCK_M, rows.shape[0]], tl.float32)
        up = tl.zeros([BLOCK_M, rows.shape[0]], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < K
            xt = _load(x_at + k[None, :], m_ok[:, None], k_ok[None, :], False, EVEN_K)  # [BLOCK_M, BLOCK_K]
            w_at = at + k.to(tl.int64)[:, None] * s_wk  # [BLOCK_K, R]
            acc = _dot(xt, _load(w_at, k_ok[:, None], rows_ok[None, :], EVEN_K, EVEN_N), acc, DOT_F32)
            if ACT == 1:
                up = _dot(xt, _load(w_at + N * s_wn, k_ok[:, None], rows_ok[None, :], EVEN_K, EVEN_N), up, DOT_F32)
        out = _finish(acc, up, b_ptr + e.to(tl.int64) * s_be, rows[None, :], rows_ok[None, :], N, s_ptr,
                      pairs[:, None], m_ok[:, None], alpha, limit, ACT, HAS_BIAS, HAS_SCALE, BLOCK_N)
        tl.store(out_ptr + pairs[:, None] * s_ot + n[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & (n < N)[None, :])


# a [BLOCK_K, BLOCK_N] weight tile per step, 8 KB in bf16 (gated: two, or one of 2 BLOCK_N rows)
BLOCK_N, BLOCK_K = 64, 64
MAX_BLOCK_M = 64
NUM_STAGES = 3  # cp.async stages of the K loop; fp32 at 64 rows then needs 98 KB of shared memory (RTX 30xx: 99 KB)


def block_m(pairs: int, experts: int) -> int:
    """Pairs per tile: the mean pairs per expert as a power of 2, 16 (tl.dot's least) to 64: a
    decode-sized batch in one tile per expert, a prefill's experts in fewer weight passes."""
    mean = -(-pairs // max(experts, 1))
    return min(MAX_BLOCK_M, max(16, 1 << (mean - 1).bit_length()))


def moe_grouped_triton(x, order, offsets, weight, pairs_per_token: int, scale=None, act=None, bias=None,
                       alpha: float = 1.0, limit: float = float("inf")) -> torch.Tensor:
    """Validated inputs (kernels/moe/__init__.py), order / offsets from group_pairs -> out [P, N]
    (N = output_width; rows of pairs whose expert id lies outside [0, E) are left unwritten)."""
    pairs, experts = order.shape[0], weight.shape[0]
    width = output_width(weight, act)
    out = torch.empty(pairs, width, dtype=x.dtype, device=x.device)
    if pairs == 0 or width == 0:
        return out
    b, s_be = bias_args(bias, order)
    # fp32 models: exact dots (not tf32). The interpreter's tl.dot on bf16 returns garbage (triton
    # 3.6, kernels/attention/triton.py), so off CUDA bf16 dots run in fp32 too.
    dot_f32 = x.dtype == torch.float32 or x.device.type != "cuda"
    _moe_grouped_kernel[(experts, triton.cdiv(width, BLOCK_N))](
        x, order, offsets, weight, b, order if scale is None else scale, out, width, x.shape[1],
        x.stride(0), weight.stride(0), weight.stride(1), weight.stride(2), s_be, out.stride(0),
        float(alpha), float(min(limit, 3e38)),
        PAIRS_PER_TOKEN=pairs_per_token, ACT=ACT_CODES[act], HAS_BIAS=bias is not None,
        HAS_SCALE=scale is not None, DOT_F32=dot_f32, EVEN_N=width % BLOCK_N == 0, EVEN_K=x.shape[1] % BLOCK_K == 0,
        BLOCK_M=block_m(pairs, experts), BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K, TILE_ROWS=tile_rows(act, BLOCK_N), num_warps=4, num_stages=NUM_STAGES)
    return out
