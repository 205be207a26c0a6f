"""CPU microbenchmarks of the paged-KV cache ops: the C++ backend against the torch reference.

    pytest bench/bench_cache_ops.py --benchmark-only --benchmark-group-by=group -p no:xdist

Each group times the same call on both backends side by side (a speed ratio, measured in one
run). Cases: a decode/verify step (8 rows x K+1 = 5 new tokens) and a 512-token prefill, for a
Llama-8B-like layer (8 KV heads x 128, bfloat16), and the tree compaction of all 32 layers.
"""
import pytest
import torch

from specdec_fast.kernels.cache_ops import append_kv, compact_kv
from tests.kernels.backends import kernel_backends

BACKENDS = [b for b in ("cpp", "torch") if b in kernel_backends()]
HEADS, DIM, BLOCK, DTYPE = 8, 128, 16, torch.bfloat16


def _table(rows: int, blocks_per_row: int) -> torch.Tensor:
    """Scattered blocks: row b owns blocks b, b + rows, b + 2 rows, ..."""
    return (torch.arange(blocks_per_row)[None, :] * rows + torch.arange(rows)[:, None]).int()


def _append_case(rows: int, new_per_row: int, prefix: int):
    gen = torch.Generator().manual_seed(0)
    blocks_per_row = (prefix + new_per_row + BLOCK - 1) // BLOCK
    num_blocks = rows * blocks_per_row
    caches = torch.zeros(2, num_blocks, BLOCK, HEADS, DIM, dtype=DTYPE)
    total = rows * new_per_row
    k_new = torch.randn(total, HEADS, DIM, generator=gen).to(DTYPE)
    v_new = torch.randn(total, HEADS, DIM, generator=gen).to(DTYPE)
    seq = torch.full((rows,), prefix, dtype=torch.int32)
    cu = torch.arange(0, total + 1, new_per_row, dtype=torch.int32)
    return k_new, v_new, caches, _table(rows, blocks_per_row), seq, cu


def _bench_append(benchmark, backend, rows, new_per_row, prefix):
    k_new, v_new, caches, table, seq, cu = _append_case(rows, new_per_row, prefix)
    expected = caches.clone()
    append_kv(k_new, v_new, expected[0], expected[1], table, seq, cu, backend="torch")
    benchmark(append_kv, k_new, v_new, caches[0], caches[1], table, seq, cu, backend=backend, check=False)
    assert torch.equal(caches, expected)  # the timed calls did the work


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.benchmark(group="append_kv decode: 8 rows x 5 new tokens after 100")
def test_bench_append_kv_decode(benchmark, backend):
    _bench_append(benchmark, backend, 8, 5, 100)  # the cost does not depend on the prefix


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.benchmark(group="append_kv prefill: 1 row x 512 tokens")
def test_bench_append_kv_prefill(benchmark, backend):
    _bench_append(benchmark, backend, 1, 512, 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.benchmark(group="compact_kv: 32 layers, 8 rows, path of 4 among 16 nodes")
def test_bench_compact_kv(benchmark, backend):
    rows, layers, prefix = 8, 32, 20  # the cost does not depend on the prefix: keep the cache small
    blocks_per_row = (prefix + 16 + BLOCK - 1) // BLOCK
    gen = torch.Generator().manual_seed(1)
    caches = torch.randn(layers, 2, rows * blocks_per_row, BLOCK, HEADS, DIM, generator=gen).to(DTYPE)
    table, seq = _table(rows, blocks_per_row), torch.full((rows,), prefix, dtype=torch.int32)
    paths = torch.tensor([[0, 5, 9, 12] + [-1] * 12] * rows, dtype=torch.int32)
    expected = caches.clone()
    compact_kv(expected, table, seq, paths, backend="torch")
    benchmark(compact_kv, caches, table, seq, paths, backend=backend, check=False)
    # sources (nodes 5, 9, 12) are never destinations (1, 2, 3): repeating the move changes nothing
    assert torch.equal(caches, expected)
