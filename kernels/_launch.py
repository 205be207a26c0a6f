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
