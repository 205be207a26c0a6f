"""Triton kernel of rope_append_kv (semantics: reference.rope_append_kv_reference): RoPE on q and
k (after Qwen3's per-head q/k RMSNorm when given) and the KV append into the paged cache, in ONE
launch per layer. The runner used to make 2 launches here on the Triton path (rotate q and k:
~12 torch ops in bf16; append_kv: 1 Triton launch) and 2 more per q/k norm.

One program per token (per few tokens for small models): it rotates all Hq query heads of its
token in place and writes the rotated K and the V of its Hkv heads into the token's paged slot. The two halves of each head
(rotate_half pairs element i with i + D/2) are loaded as separate [heads, D/2] tiles, so any
even head_dim works (D/2 padded to a power of 2 with masks). The roundings of the torch
expression x * cos + rotate_half(x) * sin (each product and the sum rounded to the model dtype)
are reproduced: bf16/fp16 outputs equal the torch path's bit for bit. A partial rotary
embedding (cos/sin [T, R], R < D: GLM-4.5's half) rotates the first R dims (pairs i, i + R/2) and
passes the rest: a third tile per head, and V copied in halves of D.

The grid is (T / tokens per program,): no host sync, CUDA-graph capturable. Padding tokens (t >= cu[B]) have their
q rotated (harmless: their outputs are unspecified) and write no K/V.
"""
from functools import lru_cache

import torch
import triton
import triton.language as tl

from .._launch import cdiv, next_pow2, tile_of
from .._triton_compat import gdc_launch_dependents, gdc_wait, pdl_options


# Ints that follow the call's tokens and the pool's size: not specialised (one compiled variant).
@triton.jit(do_not_specialize=["num_tokens", "batch", "num_blocks", "max_blocks"])
def _rope_append_kv_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
    k_cache_ptr, v_cache_ptr, bt_ptr, lens_ptr, cu_ptr, qs_ptr,
    q_eps, k_eps, num_tokens, batch, num_blocks, max_blocks,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh,  # token / head strides (elements) of q, k, v; unit last stride
    s_cs,  # token stride of cos and sin (one layout)
    s_bt,  # row stride of block_table (unit column stride)
    HQ: tl.constexpr, HKV: tl.constexpr, HQ_P2: tl.constexpr, HKV_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr, HALF_P2: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_B: tl.constexpr,
    TOKENS: tl.constexpr, QK_NORM: tl.constexpr, PDL: tl.constexpr = False, Q_SCALE: tl.constexpr = False,
    ROTARY: tl.constexpr = 0, PASS_P2: tl.constexpr = 1, V_HALF_P2: tl.constexpr = 1,
):
    if PDL:  # a programmatic dependent launch: nothing the kernel before wrote is read before the wait
        gdc_wait()
        gdc_launch_dependents()
    # TOKENS tokens per program (1 at the 8B model's 32 x 64 half-heads; more for small models,
    # whose programs would otherwise cost milliseconds each under the interpreter).
    # Tiles are [TOKENS, heads, R/2]: element i of a head pairs with element i + R/2, R the rotated
    # dims (ROTARY; 0: all D). A partial rotary embedding (R < D, GLM-4.5) passes dims [R, D) as they
    # are (a third tile, PASS; normed where QK_NORM) and copies V in its own two halves.
    ROT: tl.constexpr = HEAD_DIM if ROTARY == 0 else ROTARY
    PASS: tl.constexpr = HEAD_DIM - ROT
    HALF: tl.constexpr = ROT // 2
    t = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    t_ok = (t < num_tokens)[:, None, None]
    t64 = t.to(tl.int64)[:, None, None]
    j = tl.arange(0, HALF_P2)[None, None, :]
    jm = j < HALF
    cm = t_ok & jm
    c1 = tl.load(cos_ptr + t64 * s_cs + j, mask=cm, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + t64 * s_cs + HALF + j, mask=cm, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + t64 * s_cs + j, mask=cm, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + t64 * s_cs + HALF + j, mask=cm, other=0.0).to(tl.float32)

    # ---- q: all heads of the tokens, in place
    hq = tl.arange(0, HQ_P2)[None, :, None]
    qm = cm & (hq < HQ)
    q_head = q_ptr + t64 * s_qt + hq * s_qh  # [TOKENS, HQ_P2, 1]
    qp = q_head + j
    x1 = tl.load(qp, mask=qm, other=0.0)
    x2 = tl.load(qp + HALF, mask=qm, other=0.0)
    dtype = x1.dtype
    if PASS > 0:
        jp = tl.arange(0, PASS_P2)[None, None, :]
        qpm = t_ok & (jp < PASS) & (hq < HQ)
        xp = tl.load(q_head + ROT + jp, mask=qpm, other=0.0)
    if QK_NORM:  # Qwen3RMSNorm over each head's D values: float32 statistics, rounded, times weight
        a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
        total = tl.sum(a1 * a1, 2) + tl.sum(a2 * a2, 2)
        if PASS > 0:
            ap = xp.to(tl.float32)
            total += tl.sum(ap * ap, 2)
        inv = tl.math.rsqrt(total / HEAD_DIM + q_eps)[:, :, None]
        w1 = tl.load(qw_ptr + j, mask=jm, other=0.0).to(tl.float32)
        w2 = tl.load(qw_ptr + HALF + j, mask=jm, other=0.0).to(tl.float32)
        x1 = (w1 * (a1 * inv).to(dtype).to(tl.float32)).to(dtype)
        x2 = (w2 * (a2 * inv).to(dtype).to(tl.float32)).to(dtype)
        if PASS > 0:  # the passed dims are normed too
            wp = tl.load(qw_ptr + ROT + jp, mask=jp < PASS, other=0.0).to(tl.float32)
            xp = (wp * (ap * inv).to(dtype).to(tl.float32)).to(dtype)
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    r1 = ((a1 * c1).to(dtype).to(tl.float32) - (a2 * s1).to(dtype).to(tl.float32)).to(dtype)
    r2 = ((a2 * c2).to(dtype).to(tl.float32) + (a1 * s2).to(dtype).to(tl.float32)).to(dtype)
    if Q_SCALE:  # Ministral 3's / Llama 4's query temperature, one value per token: `q * scale` rounded
        qs = tl.load(qs_ptr + t64, mask=t_ok, other=0.0).to(tl.float32)
        r1 = (r1.to(tl.float32) * qs).to(dtype)
        r2 = (r2.to(tl.float32) * qs).to(dtype)
        if PASS > 0:
            xp = (xp.to(tl.float32) * qs).to(dtype)
    tl.store(qp, r1, mask=qm)
    tl.store(qp + HALF, r2, mask=qm)
    if PASS > 0 and (QK_NORM or Q_SCALE):  # the passed dims, in place, where normed or scaled
        tl.store(q_head + ROT + jp, xp, mask=qpm)

    # ---- each token's row and paged slot (as the append_kv kernel: cu searched in one compare)
    rows = tl.arange(0, BLOCK_B)
    ends = tl.load(cu_ptr + 1 + rows, mask=rows < batch, other=2147483647)
    row = tl.sum((ends[None, :] <= t[:, None]).to(tl.int32), 1)  # == batch past cu[B]: padding
    live = (row < batch) & (t < num_tokens)
    start = tl.load(cu_ptr + row, mask=live, other=0)
    pos = tl.load(lens_ptr + row, mask=live, other=0) + (t - start)
    ok = live & (pos >= 0) & (pos // PAGE_SIZE < max_blocks)
    block = tl.load(bt_ptr + row.to(tl.int64) * s_bt + pos // PAGE_SIZE, mask=ok, other=-1)
    ok = ok & (block >= 0) & (block < num_blocks)
    slot = (block.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE)[:, None, None]

    # ---- k (normed, rotated) and v into the slots: cache [num_blocks, PAGE_SIZE, HKV, HEAD_DIM] contiguous
    hk = tl.arange(0, HKV_P2)[None, :, None]
    km = jm & (hk < HKV) & ok[:, None, None]
    dst_head = slot * (HKV * HEAD_DIM) + hk * HEAD_DIM  # [TOKENS, HKV_P2, 1]
    dst = dst_head + j
    k_head = k_ptr + t64 * s_kt + hk * s_kh
    kp = k_head + j
    x1 = tl.load(kp, mask=km, other=0.0)
    x2 = tl.load(kp + HALF, mask=km, other=0.0)
    if PASS > 0:
        kpm = (jp < PASS) & (hk < HKV) & ok[:, None, None]
        xp = tl.load(k_head + ROT + jp, mask=kpm, other=0.0)
    if QK_NORM:
        a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
        total = tl.sum(a1 * a1, 2) + tl.sum(a2 * a2, 2)
        if PASS > 0:
            ap = xp.to(tl.float32)
            total += tl.sum(ap * ap, 2)
        inv = tl.math.rsqrt(total / HEAD_DIM + k_eps)[:, :, None]
        w1 = tl.load(kw_ptr + j, mask=jm, other=0.0).to(tl.float32)
        w2 = tl.load(kw_ptr + HALF + j, mask=jm, other=0.0).to(tl.float32)
        x1 = (w1 * (a1 * inv).to(dtype).to(tl.float32)).to(dtype)
        x2 = (w2 * (a2 * inv).to(dtype).to(tl.float32)).to(dtype)
        if PASS > 0:
            wp = tl.load(kw_ptr + ROT + jp, mask=jp < PASS, other=0.0).to(tl.float32)
            xp = (wp * (ap * inv).to(dtype).to(tl.float32)).to(dtype)
    if PASS > 0:
        tl.store(k_cache_ptr + dst_head + ROT + jp, xp, mask=kpm)
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(k_cache_ptr + dst, ((a1 * c1).to(dtype).to(tl.float32) - (a2 * s1).to(dtype).to(tl.float32)).to(dtype), mask=km)
    tl.store(k_cache_ptr + dst + HALF, ((a2 * c2).to(dtype).to(tl.float32) + (a1 * s2).to(dtype).to(tl.float32)).to(dtype),
             mask=km)
    if PASS > 0:  # V in halves of D (the rotation's tiles are halves of R)
        jv = tl.arange(0, V_HALF_P2)[None, None, :]
        vm = (jv < HEAD_DIM // 2) & (hk < HKV) & ok[:, None, None]
        vdst = dst_head + jv
        vp = v_ptr + t64 * s_vt + hk * s_vh + jv
        tl.store(v_cache_ptr + vdst, tl.load(vp, mask=vm), mask=vm)
        tl.store(v_cache_ptr + vdst + HEAD_DIM // 2, tl.load(vp + HEAD_DIM // 2, mask=vm), mask=vm)
    else:
        vp = v_ptr + t64 * s_vt + hk * s_vh + j
        tl.store(v_cache_ptr + dst, tl.load(vp, mask=km), mask=km)
        tl.store(v_cache_ptr + dst + HALF, tl.load(vp + HALF, mask=km), mask=km)


TILE_ELEMENTS = 2048  # q elements (per half) of one program: one token of the 8B model (32 heads x 64)


@lru_cache(maxsize=1024)
def _launch(num_tokens: int, hq: int, hkv: int, dim: int, batch: int, rotary: int):
    """(grid, constexprs) per shape, computed once (eager mode pays host work per launch). rotary:
    the rotated dims (dim: all; fewer: a partial rotary embedding, passed only then, so that the
    default launch keeps its cache key)."""
    half_p2, hq_p2 = next_pow2(rotary // 2), next_pow2(hq)
    tokens = tile_of(num_tokens, max(1, TILE_ELEMENTS // (hq_p2 * next_pow2(dim // 2))))  # prefill: the largest
    consts = dict(HQ=hq, HKV=hkv, HQ_P2=hq_p2, HKV_P2=next_pow2(hkv), HEAD_DIM=dim, HALF_P2=half_p2,
                  BLOCK_B=next_pow2(batch), TOKENS=tokens)
    if rotary < dim:
        consts.update(ROTARY=rotary, PASS_P2=next_pow2(dim - rotary), V_HALF_P2=next_pow2(dim // 2))
    return (cdiv(num_tokens, tokens),), consts


def rope_append_kv_triton(q, k, v, cos, sin, k_cache, v_cache, block_table, seq_lens, cu_query_lens,
                          qk_norm=None, pdl: bool = False, q_scale=None) -> None:
    """q [T, Hq, D] (rotated in place), k, v [T, Hkv, D] (read), cos/sin [T, R] (one layout; R = D,
    or fewer even dims: a partial rotary embedding, the first R rotated),
    caches [NB, BS, Hkv, D] contiguous, block_table [B, max_blocks] (unit column stride),
    seq_lens [B], cu_query_lens [B+1] int32; qk_norm None or (q_weight [D], q_eps, k_weight [D], k_eps).
    Every tensor has unit last stride. No checks: see cache_ops.rope_append_kv. pdl: on CUDA, a
    programmatic dependent launch (waits for the kernel before it at its first line; the GEMV
    layer's chain, runners/paged_llama.py GEMV_PDL). q_scale: None or [T] in q's dtype or float32, each
    token's rotated query times it in float32, rounded (Ministral 3's and Llama 4's temperatures)."""
    num_tokens, hq, dim = q.shape
    hkv = k.shape[1]
    if num_tokens == 0:
        return
    num_blocks, page = k_cache.shape[:2]
    batch = cu_query_lens.shape[0] - 1
    qw, q_eps, kw, k_eps = qk_norm if qk_norm is not None else (cos, 0.0, cos, 0.0)
    grid, consts = _launch(num_tokens, hq, hkv, dim, batch, cos.shape[1])
    _rope_append_kv_kernel[grid](
        q, k, v, cos, sin, qw, kw,
        k_cache, v_cache, block_table, seq_lens, cu_query_lens, cos if q_scale is None else q_scale,
        float(q_eps), float(k_eps), num_tokens, batch, num_blocks, block_table.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), block_table.stride(0),
        PAGE_SIZE=page, QK_NORM=qk_norm is not None, num_warps=4, **consts,
        **pdl_options(pdl, q.device),  # passed only when set
        **({} if q_scale is None else {"Q_SCALE": True}),  # likewise: the default launch keeps its cache key
    )


__all__ = ["rope_append_kv_triton"]
