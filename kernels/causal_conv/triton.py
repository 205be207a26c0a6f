"""conv_steps in one Triton launch (the spec: reference.py).

One program per (row, BLOCK_C channels): for each of the call's tokens it walks the token's K - 1 sources up its row
(the token before where it is real, or its parent in a token tree: scalar loads), reads each source's inputs (a call
token's from x, or an entry of the row's starting window: committed or a snapshot, chosen by start), sums the window
against the weight in float32, rounds once to the weight's dtype, adds the bias, applies silu where asked, and stores
the token's output and its window's last K - 1 inputs as its snapshot. Inputs are read from L1 / L2 a few times each
(K per token); nothing is staged through memory.

What it replaces (counted in runners/paged_recurrent.py's torch forms of a score call): the starting window's gather
(where + index: ~4 launches), conv_windows / tree_windows (~10), depthwise and the activation (~6), the snapshots'
scatter (~3) -- ~23 launches a recurrent layer and call, one. Not timed on a GPU.
"""
import torch
import triton
import triton.language as tl

from .._launch import cdiv, next_pow2

BLOCK_C = 256  # channels a program (the layers' C: 1024-16384; a row's programs cdiv(C, 256))


@triton.jit
def _source_parent(cur, b, parent_ptr, real_ptr, sp_b, sp_t, sr_b, sr_t, HAS_PARENT: tl.constexpr):
    """The token above call token cur (>= 0): its tree parent, or in a chain the token before where it is real; -1
    for none."""
    if HAS_PARENT:
        up = tl.load(parent_ptr + b * sp_b + cur * sp_t)
    else:
        before = tl.maximum(cur - 1, 0)
        up = tl.where((cur > 0) & (tl.load(real_ptr + b * sr_b + before * sr_t) != 0), cur - 1, -1)
    return up


@triton.jit
def _conv_steps_kernel(x_ptr, w_ptr, bias_ptr, committed_ptr, snap_ptr, start_ptr, slot_ptr, real_ptr, parent_ptr,
                       y_ptr, n, C,
                       sx_b, sx_t, sw_c, sc_b, sc_c, sn_b, sn_s, sn_c, sl_b, sl_t, sr_b, sr_t, sp_b, sp_t, sy_b, sy_t,
                       K: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                       HAS_PARENT: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mc = offs < C
    start = tl.load(start_ptr + b)
    committed = committed_ptr + b.to(tl.int64) * sc_b + offs * sc_c  # the row's starting window, [C, K - 1] each
    started = snap_ptr + b.to(tl.int64) * sn_b + tl.maximum(start, 0) * sn_s + offs * sn_c
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs, mask=mc, other=0.0)
    for t in range(n):
        own = tl.load(x_ptr + b * sx_b + t * sx_t + offs, mask=mc, other=0.0)
        acc = own.to(tl.float32) * tl.load(w_ptr + offs * sw_c + (K - 1), mask=mc, other=0.0).to(tl.float32)
        at = tl.load(slot_ptr + b * sl_b + t * sl_t)
        snap = snap_ptr + b.to(tl.int64) * sn_b + at * sn_s + offs * sn_c
        tl.store(snap + (K - 2), own.to(snap_ptr.dtype.element_ty), mask=mc)  # the window's newest entry
        cur = t
        beyond = 0  # entries taken past the call: the starting window's, newest first
        for j in tl.static_range(1, K):  # the source j levels up: window entry K - 1 - j
            up = tl.where(cur >= 0, _source_parent(tl.maximum(cur, 0), b, parent_ptr, real_ptr, sp_b, sp_t, sr_b, sr_t,
                                                   HAS_PARENT), -1)
            beyond = beyond + (up < 0).to(tl.int32)
            past = K - 1 - beyond  # the starting window's entry, where the source is past the call
            value = tl.load(x_ptr + b * sx_b + tl.maximum(up, 0) * sx_t + offs, mask=mc & (up >= 0), other=0.0)
            value += tl.load(committed + past, mask=mc & (up < 0) & (start < 0), other=0.0).to(value.dtype)
            value += tl.load(started + past, mask=mc & (up < 0) & (start >= 0), other=0.0).to(value.dtype)
            acc += value.to(tl.float32) * tl.load(w_ptr + offs * sw_c + (K - 1 - j), mask=mc, other=0.0).to(tl.float32)
            if j < K - 1:
                tl.store(snap + (K - 2 - j), value.to(snap_ptr.dtype.element_ty), mask=mc)
            cur = up
        y = acc.to(y_ptr.dtype.element_ty)
        if HAS_BIAS:  # added to the rounded sum, in float32 and rounded again (torch's add of two bf16 tensors)
            y = (y.to(tl.float32) + bias.to(tl.float32)).to(y_ptr.dtype.element_ty)
        if SILU:
            y32 = y.to(tl.float32)
            y = (y32 / (1.0 + tl.exp(-y32))).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + b * sy_b + t * sy_t + offs, y, mask=mc)


def conv_steps_triton(x, weight, bias, committed, snapshots, start, slot, real, parent, silu) -> torch.Tensor:
    """conv_steps (validated by __init__.py) -> y [B, n, C] in weight's dtype."""
    batch, n, channels = x.shape
    kernel = weight.shape[1]
    y = torch.empty(batch, n, channels, dtype=weight.dtype, device=x.device)
    if batch == 0 or n == 0:
        return y
    real = real.view(torch.uint8) if real.dtype == torch.bool else real
    block = min(BLOCK_C, next_pow2(channels))
    links = slot if parent is None else parent  # (an unread pointer in a chain)
    _conv_steps_kernel[(batch, cdiv(channels, block))](
        x, weight, weight if bias is None else bias, committed, snapshots, start, slot, real, links, y, n, channels,
        x.stride(0), x.stride(1), weight.stride(0), committed.stride(0), committed.stride(1),
        snapshots.stride(0), snapshots.stride(1), snapshots.stride(2), slot.stride(0), slot.stride(1),
        real.stride(0), real.stride(1), links.stride(0), links.stride(1), y.stride(0), y.stride(1),
        K=kernel, BLOCK_C=block, HAS_BIAS=bias is not None, SILU=bool(silu), HAS_PARENT=parent is not None,
        num_warps=max(1, min(4, block // 64)))
    return y
