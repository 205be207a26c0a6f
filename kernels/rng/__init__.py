"""Counter-based randomness shared by every backend (Philox4x32-10).

Every random number is a pure function of (seed, offset, position, stream, vocab index):

    key     = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)        # seed: int64 per row
    counter = (vocab_index // 4, position, offset & 0xFFFFFFFF, (offset >> 32) << 8 | stream)

and output word vocab_index % 4 of Philox's four 32-bit outputs is used: one Philox call serves
four consecutive vocab indices (the Gumbel noise of a whole row costs V / 4 calls; on an H200 the
B = 64 emission's noise took 46.4 us against 62.1 with one call per index, bench_noise.py's
gumbel_4words, bench/results/h200_2026-11-27c). Before 2026-11-28 word 0 of the counter
(vocab_index, ...) was used: a seed's draws changed then (their distribution did not; vocab
index 0, the accept coins', draws what it drew). Offsets must lie in [0, 2**56).
No generator objects, so it is CUDA-graph safe and reproducible per request.

Floats from a 32-bit draw x (all exact in float32):
    uniform(x)      = (x >> 8) * 2**-24                 in [0, 1)   (accept coins)
    uniform_open(x) = ((x >> 9) * 2 + 1) * 2**-24       in (0, 1)   (Gumbel noise)
    gumbel(x)       = -log(-log(uniform_open(x)))
"""

STREAM_ACCEPT = 0  # accept coins u_i of the ratio test, vocab index 0
STREAM_TOKEN = 1  # Gumbel noise of the emitted token (residual, bonus, or plain sample)
STREAM_DRAFT = 2  # Gumbel noise of the drafter's own sampling
STREAM_SEED = 3  # derives per-row seeds from one integer seed

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
MAX_OFFSET = 1 << 56

from .reference import derive_row_seeds, gumbel, philox, random_bits, uniform, uniform_open  # noqa: E402

__all__ = [
    "STREAM_ACCEPT", "STREAM_TOKEN", "STREAM_DRAFT", "STREAM_SEED", "MAX_OFFSET",
    "philox", "random_bits", "uniform", "uniform_open", "gumbel", "derive_row_seeds",
]
