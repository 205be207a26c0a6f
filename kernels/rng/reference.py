"""Philox4x32-10 in plain torch integer ops: the spec of the random stream, on any device.

All values are carried in int64 tensors holding unsigned 32-bit numbers, so nothing
overflows: a 32x32-bit product is split into two 32x16-bit products (< 2**48 each).
"""
import torch

from . import MAX_OFFSET, PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1, STREAM_SEED

MASK32 = 0xFFFFFFFF


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit halves of a * m for a in [0, 2**32) (int64 tensor) and m < 2**32."""
    upper = a * (m >> 16)  # a * m = upper * 2**16 + lower
    lower = a * (m & 0xFFFF)
    lo = (((upper & 0xFFFF) << 16) + lower) & MASK32
    hi = (upper + (lower >> 16)) >> 16
    return hi, lo


def _int64_on_common_device(*values) -> list[torch.Tensor]:
    """values (ints or tensors) as int64 tensors on the device of the tensors among them: a
    Python int becomes a tensor THERE, not on the CPU (the H100 run: CUDA seeds met CPU ints)."""
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
    # torch.full, not torch.tensor: on CUDA a fill kernel (capturable), not a pageable host-to-device copy.
    return [v.to(torch.int64) if isinstance(v, torch.Tensor) else torch.full((), v, dtype=torch.int64, device=device)
            for v in values]


def philox(c0, c1, c2, c3, k0, k1) -> tuple[torch.Tensor, ...]:
    """Philox4x32 with 10 rounds (Random123 / Triton's tl.randint4x). All args int64 in [0, 2**32)
    (ints or tensors, on one device), broadcastable. Returns the four 32-bit outputs as int64
    tensors on the tensors' device (CPU when every argument is an int)."""
    c0, c1, c2, c3, k0, k1 = torch.broadcast_tensors(*_int64_on_common_device(c0, c1, c2, c3, k0, k1))
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def random_bits(seed: torch.Tensor, offset: torch.Tensor, position, stream: int, vocab_index) -> torch.Tensor:
    """The 32-bit draw for (seed, offset, position, stream, vocab_index), as int64 in [0, 2**32):
    word vocab_index % 4 of Philox's output for counter word 0 = vocab_index // 4 (one Philox call
    serves four consecutive vocab indices; index 0, the accept coins', is word 0 of counter 0).

    seed, offset: int64 tensors (typically [B, 1] or [B]); position, vocab_index: ints or
    int64 tensors broadcastable against them.
    """
    seed, offset, position, vocab_index = _int64_on_common_device(seed, offset, position, vocab_index)
    c3 = ((offset >> 32) << 8) | stream
    words = philox(vocab_index >> 2, position, offset & MASK32, c3 & MASK32, seed & MASK32, (seed >> 32) & MASK32)
    word = (vocab_index & 3).expand_as(words[0])
    return torch.where(word == 0, words[0], torch.where(word == 1, words[1], torch.where(word == 2, words[2], words[3])))


def uniform(bits: torch.Tensor) -> torch.Tensor:
    """[0, 1) float32 with 24 random bits, exact."""
    return (bits >> 8).to(torch.float32) * (2.0**-24)


def uniform_open(bits: torch.Tensor) -> torch.Tensor:
    """(0, 1) float32, exact: odd multiples of 2**-24."""
    return ((bits >> 9) * 2 + 1).to(torch.float32) * (2.0**-24)


def gumbel(bits: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise, float32: -log(-log(U)), U in (0, 1)."""
    return -torch.log(-torch.log(uniform_open(bits)))


def derive_row_seeds(seed: int, batch: int, device="cpu") -> torch.Tensor:
    """Per-row int64 seeds [batch] on ``device`` from one integer seed (int64 range): row b gets
    Philox((b, 0, 0, STREAM_SEED), key = the seed's two 32-bit words) -> lo | hi << 32.

    Distinct rows of one call draw independent streams; the same (seed, b) always maps to the
    same row seed, on every device. 273 small torch ops (counted on CPU): sampling_params.py
    caches the result per (seed, batch, device), and rng/triton.py derives it in one launch on CUDA.
    """
    seed = int(seed)
    rows = torch.arange(batch, dtype=torch.int64, device=device)
    lo, hi, _, _ = philox(rows, 0, 0, STREAM_SEED, seed & MASK32, (seed >> 32) & MASK32)
    return lo | (hi << 32)  # wraps into the int64 range: any 64-bit pattern is a valid seed


def check_offset_range(offset: torch.Tensor, name: str = "offset") -> None:
    """ValueError unless every offset lies in [0, 2**56) (reads the values: may sync)."""
    if offset.numel() and (bool((offset < 0).any()) or bool((offset >= MAX_OFFSET).any())):
        raise ValueError(f"{name} must lie in [0, 2**56), got min {int(offset.min())}, max {int(offset.max())}")
