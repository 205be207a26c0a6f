"""paged_attention's sliding window, soft-capping and sinks (torch reference, Triton, C++) against float64
attention on dense K/V: every mask kind (chain, tree, block), windows of 1, below the query count,
mid-chunk, past every row, prefill rows over page boundaries, a forced Triton KV split; keys
before a window's first chunk are never read (NaN there changes nothing); and the controls (a
window or a cap that changes nothing would pass the oracle only where it should not)."""
import pytest
import torch

from specdec_fast.kernels.attention import paged_attention
from tests.kernels.attention_cases import make_case, sdpa_oracle
from tests.kernels.backends import kernel_backends

TOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}

# (seq_lens, query_lens, Hq, Hkv, head_dim, block_size, dtype, tree, causal, window, softcap)
CASES = {
    "chain5_window1": ([5, 40, 71], [5, 5, 1], 4, 2, 64, 16, torch.float32, False, True, 1, None),
    "chain9_window3_below_queries": ([9, 30], [9, 9], 8, 2, 64, 16, torch.float16, False, True, 3, None),
    "decode_window17_mid_chunk_g3_d80": ([20, 100, 130], [1, 1, 1], 6, 2, 80, 8, torch.float32, False, True, 17, None),
    "chain5_window_past_every_row": ([10, 21], [5, 5], 4, 1, 64, 16, torch.bfloat16, False, True, 500, None),
    "prefill40_window7_pages": ([40, 52], [40, 12], 4, 2, 32, 8, torch.float32, False, True, 7, None),
    "tree9_window9_bf16": ([20, 90, 9], [9, 9, 9], 8, 1, 64, 16, torch.bfloat16, True, True, 9, None),
    "tree12_window40_g3_d200": ([25, 80], [12, 12], 6, 2, 200, 8, torch.float32, True, True, 40, None),
    "block8_window5": ([30, 8, 50], [8, 8, 3], 8, 1, 16, 4, torch.float16, False, False, 5, None),
    "softcap_chain5": ([5, 40], [5, 5], 4, 2, 64, 16, torch.float32, False, True, None, 0.6),
    "softcap_tree9_bf16": ([20, 70], [9, 9], 8, 2, 64, 16, torch.bfloat16, True, True, None, 1.0),
    "softcap_block8": ([30, 8], [8, 8], 4, 1, 64, 4, torch.float32, False, False, None, 0.8),
    "softcap_and_window_gemma2": ([60, 9], [5, 1], 8, 4, 64, 16, torch.float32, False, True, 11, 0.7),
}


def _run(name, backend, device, **extra):
    seq, ql, hq, hkv, d, bs, dtype, tree, causal, window, softcap = CASES[name]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, seed=len(name), device=device)
    out = paged_attention(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask, causal=causal,
                          window=window, softcap=softcap, backend=backend, **extra)
    return case, out


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_oracle(name, backend, device):
    *_, dtype, tree, causal, window, softcap = CASES[name]
    case, out = _run(name, backend, device)
    assert out.dtype == dtype and out.shape == case.q.shape
    expect = sdpa_oracle(case, causal=causal, window=window, softcap=softcap)
    torch.testing.assert_close(out.cpu().double(), expect, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("name", [n for n in CASES if n != "chain5_window_past_every_row"])
def test_controls_the_window_and_the_cap_change_the_output(name):
    """The oracle without the window (or without the cap) is far from the kernel's output: a
    backend that ignored either would fail test_matches_the_oracle (a window past every row
    changes nothing, and is left out)."""
    *_, dtype, tree, causal, window, softcap = CASES[name]
    case, out = _run(name, "torch", "cpu")
    if window is not None:
        assert not torch.allclose(out.double(), sdpa_oracle(case, causal=causal, softcap=softcap), atol=TOL[dtype])
    if softcap is not None:
        assert not torch.allclose(out.double(), sdpa_oracle(case, causal=causal, window=window), atol=TOL[dtype])


@pytest.mark.parametrize("backend", [b for b in kernel_backends() if b != "torch"])
@pytest.mark.parametrize("tree", [False, True])
def test_keys_before_the_window_are_not_read(tree, backend, device):
    """Positions before every query's window, rounded down to 64 (the widest KV chunk), hold NaN:
    the kernels start each row's walk at its window, so the output stays the oracle's (the torch
    reference reads whole rows: a spec, not part of this check)."""
    window, seq = 70, [300, 200]
    case = make_case(seq, [9, 5], 4, 2, 64, 16, torch.float32, tree=tree, seed=4, device=device)
    expect = sdpa_oracle(case, window=window)
    table, page = case.block_table.cpu(), case.k_cache.shape[1]
    for b, (length, n) in enumerate(zip(seq, [9, 5])):
        skipped = (length - n - window + 1) // 64 * 64
        for pos in range(skipped):
            block = int(table[b, pos // page])
            case.k_cache[block, pos % page] = float("nan")
            case.v_cache[block, pos % page] = float("nan")
    out = paged_attention(*case.args(), max_query_len=9, tree_mask=case.tree_mask, window=window, backend=backend)
    torch.testing.assert_close(out.cpu().double(), expect, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("tree", [False, True])
def test_triton_window_over_kv_splits(tree, device):
    """A forced KV split: the splits share the keys from the window's start, some of them none."""
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton import paged_attention_triton

    case = make_case([700, 300, 40], [9, 1, 9], 8, 2, 64, 16, torch.float16, tree=tree, seed=8, device=device)
    out = paged_attention_triton(*case.args(), max_query_len=9, tree_mask=case.tree_mask, scale=64 ** -0.5,
                                 num_splits=4, min_split_tokens=64, window=150, softcap=0.9)
    expect = sdpa_oracle(case, window=150, softcap=0.9)
    torch.testing.assert_close(out.cpu().double(), expect, atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("tree", [False, True])
def test_cpp_window_over_key_splits(tree):
    """The C++ op's key ranges (more threads than tasks: the keys from each row's window start are
    cut into ranges and merged) give the oracle's values, and not bit for bit one thread's."""
    if "cpp" not in kernel_backends():
        pytest.skip("the C++ op is not tested here")
    case = make_case([2000, 700], [5, 1], 4, 1, 64, 16, torch.float32, tree=tree, seed=12)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(8)  # 2 tasks (rows x KV heads) for 8 threads: 4 key ranges each
        out = paged_attention(*case.args(), max_query_len=5, tree_mask=case.tree_mask, window=1100, backend="cpp")
        torch.set_num_threads(1)
        one = paged_attention(*case.args(), max_query_len=5, tree_mask=case.tree_mask, window=1100, backend="cpp")
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out.double(), sdpa_oracle(case, window=1100), atol=2e-4, rtol=2e-4)
    assert not torch.equal(out, one), "the split path was not taken"


# Attention sinks (GPT-OSS: one logit per query head in each softmax, weighing no value):
# (seq_lens, query_lens, Hq, Hkv, head_dim, block_size, dtype, tree, window)
SINK_CASES = {
    "decode_g8_d64": ([30, 100, 7], [1, 1, 1], 8, 1, 64, 16, torch.float32, False, None),
    "chain5_window7_bf16": ([40, 12], [5, 5], 8, 2, 64, 16, torch.bfloat16, False, 7),
    "tree9_window16": ([50, 20], [9, 9], 4, 2, 32, 8, torch.float32, True, 16),
}


def _sinks(hq, seed, device):
    return (torch.randn(hq, generator=torch.Generator().manual_seed(seed)) * 2).to(device)


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("name", list(SINK_CASES))
def test_sinks_match_the_oracle(name, backend, device):
    seq, ql, hq, hkv, d, bs, dtype, tree, window = SINK_CASES[name]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, seed=len(name), device=device)
    sinks = _sinks(hq, len(name), device)
    out = paged_attention(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask, window=window,
                          sinks=sinks, backend=backend)
    expect = sdpa_oracle(case, window=window, sinks=sinks)
    torch.testing.assert_close(out.cpu().double(), expect, atol=TOL[dtype], rtol=TOL[dtype])
    # control: the sinks matter (the weights of the keys sum to less than 1)
    assert not torch.allclose(out.cpu().double(), sdpa_oracle(case, window=window), atol=TOL[dtype])


def test_triton_sinks_counted_once_over_kv_splits(device):
    """A forced KV split: only split 0 adds the sink to its partial, the merge weighs it once."""
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton import paged_attention_triton

    case = make_case([700, 300], [5, 1], 8, 2, 64, 16, torch.float16, seed=9, device=device)
    sinks = _sinks(8, 9, device)
    out = paged_attention_triton(*case.args(), max_query_len=5, scale=64 ** -0.5, num_splits=4, min_split_tokens=64,
                                 sinks=sinks)
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case, sinks=sinks), atol=4e-3, rtol=4e-3)


def test_cpp_sinks_over_key_splits():
    if "cpp" not in kernel_backends():
        pytest.skip("the C++ op is not tested here")
    case = make_case([2000], [5], 4, 1, 64, 16, torch.float32, seed=13)
    sinks = _sinks(4, 13, "cpu")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(8)  # one task (row x KV head) for 8 threads: its keys in ranges, merged
        out = paged_attention(*case.args(), max_query_len=5, sinks=sinks, backend="cpp")
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out.double(), sdpa_oracle(case, sinks=sinks), atol=2e-4, rtol=2e-4)


BAD = {
    "window_zero": (dict(window=0), "window"),
    "window_float": (dict(window=4.0), "window"),
    "window_bool": (dict(window=True), "window"),
    "tree_window_below_queries": (dict(window=4, tree=True), "tree"),
    "softcap_zero": (dict(softcap=0.0), "softcap"),
    "softcap_negative": (dict(softcap=-1.0), "softcap"),
    "softcap_inf": (dict(softcap=float("inf")), "softcap"),
    "softcap_str": (dict(softcap="30"), "softcap"),
    "sinks_shape": (dict(sinks=torch.zeros(3)), "sinks"),
    "sinks_int": (dict(sinks=torch.zeros(4, dtype=torch.int64)), "sinks"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_window_or_softcap(name):
    extra, match = BAD[name]
    extra = dict(extra)
    tree = extra.pop("tree", False)
    case = make_case([10, 7], [5, 2], 4, 2, 16, 4, torch.float32, tree=tree, seed=1)
    with pytest.raises(ValueError, match=match):
        paged_attention(*case.args(), max_query_len=5, tree_mask=case.tree_mask, **extra)
