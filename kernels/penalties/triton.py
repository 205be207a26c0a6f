"""The penalties as a Triton elementwise transform of raw logits (the spec: reference.py), applied
by the verify / sample kernels (kernels/verify/_triton_*.py) wherever they load logits.

Two tuples carry the penalties through the kernels, with a constexpr PENALTY beside them (a
tuple built inside a kernel holds runtime values only, so the flag cannot ride in it):
    kernel arguments   args = (W, P0, counts_ptr, repetition_ptr, frequency_ptr, presence_ptr,
                               tokens_ptr, s_cb, s_tb, s_tk)
    one distribution   pen  = (counts_row_ptr, repetition, frequency, presence, tokens_row_ptr,
                               s_tk, n_prev, W)
counts_ptr: int32 [B, V] state words (row stride s_cb); tokens_ptr: int [B, W] generated tokens
the state does not hold yet (strides s_tb, s_tk; -1 = not a token): the drafts (W = K, P0 = 0)
or sample's prefix (W = prefix width, P0 = W, K = 0). The distribution at position i (target i
or draft i) sees the first n_prev = P0 + i of them on top of the counts: the drafts before it.
PENALTY False: no code of this file is compiled (a placeholder tuple travels unread), and the
verify kernels keep their penalty-free entry points with today's signatures (their
specialisation keys and PTX are unchanged: tests/kernels/test_penalties_triton.py).

Cost on a GPU: one int32 count per logit read (B * V * 4 bytes per distribution; the counts row
is the same for a row's 2K + 1 distributions, so at small batch it stays in L2) and W compares.
"""
import triton
import triton.language as tl

from .reference import COUNT_MASK

_COUNT_MASK = tl.constexpr(COUNT_MASK)


@triton.jit
def row_penalty(args, b, i):
    """The pen tuple of distributions of batch rows b at positions i (scalars, or tensors of one
    shape: [R] or [R, 1] for a tile of rows)."""
    b64 = b.to(tl.int64)
    return (args[2] + b64 * args[7], tl.load(args[3] + b), tl.load(args[4] + b), tl.load(args[5] + b),
            args[6] + b64 * args[8], args[9], i + args[1], args[0])


@triton.jit
def penalise(z, idx, live, pen):
    """fp32 logits z at vocabulary indices idx (broadcastable shapes, e.g. [R, 1] rows x [1, C]
    indices) of the distribution(s) pen, penalised; live: where idx is inside the row (the counts
    are read there only). Each step rounded as reference.penalise writes it (launch penalised
    kernels with enable_fp_fusion=False: no fused multiply-add)."""
    counts_row, rep, freq, pres, tokens_row, s_tk, n_prev, width = pen
    state = tl.load(counts_row + idx, mask=live, other=0)
    count = state & _COUNT_MASK
    for j in range(0, width):  # the generated tokens in front of this position (K at most)
        t = tl.load(tokens_row + j * s_tk, mask=j < n_prev, other=-1)
        count += (idx == t).to(tl.int32)
    seen = (state != 0) | (count > 0)  # in the prompt (bit 30) or generated
    z = tl.where(seen, tl.where(z < 0, z * rep, tl.div_rn(z, rep)), z)
    z = z - freq * count.to(tl.float32)
    return z - pres * (count > 0).to(tl.float32)
