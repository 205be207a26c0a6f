"""Triton skinny linear for CUDA decode steps: y [M, N] = prologue(x) @ weight.T (+ bias) (+ residual)
for few rows M (a decode step's B * (K + 1) tokens, M <= MAX_ROWS), the weight [N, K] streamed
once, no split-K (each program owns BLOCK_N whole output columns: deterministic, no reduce
launch, no float32 workspace).

Prologues, fused into the stream so that the input never makes a round trip through memory:
  "none":     x [M, K].
  "rms_norm": x [M, K], norm_weight [K] -> rsqrt(mean(x^2) + eps) * (x * norm_weight); the row's
              statistic is summed in the same loop that streams the weight and applied to the
              product's columns at the end (it factors out of the dot product), so no pass
              over x precedes the stream. x * norm_weight is rounded to the model dtype per
              element (transformers rounds x * rsqrt first, then multiplies by the weight and
              rounds again: the two differ by about an ulp of the model dtype per element).
  "silu_mul": x [M, 2K] = [gate | up] (one fused gate_up product) -> silu(gate) * up, with
              transformers' roundings (silu rounded, product rounded: as silu_mul_triton).
Epilogue: + bias, rounded to the model dtype (F.linear's output), then + residual rounded
(``residual + F.linear(...)``: the order of a transformer's residual stream).

Why (issue 25): on the H100 the 8B-shaped plain step spent 5.6 ms in 225 cuBLAS GEMV/GEMM
launches plus 0.28 ms in 160 split-K reduce launches, and ~1 ms in the layer's small kernels
(bench/results/h100_3dca4fa/step_profile.json); the layer's add_rms_norm and silu_mul exist only
to feed the next product. With these prologues a layer is 6 launches (7 with silu_mul apart)
instead of 9 + cuBLAS's reduces (runners/paged_llama.py GEMV_LAYER). Whether this streams the
weight faster than cuBLAS is for a GPU to say (bench/bench_gemv.py); until one does, the runner
keeps F.linear.

PDL (skinny_linear_triton(pdl=True), CUDA sm_90+): the launch is a programmatic dependent launch.
The program prefetches its first BLOCK_K columns of its weight rows into L2 (the weight is never
written by a decode step), then waits (griddepcontrol.wait) for the kernel before it and only
then reads x, the residual, the norm weight or the bias: the boundary between two products
overlaps the next weight stream. Checked in the sm_90a PTX (no global load before the wait:
tests/kernels/aot_compile_layer_ops.py); never timed (runners/paged_llama.py GEMV_PDL is off).

Two inner products by row count: one row (BLOCK_M = 1) keeps a [BLOCK_N, BLOCK_K] float32
accumulator of elementwise products, reduced across lanes ONCE after the loop (no shuffles per
step); more rows (BLOCK_M = 16) use tl.dot (mma) on [16, BLOCK_K] x [BLOCK_K, BLOCK_N] tiles.
Grids depend on shapes only; no host sync (CUDA-graph capturable).

On the tl.dot path the silu_mul prologue runs in the dot operand's layout, replicated over the
4 warps and over the 16 padded rows: 128 exp per thread per step at sm_90a against 4 on the
one-row path (bench/gemv_ptx.py), ~4 exp + divide per weight value -- more, by counting, than the
SFUs keep up with at HBM speed (a prediction). So the GEMV layer fuses SwiGLU at one row only
(runners/paged_llama.py SILU_FUSED_MAX_ROWS), and bench/bench_gemv.py times both ways.
"""
from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

from .._launch import cdiv
from .._triton_compat import gdc_launch_dependents, gdc_wait, pdl_options

PROLOGUES = ("none", "rms_norm", "silu_mul")
MAX_ROWS = 16  # rows the kernel is for (one BLOCK_M = 16 tile); more rows: F.linear (cuBLAS GEMM)


@triton.jit
def _prefetch_l2(ptrs):
    """prefetch.global.L2 of each address (inline PTX: CUDA only; callers keep the addresses inside the tensor)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit(do_not_specialize=["M"])
def _skinny_linear_kernel(
    x_ptr, w_ptr, b_ptr, r_ptr, nw_ptr, y_ptr,
    M, N, K, eps,
    s_x, s_w, s_r, s_y,  # row strides (elements); unit column strides
    PROLOGUE: tl.constexpr,  # 0 none, 1 rms_norm, 2 silu_mul (x holds [gate | up], up at column K)
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    EVEN_N: tl.constexpr,  # N % BLOCK_N == 0: no column masks on the weight
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no masks along K
    DOT_F32: tl.constexpr,  # tl.dot in float32, exact (float32 models; bf16 under the interpreter)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (launch_pdl, sm_90+)
):
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_x  # [BM, 1]
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_w  # [BN, 1]
    if PDL:
        # Launched while the previous kernel still runs: nothing that kernel writes is read
        # before griddepcontrol.wait. The weight is never written by a step, so this program's
        # first BLOCK_K columns of its rows are prefetched into L2 first: the kernel boundary
        # overlaps the weight stream instead of idling the HBM.
        LINE: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth  # elements per 128 B
        NLINES: tl.constexpr = BLOCK_K // LINE if BLOCK_K >= LINE else 1
        lines = tl.minimum(tl.arange(0, NLINES) * LINE, K - 1)
        _prefetch_l2(w_ptr + tl.minimum(rn, N - 1).to(tl.int64)[:, None] * s_w + lines[None, :])
        gdc_wait()
        gdc_launch_dependents()  # the next PDL launch may start its own prefetch once all programs are here
    if BLOCK_M == 1:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)  # elementwise partial sums, reduced after the loop
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    ss2 = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)  # rms_norm: elementwise partial sums of x^2
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        if EVEN_K:
            x_mask = m_ok[:, None]
            if EVEN_N:
                w = tl.load(w_rows + k[None, :])
            else:
                w = tl.load(w_rows + k[None, :], mask=n_ok[:, None], other=0.0)
        else:
            x_mask = m_ok[:, None] & (k < K)[None, :]
            w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)
        x = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0)  # [BM, BK]
        dtype = x.dtype
        if PROLOGUE == 2:
            up = tl.load(x_rows + K + k[None, :], mask=x_mask, other=0.0)
            g = x.to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(dtype)  # torch's silu in float32, rounded
            x = (s.to(tl.float32) * up.to(tl.float32)).to(dtype)
        if PROLOGUE == 1:
            xf = x.to(tl.float32)
            ss2 += xf * xf  # in x's own layout: no conversion
        if BLOCK_M == 1 and PROLOGUE != 2:
            # x (and the norm weight) read again in the weight tile's shape [BN, BK] -- every row
            # the same addresses, L1 hits -- so that they arrive in the weight's register layout:
            # multiplying the [1, BK] tile took 8 shared-memory layout conversions (bar.sync) per
            # step at sm_90a, this none (bench/gemv_ptx.py). silu_mul keeps the conversion: in the
            # weight's shape it would compute every exp BLOCK_N times.
            xb = tl.load(x_rows + k[None, :] + 0 * rn[:, None], mask=x_mask, other=0.0)
            if PROLOGUE == 1:
                if EVEN_K:
                    nwb = tl.load(nw_ptr + k[None, :] + 0 * rn[:, None])
                else:
                    nwb = tl.load(nw_ptr + k[None, :] + 0 * rn[:, None], mask=(k < K)[None, :], other=0.0)
                xb = (xb.to(tl.float32) * nwb.to(tl.float32)).to(dtype)
            acc2 += w.to(tl.float32) * xb.to(tl.float32)  # [BN, BK]
        elif BLOCK_M == 1:
            acc2 += w.to(tl.float32) * x.to(tl.float32)  # [BN, BK] * [1, BK]
        else:
            if PROLOGUE == 1:
                if EVEN_K:
                    nw = tl.load(nw_ptr + k)
                else:
                    nw = tl.load(nw_ptr + k, mask=k < K, other=0.0)
                x = (xf * nw.to(tl.float32)[None, :]).to(dtype)
            if DOT_F32:
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
    if BLOCK_M == 1:
        acc = tl.sum(acc2, 1)[None, :]  # [1, BN]
    if PROLOGUE == 1:
        acc = acc * tl.math.rsqrt(tl.sum(ss2, 1) / K + eps)[:, None]
    out_dtype = y_ptr.dtype.element_ty
    if HAS_BIAS:
        b = tl.load(b_ptr + rn, mask=n_ok, other=0.0)
        acc = acc + b.to(tl.float32)[None, :]
    y = acc.to(out_dtype)  # F.linear's output, rounded
    mask = m_ok[:, None] & n_ok[None, :]
    if HAS_RES:
        r = tl.load(r_ptr + rm.to(tl.int64)[:, None] * s_r + rn[None, :], mask=mask, other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(out_dtype)
    tl.store(y_ptr + rm.to(tl.int64)[:, None] * s_y + rn[None, :], y, mask=mask)


@dataclass(frozen=True)
class GemvConfig:
    """Tile sizes of one launch: BLOCK_N output columns per program, BLOCK_K of the reduction per
    step, warps, pipeline stages."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# Predicted, not measured (no GPU has run this kernel yet; bench/bench_gemv.py --gpu sweeps
# CONFIG_CANDIDATES per shape and says which wins). The model: an H100 needs ~18 KB of weight
# loads in flight per SM to stream HBM at 3 TB/s (3 TB/s x ~0.8 us / 132 SMs), and every SM
# needs programs: no split-K, so N / BLOCK_N programs is all a launch has (N = 4096: 256 at
# BLOCK_N = 16). One row: a [16, 512] bf16 weight tile per step, 8 16-byte loads per thread in
# flight at 4 warps (140-162 registers at sm_90a: 3 programs per SM, 48 KB; bench/gemv_ptx.py).
# More rows: tl.dot (mma) on [16, 256] x [256, BLOCK_N] tiles, 3 stages of cp.async (16 KB of
# shared memory per stage at BLOCK_N = 16); BLOCK_N 32 once N gives 2 programs per SM with it.
ONE_ROW = GemvConfig(block_n=16, block_k=512, num_warps=4, num_stages=1)
MANY_ROWS_NARROW = GemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=3)
MANY_ROWS_WIDE = GemvConfig(block_n=32, block_k=256, num_warps=4, num_stages=3)
WIDE_N = 32 * 2 * 132  # N from which MANY_ROWS_WIDE still gives two programs per H100 SM
CONFIG_CANDIDATES = {
    1: [ONE_ROW, GemvConfig(8, 512, 4, 1), GemvConfig(32, 256, 4, 1), GemvConfig(16, 1024, 8, 1),
        GemvConfig(16, 256, 4, 2)],
    16: [MANY_ROWS_NARROW, MANY_ROWS_WIDE, GemvConfig(16, 128, 4, 4), GemvConfig(16, 512, 4, 2),
         GemvConfig(64, 128, 4, 3)],
}
# The interpreter pays per operation, not per element: whole-ish tiles.
INTERPRETER = {1: GemvConfig(64, 256, 4, 1), 16: GemvConfig(64, 256, 4, 1)}


def block_m_for(rows: int) -> int:
    """1 for one row (the elementwise path), else 16 (the tl.dot path; tl.dot needs 16 rows)."""
    return 1 if rows == 1 else 16


def default_config(rows: int, n: int, on_cuda: bool) -> GemvConfig:
    """The tiles for ``rows`` rows and N = n output columns (see CONFIG_CANDIDATES)."""
    block_m = block_m_for(rows)
    if not on_cuda:
        return INTERPRETER[block_m]
    if block_m == 1:
        return ONE_ROW
    return MANY_ROWS_WIDE if n >= WIDE_N else MANY_ROWS_NARROW


@lru_cache(maxsize=4096)
def _launch(rows: int, n: int, k: int, config: GemvConfig):
    """(grid, block_m, even_n, even_k, block_k) per shape, computed once (a step calls this 4 times a layer)."""
    block_m = block_m_for(rows)
    block_k = min(config.block_k, max(16, 1 << max(0, (k - 1).bit_length())))
    return (cdiv(n, config.block_n), cdiv(rows, block_m)), block_m, n % config.block_n == 0, k % block_k == 0, block_k


def skinny_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         residual: torch.Tensor | None = None, *, prologue: str = "none",
                         norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                         config: GemvConfig | None = None, out: torch.Tensor | None = None,
                         pdl: bool = False) -> torch.Tensor:
    """x [M, K] ([M, 2K] = [gate | up] for prologue "silu_mul"; unit column stride, any row
    stride), weight [N, K] (unit column stride), bias [N] or None, residual [M, N] or None,
    norm_weight [K] (prologue "rms_norm") -> y [M, N] in x's dtype (or written into out [M, N]).
    M <= MAX_ROWS. No checks beyond the prologue's name: the caller owns the shapes (the runner)
    or validated them (kernels/linear.skinny_linear). pdl: on CUDA, a programmatic dependent
    launch (the weight's first tile prefetched into L2 while the previous kernel finishes, then
    griddepcontrol.wait before x is read); ignored elsewhere."""
    if prologue not in PROLOGUES:
        raise ValueError(f"prologue must be one of {PROLOGUES}, got {prologue!r}")
    rows, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if out is None:
        out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0 or n == 0:
        return out
    on_cuda = x.device.type == "cuda"
    config = config or default_config(rows, n, on_cuda)
    grid, block_m, even_n, even_k, block_k = _launch(rows, n, k, config)
    _skinny_linear_kernel[grid](
        x, weight, weight if bias is None else bias, out if residual is None else residual,
        weight if norm_weight is None else norm_weight, out,
        rows, n, k, float(eps),
        x.stride(0), weight.stride(0), 0 if residual is None else residual.stride(0), out.stride(0),
        PROLOGUE=PROLOGUES.index(prologue), HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        EVEN_N=even_n, EVEN_K=even_k, DOT_F32=x.dtype == torch.float32 or not on_cuda,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=block_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **pdl_options(pdl, x.device),  # passed only when set: keys kept
    )
    return out


__all__ = ["skinny_linear_triton", "GemvConfig", "CONFIG_CANDIDATES", "PROLOGUES", "MAX_ROWS", "default_config"]
