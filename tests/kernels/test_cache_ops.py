"""append_kv and compact_kv: the reference against hand-worked slots, every backend against the
reference over awkward layouts (block sizes, GQA heads, head dims, dtypes, ragged counts incl. 0,
lengths ending mid-block, scattered blocks, strided inputs), and bad input."""
import pytest
import torch

from specdec_fast.kernels.cache_ops import append_kv, append_kv_reference, compact_kv, compact_kv_reference
from tests.kernels.backends import kernel_backends

BACKENDS = kernel_backends()


def _layout(gen, num_rows, max_blocks, num_blocks):
    """A block table whose rows own disjoint, shuffled (non-contiguous) physical blocks; -1 elsewhere."""
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((num_rows, max_blocks), -1, dtype=torch.int32)
    used = 0
    for b in range(num_rows):
        n = int(torch.randint(1, max_blocks + 1, (1,), generator=gen))
        n = min(n, num_blocks - used)
        table[b, :n] = perm[used:used + n].int()
        used += n
    return table


def _case(gen, block_size, heads, dim, counts, num_blocks=None, max_blocks=4):
    """seq_lens / cu_query_lens for new-token ``counts`` that fit each row's reserved blocks."""
    num_rows = len(counts)
    num_blocks = num_blocks or num_rows * max_blocks + 3
    while True:
        table = _layout(gen, num_rows, max_blocks, num_blocks)
        reserved = (table >= 0).sum(1) * block_size
        if all(int(reserved[b]) >= counts[b] for b in range(num_rows)):
            break
    seq = torch.tensor([int(torch.randint(0, int(reserved[b]) - counts[b] + 1, (1,), generator=gen)) for b in range(num_rows)], dtype=torch.int32)
    cu = torch.tensor([0] + list(torch.tensor(counts).cumsum(0).tolist()), dtype=torch.int32)
    return table, seq, cu, num_blocks


def _dense(gen, shape, dtype):
    return torch.randn(shape, generator=gen).to(dtype)


# (block_size, Hkv, head_dim, dtype): every value of each axis appears; the interpreter stays fast.
LAYOUTS = [
    (16, 1, 64, torch.float16),
    (16, 2, 128, torch.bfloat16),
    (16, 8, 64, torch.float32),
    (32, 1, 128, torch.float32),
    (32, 2, 64, torch.float16),
    (32, 8, 128, torch.bfloat16),
]


def test_append_reference_by_hand():
    """Positions follow block_table exactly: row 0 at pos 3..5 in blocks [2, 0], block_size 4."""
    k_cache = torch.zeros(3, 4, 1, 1)
    v_cache = torch.zeros(3, 4, 1, 1)
    table = torch.tensor([[2, 0], [1, -1]], dtype=torch.int32)
    seq = torch.tensor([3, 1], dtype=torch.int32)
    cu = torch.tensor([0, 3, 4], dtype=torch.int32)
    k_new = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(4, 1, 1)
    append_kv_reference(k_new, -k_new, k_cache, v_cache, table, seq, cu)
    expected = torch.zeros(3, 4)
    expected[2, 3] = 1.0  # row 0 pos 3 -> block 2 offset 3
    expected[0, 0], expected[0, 1] = 2.0, 3.0  # pos 4, 5 -> block 0 offsets 0, 1
    expected[1, 1] = 4.0  # row 1 pos 1 -> block 1 offset 1
    assert torch.equal(k_cache.view(3, 4), expected)
    assert torch.equal(v_cache.view(3, 4), -expected)


def test_compact_reference_gathers_before_scattering():
    """Overlapping moves read old values: path [0, 2, 3] of nodes at seq_len 5, block_size 2."""
    caches = torch.arange(2 * 2 * 6 * 2, dtype=torch.float32).view(2, 2, 6, 2, 1, 1)
    table = torch.tensor([[4, 1, 5, 0, 2]], dtype=torch.int32)
    seq = torch.tensor([5], dtype=torch.int32)
    pos_values = lambda c: [float(c[l, kv].reshape(-1)[int(table[0, p // 2]) * 2 + p % 2]) for l in range(2) for kv in range(2) for p in range(5, 10)]
    before = pos_values(caches)
    compact_kv_reference(caches, table, seq, torch.tensor([[0, 2, 3, -1, 1]], dtype=torch.int32))
    after = pos_values(caches)
    for plane in range(4):
        old, new = before[plane * 5:plane * 5 + 5], after[plane * 5:plane * 5 + 5]
        assert new == [old[0], old[2], old[3], old[3], old[4]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size,heads,dim,dtype", LAYOUTS)
def test_append_matches_reference(backend, block_size, heads, dim, dtype, device):
    gen = torch.Generator().manual_seed(block_size * 1000 + heads * 10 + dim)
    counts = [5, 0, block_size + 3, 1]  # ragged, an empty row, crossing a block boundary
    table, seq, cu, num_blocks = _case(gen, block_size, heads, dim, counts)
    total = int(cu[-1])
    # k_new/v_new as strided views of a fused [T + 2 padding, 3, Hkv, D] buffer (qkv-like).
    fused = _dense(gen, (total + 2, 3, heads, dim), dtype)
    k_new, v_new = fused[:, 1], fused[:, 2]
    cache = _dense(gen, (2, num_blocks, block_size, heads, dim), dtype)
    expected = cache.clone()
    append_kv_reference(k_new, v_new, expected[0], expected[1], table, seq, cu)
    got = cache.clone().to(device)
    append_kv(k_new.to(device), v_new.to(device), got[0], got[1], table.to(device), seq.to(device), cu.to(device), backend=backend)
    assert torch.equal(got.cpu(), expected)
    # every new token landed where the reference put it, and nothing else moved
    assert int((expected != cache).any(-1).any(-1).sum()) > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_append_drops_unmapped_writes_without_check(backend, device):
    """check=False: positions past a row's blocks are dropped by every backend, as in the reference."""
    gen = torch.Generator().manual_seed(7)
    table = torch.tensor([[3, -1], [0, 1]], dtype=torch.int32)
    seq = torch.tensor([14, 30], dtype=torch.int32)
    cu = torch.tensor([0, 4, 7], dtype=torch.int32)  # row 0 runs past block 3 into "-1"; row 1 past the table
    cache = _dense(gen, (2, 4, 16, 2, 8), torch.float32)
    k_new, v_new = _dense(gen, (7, 2, 8), torch.float32), _dense(gen, (7, 2, 8), torch.float32)
    expected = cache.clone()
    append_kv_reference(k_new, v_new, expected[0], expected[1], table, seq, cu)
    assert torch.equal(expected[0, 3, 14:], k_new[:2]) and torch.equal(expected[0, 0, :], cache[0, 0, :])
    got = cache.clone().to(device)
    append_kv(k_new.to(device), v_new.to(device), got[0], got[1], table.to(device), seq.to(device), cu.to(device), backend=backend, check=False)
    assert torch.equal(got.cpu(), expected)
    with pytest.raises(ValueError, match="outside its block_table"):
        append_kv(k_new, v_new, cache[0], cache[1], table, seq, cu, backend="torch")


def _random_paths(gen, num_rows, path_len, kind):
    rows = []
    for row in range(num_rows):
        length = path_len if row == 0 else int(torch.randint(0, path_len + 1, (1,), generator=gen))
        if kind == "tree":  # node 0 (the root) then increasing node indices, as a verified tree path
            nodes = [0] + sorted(torch.randperm(2 * path_len - 1, generator=gen)[: max(length - 1, 0)].add(1).tolist())
            nodes = nodes[:length]
        elif kind == "chain":  # already contiguous: nothing moves
            nodes = list(range(length))
        else:  # any mapping, overlaps and repeats included
            nodes = torch.randint(0, 2 * path_len, (length,), generator=gen).tolist()
        rows.append(nodes + [-1] * (path_len - length))
    return torch.tensor(rows, dtype=torch.int32).view(num_rows, path_len)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["tree", "chain", "any"])
@pytest.mark.parametrize("block_size,heads,dim,dtype", LAYOUTS[::2] + LAYOUTS[1::4])
def test_compact_matches_reference(backend, kind, block_size, heads, dim, dtype, device):
    gen = torch.Generator().manual_seed(block_size + heads + dim + len(kind))
    path_len, num_rows, num_layers = 6, 3, 2
    table, seq, _, num_blocks = _case(gen, block_size, heads, dim, [2 * path_len] * num_rows, max_blocks=3)
    paths = _random_paths(gen, num_rows, path_len, kind)
    paths[1, 2:] = paths[1, 2:].clamp(min=0)  # entries after row 1's first -1 (if any) are junk to ignore
    paths[1, 1] = -1
    caches = _dense(gen, (num_layers, 2, num_blocks, block_size, heads, dim), dtype)
    expected = caches.clone()
    compact_kv_reference(expected, table, seq, paths)
    assert torch.equal(expected, caches) == (kind == "chain")  # a chain path is already in place
    got = caches.clone().to(device)
    compact_kv(got, table.to(device), seq.to(device), paths.to(device), backend=backend)
    assert torch.equal(got.cpu(), expected)


def test_compact_long_path_crossing_blocks(device):
    """A path longer than a block, nodes spread over three blocks, every backend equal."""
    gen = torch.Generator().manual_seed(3)
    table = torch.tensor([[6, 2, 9, 4]], dtype=torch.int32)
    seq = torch.tensor([13], dtype=torch.int32)
    paths = torch.tensor([[0, 1, 4, 7, 8, 11, 12, 15, 17, 18, -1, -1]], dtype=torch.int32)
    caches = _dense(gen, (1, 2, 10, 16, 2, 64), torch.float16)
    expected = caches.clone()
    compact_kv_reference(expected, table, seq, paths)
    for backend in BACKENDS:
        got = caches.clone().to(device)
        compact_kv(got, table.to(device), seq.to(device), paths.to(device), backend=backend)
        assert torch.equal(got.cpu(), expected), backend
    flat = caches[0, 0].reshape(-1, 2, 64)
    slot = lambda p: int(table[0, p // 16]) * 16 + p % 16
    assert torch.equal(expected[0, 0].reshape(-1, 2, 64)[slot(13 + 3)], flat[slot(13 + 7)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_wide_slots_split_into_column_chunks(backend, device):
    """Hkv * D = 8192 > one Triton tile: several column programs per token / per path."""
    gen = torch.Generator().manual_seed(5)
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    seq, cu = torch.tensor([13], dtype=torch.int32), torch.tensor([0, 6], dtype=torch.int32)
    caches = _dense(gen, (1, 2, 3, 16, 64, 128), torch.float16)
    k_new, v_new = _dense(gen, (6, 64, 128), torch.float16), _dense(gen, (6, 64, 128), torch.float16)
    paths = torch.tensor([[0, 2, 5, -1]], dtype=torch.int32)
    expected = caches.clone()
    append_kv_reference(k_new, v_new, expected[0, 0], expected[0, 1], table, seq, cu)
    compact_kv_reference(expected, table, seq, paths)
    got = caches.clone().to(device)
    table, seq, cu = table.to(device), seq.to(device), cu.to(device)
    append_kv(k_new.to(device), v_new.to(device), got[0, 0], got[0, 1], table, seq, cu, backend=backend)
    compact_kv(got, table, seq, paths.to(device), backend=backend)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_append_many_rows_with_strided_index_tensors(backend, device):
    """37 rows (several token programs search the row table), seq_lens a strided column and
    block_table a column slice of a wider table."""
    gen = torch.Generator().manual_seed(9)
    counts = torch.randint(0, 4, (37,), generator=gen).tolist()
    table, seq, cu, num_blocks = _case(gen, 16, 2, 32, counts, max_blocks=2)
    wide = torch.full((37, 5), 7, dtype=torch.int32)
    wide[:, 1:3] = table
    pairs = torch.stack([seq, seq + 100], 1)
    cache = _dense(gen, (2, num_blocks, 16, 2, 32), torch.bfloat16)
    k_new, v_new = _dense(gen, (int(cu[-1]), 2, 32), torch.bfloat16), _dense(gen, (int(cu[-1]), 2, 32), torch.bfloat16)
    expected = cache.clone()
    append_kv_reference(k_new, v_new, expected[0], expected[1], table, seq, cu)
    got = cache.clone().to(device)
    wide, pairs = wide.to(device), pairs.to(device)
    append_kv(k_new.to(device), v_new.to(device), got[0], got[1], wide[:, 1:3], pairs[:, 0], cu.to(device), backend=backend)
    assert torch.equal(got.cpu(), expected)


def _good_append_args():
    k = torch.zeros(3, 2, 8)
    cache = torch.zeros(4, 16, 2, 8)
    return dict(
        k_new=k, v_new=k.clone(), k_cache=cache, v_cache=cache.clone(),
        block_table=torch.zeros(2, 2, dtype=torch.int32), seq_lens=torch.zeros(2, dtype=torch.int32),
        cu_query_lens=torch.tensor([0, 1, 3], dtype=torch.int32),
    )


@pytest.mark.parametrize(
    "change,error,match",
    [
        (dict(k_new=[1.0]), TypeError, "k_new must be a torch.Tensor"),
        (dict(k_new=torch.zeros(3, 2, 8, dtype=torch.float16)), TypeError, "k_new dtype"),
        (dict(v_new=torch.zeros(3, 2, 4)), ValueError, "v_new"),
        (dict(k_cache=torch.zeros(4, 16, 2, 8, dtype=torch.int32), v_cache=torch.zeros(4, 16, 2, 8, dtype=torch.int32)), TypeError, "k_cache must be float32"),
        (dict(v_cache=torch.zeros(4, 16, 2, 16)[..., :8]), ValueError, "v_cache shape|contiguous"),
        (dict(k_cache=torch.zeros(4, 2, 16, 8).transpose(1, 2), v_cache=torch.zeros(4, 2, 16, 8).transpose(1, 2)), ValueError, "contiguous"),
        (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "block_table must be torch.int32"),
        (dict(seq_lens=torch.zeros(3, dtype=torch.int32)), ValueError, "seq_lens"),
        (dict(cu_query_lens=torch.tensor([0, 1, 3])), TypeError, "cu_query_lens must be torch.int32"),
        (dict(cu_query_lens=torch.tensor([0, 2, 1], dtype=torch.int32)), ValueError, "cu_query_lens must start at 0"),
        (dict(cu_query_lens=torch.tensor([0, 1, 4], dtype=torch.int32)), ValueError, "end <= T"),
        (dict(seq_lens=torch.tensor([0, -1], dtype=torch.int32)), ValueError, "seq_lens must be >= 0"),
        (dict(seq_lens=torch.tensor([0, 31], dtype=torch.int32)), ValueError, "outside its block_table"),
        (dict(block_table=torch.tensor([[0, 1], [4, 2]], dtype=torch.int32)), ValueError, "maps to block 4"),
    ],
)
def test_append_bad_input(change, error, match):
    args = _good_append_args()
    args.update(change)
    with pytest.raises(error, match=match):
        append_kv(**args, backend="torch")


def test_append_rejects_unknown_backend_and_mixed_devices():
    with pytest.raises(ValueError, match="backend"):
        append_kv(**_good_append_args(), backend="cuda")
    args = _good_append_args()
    args["k_new"] = args["k_new"].to("meta")  # any second device (meta exists everywhere)
    with pytest.raises(ValueError, match="k_new is on meta"):
        append_kv(**args)


@pytest.mark.parametrize(
    "change,error,match",
    [
        (dict(caches=torch.zeros(2, 3, 4, 16, 2, 8)), ValueError, r"caches must be \[num_layers, 2"),
        (dict(caches=torch.zeros(4, 16, 2, 8)), ValueError, "caches must have 6 dims"),
        (dict(caches=torch.zeros(2, 2, 4, 16, 8, 2).transpose(-1, -2)), ValueError, "caches must be contiguous"),
        (dict(path_positions=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "path_positions must be torch.int32"),
        (dict(path_positions=torch.zeros(3, 3, dtype=torch.int32)), ValueError, "B = 3 rows"),
        (dict(path_positions=torch.tensor([[0, 40, -1], [-1, 0, 0]], dtype=torch.int32)), ValueError, "path source"),
        (dict(block_table=torch.tensor([[-1, 1], [2, 3]], dtype=torch.int32), seq_lens=torch.tensor([15, 0], dtype=torch.int32),
              path_positions=torch.tensor([[2, -1, -1], [0, 1, 5]], dtype=torch.int32)), ValueError, "destination"),
    ],
)
def test_compact_bad_input(change, error, match):
    args = dict(
        caches=torch.zeros(2, 2, 4, 16, 2, 8), block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        seq_lens=torch.zeros(2, dtype=torch.int32), path_positions=torch.tensor([[0, 2, -1], [0, 1, 5]], dtype=torch.int32),
    )
    args.update(change)
    with pytest.raises(error, match=match):
        compact_kv(**args, backend="torch")


@pytest.mark.gpu
def test_triton_ops_capture_in_a_cuda_graph():
    """One launch each, no host sync: capture append + compact once, replay with new values."""
    gen = torch.Generator().manual_seed(11)
    table, seq, cu, num_blocks = _case(gen, 16, 2, 64, [3, 0, 5, 2])
    caches = _dense(gen, (2, 2, num_blocks, 16, 2, 64), torch.float16).cuda()
    k_new = _dense(gen, (10, 2, 64), torch.float16).cuda()
    v_new = _dense(gen, (10, 2, 64), torch.float16).cuda()
    paths = torch.tensor([[0, 2, -1], [-1, -1, -1], [0, 1, 4], [0, -1, -1]], dtype=torch.int32).cuda()
    table, seq, cu = table.cuda(), seq.cuda(), cu.cuda()

    def step():
        for layer in range(2):
            append_kv(k_new, v_new, caches[layer, 0], caches[layer, 1], table, seq, cu, backend="triton", check=False)
        compact_kv(caches, table, seq, paths, backend="triton", check=False)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    start = caches.clone()
    with torch.cuda.graph(graph):
        step()
    caches.copy_(start)
    k_new.copy_(torch.randn_like(k_new))
    seq.add_(1)
    expected = caches.cpu().clone()
    for layer in range(2):
        append_kv_reference(k_new.cpu(), v_new.cpu(), expected[layer, 0], expected[layer, 1], table.cpu(), seq.cpu(), cu.cpu())
    compact_kv_reference(expected, table.cpu(), seq.cpu(), paths.cpu())
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(caches.cpu(), expected)
