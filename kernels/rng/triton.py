"""The Philox stream of kernels/rng/reference.py as Triton device functions (bit for bit).

    key     = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
    counter = (vocab_index, position, offset & 0xFFFFFFFF, (offset >> 32) << 8 | stream)

Philox4x32-10, first output word. Arithmetic is on uint32 (wrapping multiply and add,
tl.umulhi for the high half), the same rounds as Random123 and tl.randint4x.
"""
import torch
import triton
import triton.language as tl

from . import STREAM_SEED

# Philox4x32 constants (kernels/rng/__init__.py); globals read by @triton.jit code must be tl.constexpr objects.
_M0 = tl.constexpr(0xD2511F53)
_M1 = tl.constexpr(0xCD9E8D57)
_W0 = tl.constexpr(0x9E3779B9)
_W1 = tl.constexpr(0xBB67AE85)
_TWO_POW_M24 = tl.constexpr(5.9604644775390625e-08)  # 2**-24
_STREAM_SEED = tl.constexpr(STREAM_SEED)


@triton.jit
def philox_words(seed, offset, position, stream, vocab_index):
    """The four uint32 Philox words for (seed int64, offset int64, position int, stream int,
    vocab_index int): counter (vocab_index, position, offset lo, offset hi << 8 | stream), key
    (seed lo, seed hi). seed, offset, position, vocab_index are tensors (scalar or block; wrap a
    Python int as `i + tensor * 0`), stream a tensor or constexpr. Words: vocab_index's shape."""
    seed = seed.to(tl.int64)
    offset = offset.to(tl.int64)
    position = position.to(tl.int64)
    vocab_index = vocab_index.to(tl.int64)
    # Broadcast everything to the common shape once, so the rounds below keep their types.
    zero = (seed * 0 + offset * 0 + position * 0 + vocab_index * 0).to(tl.uint32)
    # int64 -> uint32 truncates: the low word of seed, then of seed >> 32 (arithmetic shift: the high word).
    k0 = seed.to(tl.uint32) + zero
    k1 = (seed >> 32).to(tl.uint32) + zero
    c0 = vocab_index.to(tl.uint32) + zero
    c1 = position.to(tl.uint32) + zero
    c2 = offset.to(tl.uint32) + zero
    c3 = (((offset >> 32) << 8) | stream).to(tl.uint32) + zero
    m0 = zero + _M0
    m1 = zero + _M1
    w0 = zero + _W0
    w1 = zero + _W1
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, m0)
        lo0 = c0 * m0
        hi1 = tl.umulhi(c2, m1)
        lo1 = c2 * m1
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + w0
        k1 = k1 + w1
    return c0, c1, c2, c3


@triton.jit
def philox_bits(seed, offset, position, stream, vocab_index):
    """uint32 draw(s) for (seed, offset, position, stream, vocab_index): word vocab_index % 4 of
    Philox for counter word vocab_index // 4 (kernels/rng/__init__.py; arguments as in philox_words,
    vocab_index a tensor). One call per draw: where a tile holds four consecutive indices per call,
    philox_bits_grouped makes one call per four. Result: vocab_index's shape."""
    vocab_index = vocab_index.to(tl.int64)
    c0, c1, c2, c3 = philox_words(seed, offset, position, stream, vocab_index >> 2)
    word = vocab_index & 3
    return tl.where(word == 0, c0, tl.where(word == 1, c1, tl.where(word == 2, c2, c3)))


@triton.jit
def philox_bits_grouped(seed, offset, position, stream, first, BLOCK_V: tl.constexpr):
    """uint32 [R, BLOCK_V]: the draws of vocab indices first .. first + BLOCK_V - 1 (first and
    BLOCK_V multiples of 4) for the R rows of seed / offset / position ([R, 1] tensors; stream as in
    philox_words), one Philox call per four indices: its words in order (philox_bits' values)."""
    groups = (first // 4 + tl.arange(0, BLOCK_V // 4))[None, :]
    c0, c1, c2, c3 = philox_words(seed, offset, position, stream, groups)
    return tl.interleave(tl.interleave(c0, c2), tl.interleave(c1, c3))  # c0[0] c1[0] c2[0] c3[0] c0[1] ...


@triton.jit
def tile_bits(seed, offset, position, stream, first, idx, BLOCK_V: tl.constexpr):
    """The draws of a tile's vocab indices idx [1, BLOCK_V] = first + arange(BLOCK_V) (first a multiple
    of BLOCK_V) for rows [R, 1]: grouped where BLOCK_V is a multiple of 4, else one call per index."""
    if BLOCK_V % 4 == 0:
        return philox_bits_grouped(seed, offset, position, stream, first, BLOCK_V)
    else:
        return philox_bits(seed, offset, position, stream, idx)


# seed: any int64 and different at every call of a caller that varies it; as a specialised int
# argument each value that is 1 or a multiple of 16 (or outside int32) would compile a new
# variant, which inside a CUDA-graph capture invalidates the capture. Annotated int64 + not
# specialised: one compiled variant for every seed.
@triton.jit(do_not_specialize=["seed"])
def _derive_row_seeds_kernel(out_ptr, seed: tl.int64, batch, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lo, hi, _, _ = philox_words(seed + rows * 0, rows * 0, rows * 0, _STREAM_SEED, rows)
    tl.store(out_ptr + rows, lo.to(tl.int64) | (hi.to(tl.int64) << 32), mask=rows < batch)


def derive_row_seeds_triton(seed: int, batch: int, device) -> torch.Tensor:
    """kernels/rng/reference.derive_row_seeds in one launch (bit for bit): int64 [batch] on device.
    No host-to-device copy (the seed is a kernel argument): capturable once compiled."""
    out = torch.empty((batch,), dtype=torch.int64, device=device)
    if batch:
        block = min(triton.next_power_of_2(batch), 1024)
        _derive_row_seeds_kernel[(triton.cdiv(batch, block),)](out, seed, batch, BLOCK=block)
    return out


@triton.jit
def uniform_from_bits(bits):
    """[0, 1) float32 from uint32 bits: (x >> 8) * 2**-24 (exact)."""
    return (bits >> 8).to(tl.int32).to(tl.float32) * _TWO_POW_M24


@triton.jit
def uniform_open_from_bits(bits):
    """(0, 1) float32 from uint32 bits: ((x >> 9) * 2 + 1) * 2**-24 (exact)."""
    return ((bits >> 9) * 2 + 1).to(tl.int32).to(tl.float32) * _TWO_POW_M24


@triton.jit
def exponential_from_bits(bits):
    """Standard exponential float32: E = -log(uniform_open(x)), in [5.96e-8, 16.64]; the Gumbel
    noise of the same bits is -log(E). Gumbel-max in ratio form takes E: argmax(log w + G) =
    argmax(w / E) for weights w >= 0, one logarithm per value instead of two (or three with
    log w); the verify's emissions do (kernels/verify/_triton_emit.py)."""
    return -tl.log(uniform_open_from_bits(bits))


@triton.jit
def gumbel_from_bits(bits):
    """Standard Gumbel float32: -log(-log(uniform_open(x)))."""
    return -tl.log(exponential_from_bits(bits))
