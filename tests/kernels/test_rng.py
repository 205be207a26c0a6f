"""The Philox stream: known-answer vectors, agreement with Triton's own Philox, float maps."""
import pytest
import torch

from specdec_fast.kernels.rng import STREAM_ACCEPT, STREAM_TOKEN, derive_row_seeds, random_bits, uniform, uniform_open
from specdec_fast.kernels.rng.reference import philox

from .backends import TEST_DEVICE

# Random123's known-answer vectors for philox4x32-10: (counter, key) -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    out = philox(*counter, *key)
    assert tuple(int(o) for o in out) == expected


def test_philox_matches_triton_randint4x():
    import triton
    import triton.language as tl

    @triton.jit
    def draws(out_ptr, seed, N: tl.constexpr):
        offs = tl.arange(0, N)
        a, b, c, d = tl.randint4x(seed, offs)
        tl.store(out_ptr + offs, a.to(tl.int64) & 0xFFFFFFFF)
        tl.store(out_ptr + N + offs, d.to(tl.int64) & 0xFFFFFFFF)

    device = TEST_DEVICE  # triton's own tl.randint4x: compiled on a GPU, interpreted elsewhere
    seed = 0x1234567890AB
    out = torch.zeros(2 * 64, dtype=torch.int64, device=device)
    draws[(1,)](out, seed, 64)
    a, _, _, d = philox(torch.arange(64, device=device), 0, 0, 0, seed & 0xFFFFFFFF, seed >> 32)
    assert torch.equal(a, out[:64]) and torch.equal(d, out[64:])


def test_float_maps_are_exact_and_in_range():
    bits = torch.tensor([0, 255, 256, 0xFFFFFFFF, 0x80000000], dtype=torch.int64)
    u = uniform(bits)
    assert u.tolist() == [0.0, 0.0, 2.0**-24, 1 - 2.0**-24, 0.5]
    uo = uniform_open(bits)
    assert bool((uo > 0).all()) and bool((uo < 1).all())
    assert uo.tolist()[0] == 2.0**-24 and uo.tolist()[3] == 1 - 2.0**-24


def test_streams_positions_offsets_and_rows_are_distinct_and_uniform():
    seeds = derive_row_seeds(7, 4)
    assert len(set(seeds.tolist())) == 4
    assert torch.equal(seeds, derive_row_seeds(7, 4)) and not torch.equal(seeds, derive_row_seeds(8, 4))
    v = torch.arange(20000)
    base = random_bits(seeds[0], 5, 3, STREAM_TOKEN, v)
    for other in (
        random_bits(seeds[1], 5, 3, STREAM_TOKEN, v),
        random_bits(seeds[0], 6, 3, STREAM_TOKEN, v),
        random_bits(seeds[0], 5, 4, STREAM_TOKEN, v),
        random_bits(seeds[0], 5, 3, STREAM_ACCEPT, v),
        random_bits(seeds[0], 5 + (1 << 32), 3, STREAM_TOKEN, v),
    ):
        assert (base != other).float().mean() > 0.999
    u = uniform(base)
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005


def test_ints_become_tensors_on_the_tensors_device(device):
    """philox / random_bits / derive_row_seeds with Python ints next to device tensors: every
    result on that device and equal to the all-CPU values (the H100 bug: CPU ints met CUDA seeds)."""
    rows = torch.arange(5)
    cpu = philox(rows, 0, 7, 3, 11, 12)
    on_device = philox(rows.to(device), 0, 7, 3, 11, 12)
    assert all(t.device == torch.device(rows.to(device).device) for t in on_device)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, on_device))
    seeds = torch.tensor([5, -6, 2**62])
    bits = random_bits(seeds.to(device), 9, 4, STREAM_TOKEN, torch.arange(7).to(device)[:, None])
    assert torch.equal(bits.cpu(), random_bits(seeds, 9, 4, STREAM_TOKEN, torch.arange(7)[:, None]))
    for seed in (0, 1, -1, 2**63 - 1, -(2**63)):
        derived = derive_row_seeds(seed, 6, device)
        assert derived.device.type == torch.device(device).type
        assert torch.equal(derived.cpu(), derive_row_seeds(seed, 6, "cpu"))


def test_derived_row_seeds_known_values():
    """Pinned per-row seeds (computed at 3dca4fa, before the device fix; unchanged by it): the
    stream every int seed starts from, so a change to derive_row_seeds (or to its Triton twin,
    tested against it) cannot pass unnoticed."""
    assert derive_row_seeds(0, 3).tolist() == [-2927653181729331716, 4162233197989878834, 4922499534773845499]
    assert derive_row_seeds(-1, 3).tolist() == [-1268690070104969643, 1301691797937096049, 7784407779070555179]
    assert derive_row_seeds(12345, 2).tolist() == [-2657684591914645978, -7597730760278538895]
