"""Triton kernels of the Llama layer's small ops on CUDA (semantics: reference.py).

    add_rms_norm: residual = x + delta (rounded to x's dtype, as torch's add does), then
        out = weight * rms_norm(residual) with float32 statistics: ONE launch writes both.
        delta None: a plain RMSNorm. write_residual False (the final norm): out only.
    silu_mul: silu(gate) * up, gate/up any row stride (e.g. the two halves of one gate_up
        product, read in place).

Each replaces 8-10 torch launches per use in bf16 (to(float32), pow, mean, add, rsqrt, mul,
to(dtype), mul, and the residual add; silu, mul): one plain step of the 8B-shaped model spent
~1.7 ms in ~1000 such launches on an H100 (bench/results/h100_3dca4fa/step_profile.json). The roundings of
transformers' op sequence are reproduced (each op computes in float32 and rounds to the model
dtype, as PyTorch's reduced-precision elementwise kernels do), so outputs match the torch path
to the last bit except for rsqrt/exp implementations and summation order.

Grids depend on shapes only; no host sync (CUDA-graph capturable).
"""
from functools import lru_cache

import torch
import triton
import triton.language as tl

from .._launch import cdiv, next_pow2, tile_of


# n_rows follows the call's token count: not specialised (one compiled variant for every length).
@triton.jit(do_not_specialize=["n_rows"])
def _add_rms_norm_kernel(
    x_ptr, delta_ptr, w_ptr, res_ptr, out_ptr,
    n_rows, n_cols, eps,
    s_x, s_d, s_r, s_o,  # row strides (elements) of x, delta, residual out, normed out; unit column stride
    HAS_DELTA: tl.constexpr,
    WRITE_RES: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # ROWS whole rows per program (BLOCK = next power of 2 >= n_cols): one row at H = 4096;
    # small H packs rows (under the interpreter each program costs milliseconds)
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    c = tl.arange(0, BLOCK)[None, :]
    m = (row < n_rows) & (c < n_cols)
    x = tl.load(x_ptr + row * s_x + c, mask=m, other=0.0)
    dtype = x.dtype
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * s_d + c, mask=m, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(dtype)
        if WRITE_RES:
            tl.store(res_ptr + row * s_r + c, x, mask=m)
    xf = x.to(tl.float32)
    inv = tl.math.rsqrt(tl.sum(xf * xf, 1) / n_cols + eps)[:, None]
    w = tl.load(w_ptr + c, mask=c < n_cols, other=0.0)
    y = (w.to(tl.float32) * (xf * inv).to(dtype).to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * s_o + c, y, mask=m)


@triton.jit(do_not_specialize=["n_rows"])
def _silu_mul_kernel(
    gate_ptr, up_ptr, out_ptr, n_rows, n_cols,
    s_g, s_u, s_o,  # row strides (elements); unit column stride
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    c = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[None, :]
    m = (row < n_rows) & (c < n_cols)
    g = tl.load(gate_ptr + row * s_g + c, mask=m, other=0.0)
    u = tl.load(up_ptr + row * s_u + c, mask=m, other=0.0)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # torch's silu: x / (1 + exp(-x)) in float32, rounded
    tl.store(out_ptr + row * s_o + c, (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=m)


SILU_BLOCK = 1024  # columns per program: F = 14336 (8B) -> 14 programs per row
TILE_ELEMENTS = 1024  # rows are packed into one program up to this many elements (never split)


def _rows_per_program(rows: int, block: int) -> int:
    """Whole rows per program: 1 for rows of >= TILE_ELEMENTS (the 8B model's 4096), more for
    small rows (the tests' H = 64 under the interpreter: one program instead of T); calls of
    more than 16 rows all take the largest count (one compiled variant: _launch.tile_of)."""
    return tile_of(rows, max(1, TILE_ELEMENTS // block))


# Launch shapes per (rows, cols), computed once: a step calls each wrapper 32-64 times with the
# same shapes, and eager mode pays every microsecond of host work per launch.
@lru_cache(maxsize=1024)
def _norm_launch(rows: int, cols: int):
    block = next_pow2(cols)
    per = _rows_per_program(rows, block)
    # 4096 bf16 columns: 16 warps keep 8 values per thread (no spills; H <= 16384 fits)
    return (cdiv(rows, per),), per, block, max(1, min(16, per * block // 256))


@lru_cache(maxsize=1024)
def _silu_launch(rows: int, cols: int):
    block = min(SILU_BLOCK, next_pow2(cols))
    per = _rows_per_program(rows, block)
    return (cdiv(rows, per), cdiv(cols, block)), per, block


def add_rms_norm_triton(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, *,
                        write_residual: bool = True):
    """x, delta [T, H] (unit column stride), weight [H] -> (residual [T, H] or None, out [T, H]).
    No checks: the caller validated (kernels/llama_ops.add_rms_norm) or owns the shapes (runner)."""
    rows, cols = x.shape
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    res = torch.empty_like(out) if delta is not None and write_residual else None
    if rows == 0:
        return res, out
    grid, per, block, warps = _norm_launch(rows, cols)
    _add_rms_norm_kernel[grid](
        x, x if delta is None else delta, weight, out if res is None else res, out,
        rows, cols, float(eps),
        x.stride(0), 0 if delta is None else delta.stride(0), cols, cols,
        HAS_DELTA=delta is not None, WRITE_RES=res is not None, ROWS=per, BLOCK=block, num_warps=warps,
    )
    return res, out




def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [T, F] (unit column stride, any row stride) -> silu(gate) * up [T, F] contiguous."""
    rows, cols = gate.shape
    out = torch.empty((rows, cols), dtype=gate.dtype, device=gate.device)
    if rows == 0 or cols == 0:
        return out
    grid, per, block = _silu_launch(rows, cols)
    _silu_mul_kernel[grid](gate, up, out, rows, cols, gate.stride(0), up.stride(0), cols, ROWS=per, BLOCK=block,
                           num_warps=4)
    return out


__all__ = ["add_rms_norm_triton", "silu_mul_triton"]
