"""paged_attention's chunked attention (Llama 4's RoPE layers: a query at position p sees keys from
(p // chunk) * chunk on) on every backend (torch reference, Triton, C++) against a float64 oracle
whose mask is built here from positions, independently of the reference: chunks of 1 to 64 over
pages of 4 and 16, chunk boundaries inside a row's new tokens, at its first new token and in its
prefix, rows of different lengths, 1 / 3 / 7 new tokens, the causal and the block mask, fp32 and
bf16, GQA groups of 2 and 3, a padded head dim; a forced Triton KV split and the C++ key ranges;
keys before a row's first chunk are never read (NaN there changes nothing); token trees (a node
and each of its ancestors at prefix + their depths: TREE_CASES, against tree_chunk_mask); the
controls (the chunk changes the output; every case hides a key; a tree's ancestors are placed by
their depths, not their slots) and the refusals (a window, a chunk that is not a positive int)."""
import zlib

import pytest
import torch

from specdec_fast.kernels.attention import paged_attention
from specdec_fast.kernels.attention.reference import visible_keys
from tests.kernels.attention_cases import make_case, sdpa_oracle
from tests.kernels.backends import kernel_backends

TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2}

# (seq_lens, query_lens, Hq, Hkv, head_dim, block_size, dtype, causal, chunk); positions p = prefix + i
CASES = {
    # every query sees itself alone
    "decode_chunk1_pages4": ([5, 17, 33], [1, 1, 1], 4, 2, 12, 4, torch.float32, True, 1),
    # prefixes 7 / 11 / 5: boundaries at 9 and 12, inside the new tokens
    "chain3_chunk3_inside_g3": ([10, 14, 8], [3, 3, 3], 3, 1, 12, 4, torch.bfloat16, True, 3),
    # prefixes 8 / 20 / 4 (multiples of 4): the first new token starts a chunk, and 12 / 24 / 4 follow
    "chain7_chunk4_at_first_new": ([15, 27, 7], [7, 7, 3], 4, 2, 12, 4, torch.float32, True, 4),
    # prefixes 11 / 26: the only boundaries (10, 25) lie in the prefix
    "chain3_chunk5_in_prefix": ([14, 29], [3, 3], 4, 2, 12, 4, torch.float32, True, 5),
    "block3_chunk5_in_prefix": ([14, 29], [3, 3], 4, 2, 12, 4, torch.bfloat16, False, 5),
    # the block mask: query i sees the row's new tokens after it, from its chunk's start
    "block7_chunk4_pages16": ([9, 30, 7], [7, 7, 7], 4, 2, 12, 16, torch.bfloat16, False, 4),
    # pages of 16: prefix 32 (a chunk and a page start at the first new token), prefix 14 (16 inside)
    "chain7_chunk16_pages16_g3": ([39, 21, 70], [7, 7, 1], 3, 1, 32, 16, torch.float32, True, 16),
    # the Triton kernel's KV chunk (64): prefix 123 crosses 128; prefix 59 sees its whole row
    "chain7_chunk64": ([130, 70, 60], [7, 3, 1], 4, 2, 12, 16, torch.bfloat16, True, 64),
    # prefix 190: rows 0-1 start at 96, rows 2-6 at 192, so one query tile's first keys lie more than a
    # Triton KV chunk (64) apart and every chunk between them needs the mask (wholly inside the prefix)
    "chain7_chunk96_tile_spans_kv_chunks": ([197, 45], [7, 3], 4, 2, 12, 16, torch.float32, True, 96),
    # four rows of different lengths, one of them only new tokens (prefix 0)
    "block_mixed_rows_chunk5": ([3, 12, 26, 41], [3, 1, 7, 3], 4, 2, 12, 4, torch.float32, False, 5),
    # a prompt: every token new, chunks of 4 over pages of 4
    "prefill20_chunk4": ([20, 33], [20, 13], 4, 2, 12, 4, torch.float32, True, 4),
}


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) % 10_000


def chunk_mask(prefix: int, n: int, length: int, causal: bool, chunk: int | None) -> torch.Tensor:
    """[n, length] bool, written out from positions: query i sits at p = prefix + i and sees key j
    iff j <= p (causal; the block mask: any j < length) and j >= (p // chunk) * chunk."""
    mask = torch.zeros(n, length, dtype=torch.bool)
    for i in range(n):
        p = prefix + i
        start = 0 if chunk is None else p - p % chunk
        for j in range(length):
            mask[i, j] = j >= start and (j <= p or not causal)
    return mask


def chunk_oracle(case, causal: bool, chunk: int | None) -> torch.Tensor:
    """attention_cases.sdpa_oracle (float64) under chunk_mask."""
    return sdpa_oracle(case, mask_of=lambda lo, hi, L: chunk_mask(L - (hi - lo), hi - lo, L, causal, chunk))


def _run(name, backend, device, **extra):
    seq, ql, hq, hkv, d, bs, dtype, causal, chunk = CASES[name]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, seed=_seed(name), device=device)
    out = paged_attention(*case.args(), max_query_len=case.max_query_len, causal=causal, chunk=chunk,
                          backend=backend, **extra)
    return case, out


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_oracle(name, backend, device):
    """Each backend, the torch reference included (the spec is checked too), against the oracle."""
    *_, dtype, causal, chunk = CASES[name]
    case, out = _run(name, backend, device)
    assert out.dtype == dtype and out.shape == case.q.shape
    torch.testing.assert_close(out.cpu().double(), chunk_oracle(case, causal, chunk), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("name", list(CASES))
def test_the_reference_mask_is_the_oracle_mask(name):
    """reference.visible_keys with a chunk, row by row, equals chunk_mask (padding aside)."""
    seq, ql, *_, causal, chunk = CASES[name]
    lengths, new = torch.tensor(seq), torch.tensor(ql)
    seen = visible_keys(new, lengths, max(ql), max(seq), None, causal, None, chunk)
    for b, (L, n) in enumerate(zip(seq, ql)):
        assert torch.equal(seen[b, :n, :L], chunk_mask(L - n, n, L, causal, chunk)), b


@pytest.mark.parametrize("name", list(CASES))
def test_controls_the_chunk_changes_the_output(name):
    """Every case's chunk hides a key its plain mask shows, and the output moves with it: a
    backend that ignored the chunk would fail test_matches_the_oracle."""
    seq, ql, *_, dtype, causal, chunk = CASES[name]
    assert any(not torch.equal(chunk_mask(L - n, n, L, causal, chunk), chunk_mask(L - n, n, L, causal, None))
               for L, n in zip(seq, ql))
    case, out = _run(name, "torch", "cpu")
    assert not torch.allclose(out.double(), chunk_oracle(case, causal, None), atol=TOL[dtype])


def test_the_table_covers_every_boundary_kind():
    """Some row of the table has a chunk boundary after its first new token, one at its first new
    token (past position 0), one only in its prefix; and pages of 4 and 16, N of 1, 3 and 7."""
    kinds = set()
    for seq, ql, *_, bs, dtype, causal, chunk in CASES.values():
        for L, n in zip(seq, ql):
            prefix = L - n
            if any((prefix + i) % chunk == 0 for i in range(1, n)):
                kinds.add("inside")
            if prefix > 0 and prefix % chunk == 0:
                kinds.add("first new")
            if prefix // chunk * chunk > 0 and (prefix + n - 1) // chunk == prefix // chunk and prefix % chunk:
                kinds.add("prefix only")
    assert kinds == {"inside", "first new", "prefix only"}
    assert {c[5] for c in CASES.values()} == {4, 16}
    assert {1, 3, 7} <= {n for c in CASES.values() for n in c[1]}
    assert {1, 3, 4, 5, 16, 64} <= {c[-1] for c in CASES.values()}


@pytest.mark.parametrize("backend", [b for b in kernel_backends() if b != "torch"])
@pytest.mark.parametrize("causal", [True, False])
def test_keys_before_the_first_chunk_are_not_read(causal, backend, device):
    """Positions before each row's first chunk (query 0's), rounded down to 64 (the widest KV
    chunk of either kernel), hold NaN: the kernels start each row's walk there, so the output
    stays the oracle's (the torch reference reads whole rows: a spec, not part of this check).
    Triton's masked loop would spread a NaN it read to the row (p = 0 times NaN in P V); the C++
    op also skips a chunk of keys none of a quad's rows sees after reading it, so there this
    checks the output only (its first_key is checked by the oracle tests: a start too late
    drops keys)."""
    chunk, seq, ql = 48, [200, 150], [7, 3]
    case = make_case(seq, ql, 4, 2, 12, 16, torch.float32, seed=4, device=device)
    expect = chunk_oracle(case, causal, chunk)
    table, page = case.block_table.cpu(), case.k_cache.shape[1]
    skipped_any = False
    for b, (length, n) in enumerate(zip(seq, ql)):
        skipped = (length - n) // chunk * chunk // 64 * 64
        skipped_any |= skipped > 0
        for pos in range(skipped):
            block = int(table[b, pos // page])
            case.k_cache[block, pos % page] = float("nan")
            case.v_cache[block, pos % page] = float("nan")
    assert skipped_any
    out = paged_attention(*case.args(), max_query_len=7, causal=causal, chunk=chunk, backend=backend)
    torch.testing.assert_close(out.cpu().double(), expect, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_triton_chunk_over_kv_splits(causal, device):
    """A forced KV split: the splits share the keys from each row's first chunk, some of them none."""
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton import paged_attention_triton

    case = make_case([500, 300, 40], [7, 1, 7], 4, 2, 12, 16, torch.float32, seed=8, device=device)
    out = paged_attention_triton(*case.args(), max_query_len=7, scale=12 ** -0.5, num_splits=4, min_split_tokens=64,
                                 causal=causal, chunk=96)
    torch.testing.assert_close(out.cpu().double(), chunk_oracle(case, causal, 96), atol=2e-4, rtol=2e-4)


def test_cpp_chunk_over_key_splits():
    """The C++ op's key ranges (more threads than tasks: the keys from each row's first chunk are
    cut into ranges and merged) give the oracle's values, and not bit for bit one thread's."""
    if "cpp" not in kernel_backends():
        pytest.skip("the C++ op is not tested here")
    case = make_case([2000, 700], [5, 1], 4, 1, 64, 16, torch.float32, seed=12)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(8)  # 2 tasks (rows x KV heads) for 8 threads: 4 key ranges each
        out = paged_attention(*case.args(), max_query_len=5, chunk=1100, backend="cpp")
        torch.set_num_threads(1)
        one = paged_attention(*case.args(), max_query_len=5, chunk=1100, backend="cpp")
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out.double(), chunk_oracle(case, True, 1100), atol=2e-4, rtol=2e-4)
    assert not torch.equal(out, one), "the split path was not taken"


BAD = {
    "chunk_zero": (dict(chunk=0), "chunk must be a positive int"),
    "chunk_negative": (dict(chunk=-4), "chunk must be a positive int"),
    "chunk_bool": (dict(chunk=True), "chunk must be a positive int"),
    "chunk_float": (dict(chunk=4.0), "chunk must be a positive int"),
    "chunk_and_window": (dict(chunk=4, window=8), "chunk and window"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_chunk(name):
    extra, match = BAD[name]
    extra = dict(extra)
    tree = extra.pop("tree", False)
    case = make_case([10, 7], [5, 2], 4, 2, 16, 4, torch.float32, tree=tree, seed=1)
    with pytest.raises(ValueError, match=match):
        paged_attention(*case.args(), max_query_len=5, tree_mask=case.tree_mask, **extra)


def test_the_kernels_refuse_a_chunk_with_a_window():
    """Below the dispatcher: the Triton wrapper (which passes the chunk as its window) and the C++
    op (called directly by the runners) refuse what paged_attention refuses."""
    case = make_case([10, 7], [5, 2], 4, 2, 16, 4, torch.float32, seed=1)
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton import paged_attention_triton

    with pytest.raises(ValueError, match="chunk"):
        paged_attention_triton(*case.args(), max_query_len=5, scale=0.25, chunk=4, window=8)
    if "cpp" not in kernel_backends():
        return
    from specdec_fast.kernels._cpp_build import load_cpu_ops

    assert load_cpu_ops()
    op = torch.ops.specdec_fast.paged_attention
    with pytest.raises(RuntimeError, match="chunk"):
        op(*case.args(), None, 0.25, True, 8, 0.0, None, 4)
    with pytest.raises(RuntimeError, match="chunk"):
        op(*case.args(), None, 0.25, True, 0, 0.0, None, -1)


# Token trees: (seq_lens, query_lens, Hq, Hkv, head_dim, block_size, dtype, chunk); random BFS trees of the
# rows' query counts (attention_cases.random_bfs_tree)
TREE_CASES = {
    # prefixes 11 / 21: depths past 12 / 24 start a chunk inside the tree
    "tree9_chunk4": ([20, 30], [9, 9], 4, 2, 12, 4, torch.float32, 4),
    "tree12_chunk3_g3_bf16": ([17, 40, 12], [12, 12, 12], 3, 1, 12, 4, torch.bfloat16, 3),
    # chunks of 5 and 16 over pages of 16: a boundary at the first node (prefix 32) and inside (prefix 27)
    "tree16_chunk16_pages16": ([48, 43], [16, 16], 4, 2, 32, 16, torch.float32, 16),
    "tree7_chunk5_pages16": ([16, 40], [7, 7], 4, 2, 12, 16, torch.float32, 5),
}


def tree_chunk_mask(prefix: int, bits: list, length: int, chunk: int | None, by_slot: bool = False) -> torch.Tensor:
    """[n, length] bool, written out from positions: node i (bits[i]: its ancestors and itself) sits at
    prefix + its depth (popcount - 1) and sees prefix key j from its chunk's start on, and new token t iff
    t is its ancestor sitting at prefix + depth(t) >= that start. by_slot: t placed at its slot prefix + t
    instead (the mistake the controls show the tests would catch)."""
    depth = [bin(b & (2**64 - 1)).count("1") - 1 for b in bits]
    n = len(bits)
    mask = torch.zeros(n, length, dtype=torch.bool)
    for i in range(n):
        p = prefix + depth[i]
        start = 0 if chunk is None else p - p % chunk
        for j in range(prefix):
            mask[i, j] = j >= start
        for t in range(n):
            position = prefix + (t if by_slot else depth[t])
            mask[i, prefix + t] = bool((bits[i] >> t) & 1) and position >= start
    return mask


def tree_chunk_oracle(case, chunk, by_slot: bool = False) -> torch.Tensor:
    """attention_cases.sdpa_oracle (float64) under tree_chunk_mask."""
    bits = case.tree_mask.cpu().tolist()
    return sdpa_oracle(case, mask_of=lambda lo, hi, L: tree_chunk_mask(L - (hi - lo), bits[lo:hi], L, chunk, by_slot))


def _tree_case(name, device="cpu"):
    seq, ql, hq, hkv, d, bs, dtype, chunk = TREE_CASES[name]
    return make_case(seq, ql, hq, hkv, d, bs, dtype, tree=True, seed=_seed(name), device=device), dtype, chunk


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("name", list(TREE_CASES))
def test_trees_match_the_oracle(name, backend, device):
    """Each backend, the reference included, against tree_chunk_mask's oracle."""
    case, dtype, chunk = _tree_case(name, device)
    out = paged_attention(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask, chunk=chunk,
                          backend=backend)
    torch.testing.assert_close(out.cpu().double(), tree_chunk_oracle(case, chunk), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("name", list(TREE_CASES))
def test_tree_reference_mask_is_the_oracle_mask(name):
    case, _, chunk = _tree_case(name)
    seq, ql = TREE_CASES[name][:2]
    cu, bits = case.cu_query_lens.tolist(), case.tree_mask.tolist()
    rows = torch.zeros(len(seq), max(ql), dtype=torch.long)
    for b, n in enumerate(ql):
        rows[b, :n] = torch.tensor(bits[cu[b]:cu[b + 1]])
    seen = visible_keys(torch.tensor(ql), torch.tensor(seq), max(ql), max(seq), rows, True, None, chunk)
    for b, (L, n) in enumerate(zip(seq, ql)):
        assert torch.equal(seen[b, :n, :L], tree_chunk_mask(L - n, bits[cu[b]:cu[b + 1]], L, chunk)), b


def test_tree_controls_ancestors_sit_at_their_depths():
    """Placing the tree's ancestors at their slots instead of their depths changes some case's mask and
    its output, and so does ignoring the chunk: a kernel that did either would fail the oracle tests."""
    moved = 0
    for name in TREE_CASES:
        case, dtype, chunk = _tree_case(name)
        right = tree_chunk_oracle(case, chunk)
        moved += not torch.allclose(tree_chunk_oracle(case, chunk, by_slot=True), right, atol=TOL[dtype])
        assert not torch.allclose(tree_chunk_oracle(case, None), right, atol=TOL[dtype]), name
    assert moved >= 2
