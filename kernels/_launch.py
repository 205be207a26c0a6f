"""Plain-int helpers for computing launch grids on the host.

triton.next_power_of_2 and triton.cdiv are triton ConstexprFunction objects in triton 3.6:
called from Python each costs ~9 us (measured on the 2-core CI box, vs ~0.1 us for the int
expressions below), and a wrapper makes several calls per launch, every layer of every step.
"""


def next_pow2(x: int) -> int:
    """The smallest power of 2 >= x (1 for x <= 1)."""
    return 1 << max(0, (int(x) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Calls of up to this many tokens (a decode step's K + 1 <= 16) keep a tile of their own power of
# two; longer ones (prefill) share the largest: a kernel then compiles at most 5 + 1 tile
# variants whatever the prompt lengths (each new one is a compile inside a user's call: ~1 s
# per kernel on an H100).
DECODE_TOKENS = 16


def tile_of(n: int, cap: int) -> int:
    """Tokens (rows) per tile for a call of n: next_pow2(n) up to DECODE_TOKENS, else cap
    (both at most cap, at least 1)."""
    return max(1, min(next_pow2(n) if n <= DECODE_TOKENS else cap, cap))
