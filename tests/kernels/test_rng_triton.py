"""The Triton Philox device functions (kernels/rng/triton.py) against the torch spec, bit for bit."""
import pytest
import torch

from specdec_fast.kernels.rng import STREAM_ACCEPT, STREAM_DRAFT, STREAM_SEED, STREAM_TOKEN
from specdec_fast.kernels.rng.reference import gumbel, philox, random_bits, uniform, uniform_open

triton = pytest.importorskip("triton")
tl = triton.language

from specdec_fast.kernels.rng.triton import (  # noqa: E402
    gumbel_from_bits, philox_bits, uniform_from_bits, uniform_open_from_bits,
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


def test_known_answer_counter_through_the_key_layout(device):
    """Random123 KAT: counter (0,0,0,0), key (0,0) -> 0x6627E8D5 as the first word."""
    zero = torch.zeros(1, dtype=torch.int64)
    bits, *_ = _draw(zero, zero, zero, zero, zero, device)
    assert int(bits[0]) == 0x6627E8D5
    # counter (0xFFFFFFFF,)*4, key (0xFFFFFFFF,)*2: seed -1, offset 2**56-1 with stream 0xFF
    # gives c2 = c3 = 0xFFFFFFFF, position and vocab 0xFFFFFFFF -> 0x408F276D.
    ones = torch.tensor([2**32 - 1], dtype=torch.int64)
    bits, *_ = _draw(torch.tensor([-1]), torch.tensor([2**56 - 1]), ones, torch.tensor([255]), ones, device)
    assert int(bits[0]) == 0x408F276D


@pytest.mark.parametrize("seed,offset,position,stream", [
    (0, 0, 0, STREAM_TOKEN), (-5, 2**33 + 9, 3, STREAM_ACCEPT), (2**62 + 11, 2**56 - 1, 2**32 - 1, STREAM_DRAFT),
])
def test_scalar_arguments_match_the_reference(seed, offset, position, stream, device):
    out = torch.empty(128, dtype=torch.int64, device=device)
    _scalar_key_kernel[(1,)](out, seed, offset, position, stream, BLOCK=128)
    v = torch.arange(128)
    expected = random_bits(torch.tensor(seed), torch.tensor(offset), position, stream, v)
    assert torch.equal(out.cpu(), expected)
    lo, _, _, _ = philox(v, position, offset & 0xFFFFFFFF, ((offset >> 32) << 8) | stream, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
    assert torch.equal(out.cpu(), lo)


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
