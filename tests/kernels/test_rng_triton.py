"""The Triton Philox device functions (kernels/rng/triton.py) against the torch spec, bit for bit."""
import pytest
import torch

from specdec_fast.kernels.rng import STREAM_ACCEPT, STREAM_DRAFT, STREAM_SEED, STREAM_TOKEN
from specdec_fast.kernels.rng.reference import gumbel, philox, random_bits, uniform, uniform_open

triton = pytest.importorskip("triton")
tl = triton.language

from specdec_fast.kernels.rng.triton import (  # noqa: E402
    exponential_from_bits, gumbel_from_bits, philox_bits, tile_bits, uniform_from_bits, uniform_open_from_bits,
)


@triton.jit
def _draw_kernel(seed_ptr, offset_ptr, position_ptr, stream_ptr, vocab_ptr,
                 bits_ptr, u_ptr, uo_ptr, g_ptr, n, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = idx < n
    seed = tl.load(seed_ptr + idx, mask=live, other=0)
    offset = tl.load(offset_ptr + idx, mask=live, other=0)
    position = tl.load(position_ptr + idx, mask=live, other=0)
    stream = tl.load(stream_ptr + idx, mask=live, other=0)
    vocab = tl.load(vocab_ptr + idx, mask=live, other=0)
    bits = philox_bits(seed, offset, position, stream, vocab)
    tl.store(bits_ptr + idx, bits.to(tl.int64) & 0xFFFFFFFF, mask=live)
    tl.store(u_ptr + idx, uniform_from_bits(bits), mask=live)
    tl.store(uo_ptr + idx, uniform_open_from_bits(bits), mask=live)
    tl.store(g_ptr + idx, gumbel_from_bits(bits), mask=live)


@triton.jit
def _scalar_key_kernel(bits_ptr, seed, offset, position, stream: tl.constexpr, BLOCK: tl.constexpr):
    """Scalar seed/offset/position arguments (as the verify kernels pass them), vector vocab."""
    v = tl.arange(0, BLOCK)
    tl.store(bits_ptr + v, philox_bits(seed, offset, position, stream, v).to(tl.int64) & 0xFFFFFFFF)


def _draw(seed, offset, position, stream, vocab, device):
    n = seed.numel()
    args = [t.to(device).contiguous() for t in (seed, offset, position, stream, vocab)]
    bits = torch.empty(n, dtype=torch.int64, device=device)
    u, uo, g = (torch.empty(n, dtype=torch.float32, device=device) for _ in range(3))
    block = 256
    _draw_kernel[(triton.cdiv(n, block),)](*args, bits, u, uo, g, n, BLOCK=block)
    return bits.cpu(), u.cpu(), uo.cpu(), g.cpu()


def _random_keys(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    seeds[:4] = torch.tensor([0, -1, -(2**63), 2**63 - 1])
    offsets = torch.randint(0, 2**56, (n,), generator=g, dtype=torch.int64)
    offsets[4:12] = torch.tensor([0, 1, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 7, 2**56 - 1, 12345])
    positions = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    positions[:6] = torch.tensor([0, 1, 7, 2**31 - 1, 2**31, 2**32 - 1])
    streams = torch.randint(0, 256, (n,), generator=g, dtype=torch.int64)
    streams[:4] = torch.tensor([STREAM_ACCEPT, STREAM_TOKEN, STREAM_DRAFT, STREAM_SEED])
    vocab = torch.randint(0, 2**31 - 1, (n,), generator=g, dtype=torch.int64)
    vocab[:5] = torch.tensor([0, 1, 31999, 151935, 2**31 - 1])
    return seeds, offsets, positions, streams, vocab


def test_bits_and_floats_match_the_reference_bit_for_bit(device):
    seeds, offsets, positions, streams, vocab = _random_keys(3000, seed=0)
    bits, u, uo, g = _draw(seeds, offsets, positions, streams, vocab, device)
    # random_bits takes one stream int: group by stream value.
    ref_bits = torch.empty_like(bits)
    for st in streams.unique().tolist():
        sel = streams == st
        ref_bits[sel] = random_bits(seeds[sel], offsets[sel], positions[sel], st, vocab[sel])
    assert torch.equal(bits, ref_bits)
    assert torch.equal(u, uniform(ref_bits))  # exact maps: equal as floats
    assert torch.equal(uo, uniform_open(ref_bits))
    # -log(-log(u)) goes through each platform's log: equal up to float32 rounding of log.
    torch.testing.assert_close(g, gumbel(ref_bits), rtol=2e-6, atol=2e-6)


@triton.jit
def _exponential_kernel(bits_ptr, e_ptr, g_ptr, n, BLOCK: tl.constexpr):
    idx = tl.arange(0, BLOCK)
    bits = tl.load(bits_ptr + idx, mask=idx < n, other=0).to(tl.uint32)
    tl.store(e_ptr + idx, exponential_from_bits(bits), mask=idx < n)
    tl.store(g_ptr + idx, gumbel_from_bits(bits), mask=idx < n)


def test_the_exponential_is_minus_log_of_the_open_uniform_and_its_inverse_stays_under_the_bound(device):
    """exponential_from_bits (the ratio-form Gumbel-max's E, kernels/verify/_triton_emit.py) is
    -log(uniform_open) and gumbel_from_bits is -log(E), over random words and the extremes; 1 / E
    stays below NOISE_RATIO_MAX, the emissions' skip bound, at the largest open uniform."""
    from specdec_fast.kernels.verify._triton_emit import NOISE_RATIO_MAX

    words = torch.randint(0, 2**32, (500,), generator=torch.Generator().manual_seed(5), dtype=torch.int64)
    words[:6] = torch.tensor([0, 1, 511, 512, 2**32 - 512, 2**32 - 1])  # the smallest and largest open uniforms
    e = torch.empty(500, dtype=torch.float32, device=device)
    g = torch.empty_like(e)
    _exponential_kernel[(1,)](words.to(device), e, g, 500, BLOCK=512)
    e, g = e.cpu(), g.cpu()
    torch.testing.assert_close(e, -torch.log(uniform_open(words)), rtol=2e-6, atol=0)
    torch.testing.assert_close(g, gumbel(words), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(g, -torch.log(e), rtol=2e-6, atol=2e-6)
    assert (e > 0).all() and float(e.max()) < 16.7
    assert float((1.0 / e).max()) < NOISE_RATIO_MAX.value / 1.9  # 2**24 (1 - 2**-25) at the largest uniform


def test_known_answer_counter_through_the_key_layout(device):
    """Random123 KATs through the key layout: vocab index v draws word v % 4 of counter word v // 4.
    Counter (0,0,0,0), key (0,0) -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8: vocab indices 0..3."""
    zero = torch.zeros(4, dtype=torch.int64)
    bits, *_ = _draw(zero, zero, zero, zero, torch.arange(4), device)
    assert [int(b) for b in bits] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    # counter (0xFFFFFFFF,)*4, key (0xFFFFFFFF,)*2 -> 408f276d 41c83b0e a20bc7c6 6d5451fd: seed -1, offset
    # 2**56-1 with stream 0xFF gives c2 = c3 = 0xFFFFFFFF, position 0xFFFFFFFF, vocab 4 * 0xFFFFFFFF + w.
    ones = torch.full((4,), 2**32 - 1, dtype=torch.int64)
    bits, *_ = _draw(torch.full((4,), -1), torch.full((4,), 2**56 - 1), ones, torch.full((4,), 255),
                     4 * ones + torch.arange(4), device)
    assert [int(b) for b in bits] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


@pytest.mark.parametrize("seed,offset,position,stream", [
    (0, 0, 0, STREAM_TOKEN), (-5, 2**33 + 9, 3, STREAM_ACCEPT), (2**62 + 11, 2**56 - 1, 2**32 - 1, STREAM_DRAFT),
])
def test_scalar_arguments_match_the_reference(seed, offset, position, stream, device):
    out = torch.empty(128, dtype=torch.int64, device=device)
    _scalar_key_kernel[(1,)](out, seed, offset, position, stream, BLOCK=128)
    v = torch.arange(128)
    expected = random_bits(torch.tensor(seed), torch.tensor(offset), position, stream, v)
    assert torch.equal(out.cpu(), expected)
    words = philox(v // 4, position, offset & 0xFFFFFFFF, ((offset >> 32) << 8) | stream, seed & 0xFFFFFFFF,
                   (seed >> 32) & 0xFFFFFFFF)  # vocab index v: word v % 4 of counter v // 4
    assert torch.equal(out.cpu(), torch.stack(words, 1)[torch.arange(128), v % 4])


@triton.jit
def _tile_kernel(bits_ptr, seed_ptr, offset_ptr, position_ptr, first, stream: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK_V: tl.constexpr):
    """A verify kernel's noise tile: rows [ROWS, 1] of (seed, offset, position), vocab first .. first + BLOCK_V - 1."""
    r = tl.arange(0, ROWS)
    idx = (first + tl.arange(0, BLOCK_V))[None, :]
    seed = tl.load(seed_ptr + r)[:, None]
    offset = tl.load(offset_ptr + r)[:, None]
    position = tl.load(position_ptr + r)[:, None]
    bits = tile_bits(seed, offset, position, stream, first, idx, BLOCK_V)
    tl.store(bits_ptr + r[:, None] * BLOCK_V + tl.arange(0, BLOCK_V)[None, :], bits.to(tl.int64) & 0xFFFFFFFF)


@pytest.mark.parametrize("block_v, first", [(64, 0), (64, 128256 - 64), (16, 2**31 - 16), (2, 6), (1, 5)])
def test_tile_draws_are_the_spec(block_v, first, device):
    """tile_bits (the emission's and tree_verify's noise): one Philox call per four indices where the
    tile allows (philox_bits_grouped), one per index below 4 values a tile; the spec's draws either way."""
    seeds, offsets, positions = (t[2:6] for t in _random_keys(16, seed=3)[:3])  # edge seeds, offsets, positions
    out = torch.empty(4, block_v, dtype=torch.int64, device=device)
    _tile_kernel[(1,)](out, *(t.to(device) for t in (seeds, offsets, positions)), first, STREAM_TOKEN, ROWS=4,
                       BLOCK_V=block_v)
    v = torch.arange(first, first + block_v)
    expected = random_bits(seeds[:, None], offsets[:, None], positions[:, None], STREAM_TOKEN, v[None, :])
    assert torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("batch", [1, 3, 16, 1500])
def test_derive_row_seeds_in_one_launch_matches_the_reference(batch, device):
    """The CUDA path of an int seed (kernels/sampling_params.row_seeds): bit for bit the spec, for
    seeds at the int32 / int64 edges (one compiled variant: the seed is not specialised)."""
    from specdec_fast.kernels.rng import derive_row_seeds
    from specdec_fast.kernels.rng.triton import derive_row_seeds_triton

    for seed in (0, 1, 16, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 0x1234567890ABCDEF):
        got = derive_row_seeds_triton(seed, batch, device)
        assert got.dtype == torch.int64 and torch.equal(got.cpu(), derive_row_seeds(seed, batch, "cpu")), seed


@pytest.mark.slow
def test_row_seed_kernel_compiles_for_sm90_with_one_key_for_every_seed():
    """The real compiler (the interpreter never compiles) and Triton's real binder: the seed argument
    is int64 and not specialised, so no seed value can compile a new variant inside a capture."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("triton without its nvidia backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_compile_rng_kernels.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "one key for every seed" in done.stdout and "compiled _derive_row_seeds_kernel" in done.stdout
