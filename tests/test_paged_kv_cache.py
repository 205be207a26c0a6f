"""PagedKVCache against a dense per-row model (a Python list of tensors per slot and layer) over
many random steps of admission, append, random acceptance (rollback), tree compaction, commit
and free; plus the block pool's accounting and its errors."""
import random

import pytest
import torch

from specdec_fast.runners.paged_cache import OutOfBlocksError, PagedKVCache
from tests.kernels.backends import TEST_DEVICE, kernel_backends

DEVICE = TEST_DEVICE  # the device fixture's value (tests/kernels/backends.py)


def _snapshot(cache: PagedKVCache):
    return (
        cache.kv.clone(), cache.block_table.clone(), cache.seq_lens.clone(), list(cache._free),
        [None if b is None else list(b) for b in cache._blocks],
    )


def _assert_same_state(cache: PagedKVCache, snap) -> None:
    kv, table, lens, free, blocks = snap
    # bit for bit: the pool is uninitialised, and a NaN there equals nothing, itself included
    assert torch.equal(cache.kv.view(torch.uint8), kv.view(torch.uint8))
    assert torch.equal(cache.block_table, table) and torch.equal(cache.seq_lens, lens)
    assert cache._free == free and cache._blocks == blocks


def _assert_pool_consistent(cache: PagedKVCache) -> None:
    owned = [blk for blocks in cache._blocks if blocks is not None for blk in blocks]
    assert len(owned) == len(set(owned)), "a block is owned twice"
    assert sorted(owned + cache._free) == list(range(cache.num_blocks)), "blocks leaked or duplicated"
    table = cache.block_table.cpu()
    for slot, blocks in enumerate(cache._blocks):
        row = table[slot].tolist()
        assert row == (blocks or []) + [-1] * (cache.max_blocks_per_row - len(blocks or []))


def _random_step_tokens(rng, cache, dense, budget, max_new):
    """New-token counts per slot (0 for free slots, ragged, bounded by each budget)."""
    counts = []
    for slot in range(cache.max_batch):
        if dense[slot] is None:
            counts.append(0)
        else:
            room = budget[slot] - dense[slot][0][0].shape[0]
            counts.append(rng.randint(0, min(max_new, room)))
    return counts


def _accepted_nodes(rng, count, tree):
    """The nodes a verify step keeps: a prefix (chain, possibly empty = full rollback), or for a tree
    the root plus an increasing subset of the other nodes."""
    if count == 0:
        return []
    if not tree:
        return list(range(rng.randint(0, count)))
    rest = sorted(rng.sample(range(1, count), rng.randint(0, count - 1)))
    return [0] + rest


def _run_simulation(backend, block_size, heads, dim, dtype, tree, steps, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_layers, max_batch, max_blocks, max_new = 2, 4, 5, 6
    cache = PagedKVCache(
        num_layers, heads, dim, num_blocks=10, block_size=block_size, max_batch=max_batch,
        max_blocks_per_row=max_blocks, dtype=dtype, device=DEVICE,
    )
    dense = [None] * max_batch  # per slot: [(K [n, Hkv, D], V [n, Hkv, D]) per layer]
    budget = [0] * max_batch
    saw = {"out_of_blocks": 0, "fragmented": 0, "rollback": 0}
    for _ in range(steps):
        for slot in range(max_batch):
            if dense[slot] is None and rng.random() < 0.5:
                want = rng.randint(1, max_blocks * block_size)
                snap = _snapshot(cache)
                try:
                    cache.admit(slot, want)
                except OutOfBlocksError as err:
                    assert f"needs {cache.blocks_needed(want)} blocks" in str(err) and f"only {cache.num_free_blocks} of 10" in str(err)
                    _assert_same_state(cache, snap)
                    saw["out_of_blocks"] += 1
                    continue
                blocks = cache.blocks_of(slot)
                saw["fragmented"] += blocks != list(range(blocks[0], blocks[0] + len(blocks)))
                empty = torch.empty(0, heads, dim, dtype=dtype)
                dense[slot], budget[slot] = [(empty, empty)] * num_layers, want
            elif dense[slot] is not None and (rng.random() < 0.15 or dense[slot][0][0].shape[0] == budget[slot]):
                cache.free(slot)
                dense[slot] = None
        _assert_pool_consistent(cache)

        counts = _random_step_tokens(rng, cache, dense, budget, max_new)
        padding = rng.randint(0, 2)  # tokens past cu[B] are ignored
        total = sum(counts) + padding
        cu = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
        new = [(torch.randn(total, heads, dim, generator=gen).to(dtype), torch.randn(total, heads, dim, generator=gen).to(dtype)) for _ in range(num_layers)]
        for layer, (k, v) in enumerate(new):
            cache.append(layer, k.to(DEVICE), v.to(DEVICE), cu.to(DEVICE), backend=backend)

        kept = [_accepted_nodes(rng, n, tree) for n in counts]
        saw["rollback"] += sum(len(k) < n for k, n in zip(kept, counts))
        if tree:
            paths = torch.full((max_batch, max_new), -1, dtype=torch.int32)
            for slot, nodes in enumerate(kept):
                paths[slot, : len(nodes)] = torch.tensor(nodes, dtype=torch.int32)
            cache.compact(paths.to(DEVICE), backend=backend)
        cache.commit(torch.tensor([len(k) for k in kept], dtype=torch.int32, device=DEVICE))
        for slot, nodes in enumerate(kept):
            if dense[slot] is None:
                continue
            rows = int(cu[slot]) + torch.tensor(nodes, dtype=torch.long)
            dense[slot] = [(torch.cat([dk, k[rows]]), torch.cat([dv, v[rows]])) for (dk, dv), (k, v) in zip(dense[slot], new)]

        for slot in range(max_batch):
            if dense[slot] is None:
                assert int(cache.seq_lens[slot]) == 0
                continue
            for layer in range(num_layers):
                k, v = cache.gather(layer, slot)
                assert torch.equal(k.cpu(), dense[slot][layer][0]) and torch.equal(v.cpu(), dense[slot][layer][1])

    for slot in range(max_batch):
        if cache.is_admitted(slot):
            cache.free(slot)
    assert cache.num_free_blocks == cache.num_blocks
    _assert_pool_consistent(cache)
    return saw


SIMULATIONS = [  # (block_size, Hkv, head_dim, dtype, tree)
    (16, 2, 64, torch.float16, True),
    (32, 1, 128, torch.bfloat16, False),
    (16, 8, 64, torch.float32, False),
    (32, 2, 64, torch.float32, True),
]


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("block_size,heads,dim,dtype,tree", SIMULATIONS)
def test_cache_matches_dense_model_over_random_steps(backend, block_size, heads, dim, dtype, tree):
    saw = _run_simulation(backend, block_size, heads, dim, dtype, tree, steps=25, seed=1)
    # the random walk really exercised the hard parts
    assert saw["rollback"] > 0 and saw["out_of_blocks"] > 0 and saw["fragmented"] > 0, saw


def _small_cache(**kw):
    args = dict(num_blocks=6, block_size=16, max_batch=3, max_blocks_per_row=4, dtype=torch.float32, device=DEVICE)
    args.update(kw)
    return PagedKVCache(2, 2, 8, **args)


def test_out_of_blocks_changes_nothing_and_others_keep_working():
    cache = _small_cache()
    cache.admit(0, 40)  # 3 blocks
    cache.append(0, torch.ones(5, 2, 8, device=DEVICE), torch.ones(5, 2, 8, device=DEVICE), torch.tensor([0, 5, 5, 5], dtype=torch.int32, device=DEVICE))
    cache.commit(torch.tensor([5, 0, 0], dtype=torch.int32, device=DEVICE))
    snap = _snapshot(cache)
    with pytest.raises(OutOfBlocksError, match=r"needs 4 blocks .* only 3 of 6 blocks are free"):
        cache.admit(1, 64)
    _assert_same_state(cache, snap)
    with pytest.raises(OutOfBlocksError, match="needs 4 blocks"):  # all or nothing: slot 1 alone would fit
        cache.admit_batch([1, 2], [16, 48])
    _assert_same_state(cache, snap)
    cache.admit(1, 48)  # exactly the 3 free blocks
    assert cache.num_free_blocks == 0
    assert torch.equal(cache.gather(0, 0)[0].cpu(), torch.ones(5, 2, 8))
    cache.free(0)
    cache.free(1)
    assert cache.num_free_blocks == 6
    _assert_pool_consistent(cache)


def test_free_then_readmit_gets_scattered_blocks_and_keeps_data():
    cache = _small_cache(num_blocks=8, max_blocks_per_row=4)
    cache.admit_batch([0, 1, 2], [32, 32, 32])  # blocks 0-1, 2-3, 4-5
    cache.free(1)  # frees 2, 3
    cache.admit(1, 64)  # 4 blocks: the freed 2, 3 and then 6, 7
    blocks = cache.blocks_of(1)
    assert sorted(blocks) == [2, 3, 6, 7] and blocks != list(range(blocks[0], blocks[0] + 4))
    k = torch.randn(50, 2, 8, device=DEVICE)
    cache.append(1, k, -k, torch.tensor([0, 0, 50, 50], dtype=torch.int32, device=DEVICE))
    cache.commit(torch.tensor([0, 50, 0], dtype=torch.int32, device=DEVICE))
    got_k, got_v = cache.gather(1, 1)
    assert torch.equal(got_k, k) and torch.equal(got_v, -k)
    assert cache.gather(0, 1)[0].shape == (50, 2, 8) and cache.gather(1, 0)[0].shape == (0, 2, 8)


def test_batched_admission_and_release_in_any_slot_order():
    """admit_batch / free_batch write their rows at once (a copy at admission, a fill at release;
    contiguous slots from 0 on views, others through an index): each slot's table row and length
    as slot-by-slot admission and free gave, the other slots' untouched."""
    cache = _small_cache(num_blocks=12, max_blocks_per_row=4, max_batch=4)
    cache.admit_batch([2, 0], [40, 16])  # slot 2: blocks 0-2, slot 0: block 3
    assert cache.blocks_of(2) == [0, 1, 2] and cache.blocks_of(0) == [3] and not cache.is_admitted(1)
    cache.commit(torch.tensor([4, 0, 7, 0], dtype=torch.int32, device=DEVICE))
    _assert_pool_consistent(cache)
    snap = _snapshot(cache)
    with pytest.raises(ValueError, match="slot 1 is not admitted"):  # all or none
        cache.free_batch([2, 1])
    with pytest.raises(ValueError, match="slots must be distinct"):
        cache.free_batch([2, 2])
    _assert_same_state(cache, snap)
    cache.admit_batch([1, 3], [20, 20])  # the next blocks on the stack: 4-5 and 6-7
    assert cache.blocks_of(1) == [4, 5] and cache.blocks_of(3) == [6, 7]
    assert cache.seq_lens.tolist() == [4, 0, 7, 0]  # only the admitted slots' lengths reset
    cache.free_batch([2])
    assert cache.block_table[2].tolist() == [-1] * 4 and cache.seq_lens.tolist() == [4, 0, 0, 0]
    _assert_pool_consistent(cache)
    cache.free_all()
    assert cache.num_free_blocks == 12 and (cache.block_table == -1).all() and (cache.seq_lens == 0).all()
    cache.admit_batch([0, 1, 2, 3], [16, 16, 16, 16])  # every slot again, from the refilled stack
    assert cache.seq_lens.tolist() == [0, 0, 0, 0] and cache.num_free_blocks == 8
    _assert_pool_consistent(cache)
    cache.free_all()
    cache.free_all()  # nothing admitted: nothing to do
    assert cache.num_free_blocks == 12


def test_views_share_storage_with_the_one_kv_tensor():
    cache = _small_cache()
    k, v = cache.k_cache(1), cache.v_cache(1)
    assert k.shape == v.shape == (6, 16, 2, 8) and k.is_contiguous() and v.is_contiguous()
    assert k.data_ptr() == cache.kv[1, 0].data_ptr() and v.data_ptr() == cache.kv[1, 1].data_ptr()
    assert cache.block_table.shape == (3, 4) and cache.block_table.dtype == torch.int32
    assert cache.seq_lens.shape == (3,) and cache.seq_lens.dtype == torch.int32


def test_admission_and_commit_errors():
    cache = _small_cache()
    with pytest.raises(ValueError, match="more than max_blocks_per_row = 4"):
        cache.admit(0, 65)
    with pytest.raises(ValueError, match="slot must be an int in"):
        cache.admit(3, 10)
    with pytest.raises(ValueError, match="num_tokens_budget must be an int >= 1"):
        cache.admit(0, 0)
    cache.admit(0, 10)
    with pytest.raises(ValueError, match="slot 0 is already admitted"):
        cache.admit(0, 10)
    with pytest.raises(ValueError, match="slots must be distinct"):
        cache.admit_batch([1, 1], [10, 10])
    with pytest.raises(ValueError, match="slot 1 is not admitted"):
        cache.free(1)
    with pytest.raises(ValueError, match=r"n_emitted must be int32 \[max_batch\]"):
        cache.commit(torch.ones(3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(TypeError, match="n_emitted must be a torch.Tensor"):
        cache.commit([1, 0, 0])
    with pytest.raises(ValueError, match="layer must be an int in"):
        cache.k_cache(2)
    with pytest.raises(TypeError, match="dtype must be"):
        _small_cache(dtype=torch.int8)
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        _small_cache(block_size=0)


@pytest.mark.gpu
def test_decoding_loop_ops_never_sync():
    """append / compact / commit with check=False run under sync_debug_mode('error')."""
    cache = _small_cache(device="cuda")
    cache.admit_batch([0, 1, 2], [30, 20, 10])
    cu = torch.tensor([0, 4, 4, 7], dtype=torch.int32, device="cuda")
    paths = torch.tensor([[0, 2, 3, -1], [-1] * 4, [0, 1, -1, -1]], dtype=torch.int32, device="cuda")
    k = torch.randn(7, 2, 8, device="cuda")
    emitted = torch.tensor([3, 0, 2], dtype=torch.int32, device="cuda")
    cache.append(0, k, k, cu)  # compile outside the checked region
    cache.compact(paths)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for layer in range(2):
            cache.append(layer, k, k, cu)
        cache.compact(paths)
        cache.commit(emitted)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert cache.seq_lens.tolist() == [3, 0, 2]
    assert torch.equal(cache.gather(1, 0)[0], k[[0, 2, 3]])


def test_a_ring_cache_repeats_its_blocks_along_each_row():
    """ring_blocks=R: a row holds min(its blocks, R) physical blocks, its table repeats them (logical
    block j -> blocks[j % R]); admission counts the held blocks; free returns them."""
    cache = PagedKVCache(1, 1, 4, num_blocks=5, block_size=2, max_batch=3, max_blocks_per_row=6, dtype=torch.float32,
                         ring_blocks=2)
    cache.admit_batch([0, 1], [11, 3])  # 6 logical blocks -> 2 held; 2 logical blocks -> 2 held
    blocks = cache.blocks_of(0)
    assert len(blocks) == 2 and cache.block_table[0].tolist() == blocks * 3
    assert cache.block_table[1].tolist()[:2] == cache.blocks_of(1) and cache.block_table[1].tolist()[2:] == [-1] * 4
    assert cache.num_free_blocks == 1
    with pytest.raises(OutOfBlocksError, match="needs 2 blocks"):
        cache.admit(2, 4)
    cache.free_all()
    assert cache.num_free_blocks == 5 and (cache.block_table == -1).all()
