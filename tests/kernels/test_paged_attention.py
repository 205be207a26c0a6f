"""paged_attention (torch reference, Triton, C++) against float64 SDPA on dense K/V with an
explicit boolean mask, over a covering table of shapes, masks, dtypes and layouts; plus the
flash-decoding split path and the bad-input errors."""
import pytest
import torch

from specdec_fast.kernels.attention import paged_attention
from tests.kernels.attention_cases import make_case, sdpa_oracle
from tests.kernels.backends import cpp_tested, kernel_backends

TOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}

# (seq_lens, query_lens, Hq, Hkv, head_dim, block_size, dtype, tree, strided)
CASES = {
    "decode_g1_ragged": ([1, 17, 33, 100], [1, 1, 1, 1], 4, 4, 64, 16, torch.float16, False, False),
    "chain5_g4_bf16": ([5, 21, 48], [5, 5, 5], 8, 2, 64, 16, torch.bfloat16, False, True),
    "chain9_g8_d128": ([9, 40], [9, 9], 8, 1, 128, 32, torch.float32, False, False),
    "mixed_1_5_9_and_empty": ([30, 12, 9, 50], [1, 5, 9, 0], 4, 1, 128, 16, torch.float16, False, True),
    "tree5_g4": ([5, 37], [5, 5], 8, 2, 64, 32, torch.float16, True, False),
    "tree9_g8_bf16": ([20, 70, 9], [9, 9, 9], 8, 1, 64, 16, torch.bfloat16, True, True),
    "tree_mixed_g1_fp32": ([6, 50], [1, 9], 2, 2, 128, 32, torch.float32, True, False),
    "tree64_sign_bit_two_tiles": ([94, 10], [64, 3], 4, 1, 64, 16, torch.float32, True, False),
    # GQA 3 (query rows not a multiple of the C++ op's quads), head_dim 80 / 200 (not a multiple of
    # its 16-lane vectors), contexts that end mid-chunk
    "chain7_g3_d80_ragged": ([7, 40, 130], [7, 1, 7], 6, 2, 80, 16, torch.float32, False, False),
    "tree12_g3_d200_bf16": ([25, 12], [12, 12], 6, 2, 200, 8, torch.bfloat16, True, True),
}


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("name", list(CASES))
def test_matches_sdpa(name, backend, device):
    seq, ql, hq, hkv, d, bs, dtype, tree, strided = CASES[name]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, strided=strided, seed=len(name), device=device)
    out = paged_attention(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask, backend=backend)
    assert out.dtype == dtype and out.shape == case.q.shape
    tol = TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case), atol=tol, rtol=tol)


# The block mask (causal=False: DFlash's draft block, every new token seen both ways):
# (seq_lens, query_lens, Hq, Hkv, head_dim, block_size, dtype, strided). Awkward sizes: a block of
# 16 over page boundaries, a row whose whole context is its block, an empty row, head_dim 12, GQA 8.
BLOCK_CASES = {
    "block16_g4_fp32": ([16, 40, 23], [16, 16, 16], 8, 2, 64, 16, torch.float32, False),
    "block5_mixed_empty_bf16": ([9, 5, 70, 3], [5, 5, 0, 3], 4, 1, 128, 16, torch.bfloat16, True),
    "block8_d12_g8_fp16": ([30, 8], [8, 8], 8, 1, 12, 4, torch.float16, False),
}


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("name", list(BLOCK_CASES))
def test_block_mask_matches_sdpa(name, backend, device):
    seq, ql, hq, hkv, d, bs, dtype, strided = BLOCK_CASES[name]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, strided=strided, seed=len(name), device=device)
    out = paged_attention(*case.args(), max_query_len=case.max_query_len, causal=False, backend=backend)
    tol = TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case, causal=False), atol=tol, rtol=tol)
    causal = paged_attention(*case.args(), max_query_len=case.max_query_len, backend=backend)
    assert not torch.allclose(out.cpu().double(), causal.cpu().double(), atol=tol), "the block mask must differ"


def test_block_mask_with_a_kv_split(device):
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton import paged_attention_triton

    case = make_case([600, 40], [16, 9], 8, 2, 64, 16, torch.float16, seed=9, device=device)
    out = paged_attention_triton(*case.args(), max_query_len=16, scale=64 ** -0.5, num_splits=4, min_split_tokens=64,
                                 causal=False)
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case, causal=False), atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("name", list(CASES) + list(BLOCK_CASES))
def test_reference_one_row_a_chunk_equals_all_rows_at_once(name, monkeypatch):
    """The torch reference attends its rows padded to the longest, a chunk of rows at a time: one
    row a chunk (CHUNK_VALUES = 1) gives the values of every row in one chunk (to the output
    dtype's rounding: the sums' order differs), and both give the SDPA oracle's (NaN in the slots
    past each row's end, -1 table entries, empty rows)."""
    from specdec_fast.kernels.attention import reference

    block = name in BLOCK_CASES
    spec = BLOCK_CASES[name] if block else CASES[name]
    seq, ql, hq, hkv, d, bs, dtype = spec[:7]
    tree = False if block else spec[7]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, strided=spec[-1], seed=len(name))
    args = dict(tree_mask=case.tree_mask, causal=not block)
    together = reference.paged_attention_reference(*case.args(), **args)
    monkeypatch.setattr(reference, "CHUNK_VALUES", 1)
    alone = reference.paged_attention_reference(*case.args(), **args)
    torch.testing.assert_close(alone, together)  # the dtype's default tolerance: an ulp apart at most
    torch.testing.assert_close(alone.double(), sdpa_oracle(case, causal=not block), atol=TOL[dtype], rtol=TOL[dtype])


def test_block_mask_takes_no_tree():
    case = make_case([5], [5], 2, 2, 16, 4, torch.float32, tree=True)
    with pytest.raises(ValueError, match="block mask"):
        paged_attention(*case.args(), max_query_len=5, tree_mask=case.tree_mask, causal=False)


@pytest.mark.parametrize("backend", kernel_backends())
def test_loose_max_query_len_and_scale(backend, device):
    """max_query_len above the real maximum only adds idle programs; a custom scale is honoured."""
    case = make_case([13, 40], [3, 7], 4, 2, 64, 16, torch.float16, seed=3, max_query_len=12, device=device)
    out = paged_attention(*case.args(), max_query_len=12, scale=0.3, backend=backend)
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case, scale=0.3), atol=4e-3, rtol=4e-3)


# KV split (flash-decoding), forced: (seq_lens, query_lens, Hq, Hkv, D, bs, dtype, tree, (splits, min tokens))
SPLIT_CASES = {
    "split_decode_and_chain": ([700, 300], [5, 1], 8, 2, 64, 16, torch.float16, False, (4, 64)),
    "split_tree_bf16_empty_splits": ([520], [9], 8, 1, 128, 32, torch.bfloat16, True, (16, 64)),
    "split_boundary_fp32": ([256, 129], [9, 1], 4, 4, 64, 32, torch.float32, False, (3, 64)),
    "split_min_tokens_short_rows": ([70, 9, 300], [5, 9, 1], 4, 1, 64, 16, torch.float16, True, (8, 128)),
}


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_triton_kv_split_merge(name, device):
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton import paged_attention_triton

    seq, ql, hq, hkv, d, bs, dtype, tree, split = SPLIT_CASES[name]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, seed=7, device=device)
    out = paged_attention_triton(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask,
                                 scale=d ** -0.5, num_splits=split[0], min_split_tokens=split[1])
    tol = TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case), atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", [b for b in kernel_backends() if b != "triton"])
def test_long_context_cpu_backends(backend, device):
    case = make_case([700, 300], [5, 1], 8, 2, 64, 16, torch.float16, tree=False, seed=11, device=device)
    out = paged_attention(*case.args(), max_query_len=5, backend=backend)
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case), atol=4e-3, rtol=4e-3)


def test_default_backend_runs(device):
    case = make_case([20, 3], [3, 1], 4, 2, 64, 16, torch.float32, seed=5, device=device)
    out = paged_attention(*case.args(), max_query_len=3)
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case), atol=2e-4, rtol=2e-4)


def _good(device="cpu"):
    case = make_case([10, 7], [3, 2], 4, 2, 64, 16, torch.float32, tree=True, seed=1, device=device)
    kw = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, block_table=case.block_table,
              seq_lens=case.seq_lens, cu_query_lens=case.cu_query_lens, max_query_len=3, tree_mask=case.tree_mask)
    return kw


def _call(kw, **extra):
    kw = dict(kw)
    args = [kw.pop(n) for n in ("q", "k_cache", "v_cache", "block_table", "seq_lens", "cu_query_lens")]
    return paged_attention(*args, **kw, **extra)


BAD = {
    "q_not_tensor": (lambda kw: kw.update(q=kw["q"].tolist()), TypeError, "q"),
    "q_int": (lambda kw: kw.update(q=kw["q"].int()), TypeError, "q"),
    "q_2d": (lambda kw: kw.update(q=kw["q"][0]), ValueError, "q"),
    "cache_dtype": (lambda kw: kw.update(k_cache=kw["k_cache"].half()), TypeError, "k_cache"),
    "v_shape": (lambda kw: kw.update(v_cache=kw["v_cache"][:-1]), ValueError, "v_cache"),
    "head_dim": (lambda kw: kw.update(q=torch.randn(5, 4, 32)), ValueError, "head_dim"),
    "gqa_ratio": (lambda kw: kw.update(q=torch.randn(5, 3, 64)), ValueError, "multiple"),
    "block_table_int64": (lambda kw: kw.update(block_table=kw["block_table"].long()), TypeError, "block_table"),
    "block_table_range": (lambda kw: kw["block_table"].__setitem__((0, 0), 999), ValueError, "block_table"),
    "seq_lens_shape": (lambda kw: kw.update(seq_lens=kw["seq_lens"][:1]), ValueError, "seq_lens"),
    "seq_lens_int64": (lambda kw: kw.update(seq_lens=kw["seq_lens"].long()), TypeError, "seq_lens"),
    "seq_lens_below_queries": (lambda kw: kw.update(seq_lens=torch.tensor([2, 7], dtype=torch.int32)), ValueError, "seq_lens"),
    "seq_lens_over_capacity": (lambda kw: kw.update(seq_lens=torch.tensor([10, 999], dtype=torch.int32)), ValueError, "capacity"),
    "cu_len": (lambda kw: kw.update(cu_query_lens=kw["cu_query_lens"][:-1]), ValueError, "cu_query_lens"),
    "cu_end": (lambda kw: kw.update(cu_query_lens=torch.tensor([0, 3, 4], dtype=torch.int32)), ValueError, "cu_query_lens"),
    "cu_decreasing": (lambda kw: kw.update(cu_query_lens=torch.tensor([0, 6, 5], dtype=torch.int32)), ValueError, "cu_query_lens"),
    "max_query_len_small": (lambda kw: kw.update(max_query_len=2), ValueError, "max_query_len"),
    "max_query_len_type": (lambda kw: kw.update(max_query_len=3.0), ValueError, "max_query_len"),
    "tree_int32": (lambda kw: kw.update(tree_mask=kw["tree_mask"].int()), TypeError, "tree_mask"),
    "tree_shape": (lambda kw: kw.update(tree_mask=kw["tree_mask"][:-1]), ValueError, "tree_mask"),
    "tree_no_self_bit": (lambda kw: kw["tree_mask"].__setitem__(1, 1), ValueError, "tree_mask"),
    "tree_future_bit": (lambda kw: kw["tree_mask"].__setitem__(0, 3), ValueError, "tree_mask"),
    "tree_too_long": (lambda kw: kw.update(max_query_len=65), ValueError, "64"),
    "scale_type": (lambda kw: kw.update(scale="x"), TypeError, "scale"),
    "device": (lambda kw: kw.update(seq_lens=kw["seq_lens"].to("meta")), ValueError, "seq_lens"),
    "cache_last_stride": (lambda kw: kw.update(k_cache=kw["k_cache"].transpose(2, 3).contiguous().transpose(2, 3),
                                               ), ValueError, "stride"),
    "backend_name": (lambda kw: kw.update(backend="cuda"), ValueError, "backend"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name):
    kw = _good()
    _call(kw)  # the unmodified call is valid
    mutate, exc, match = BAD[name]
    mutate(kw)
    with pytest.raises(exc, match=match):
        _call(kw)


# head dims that are not powers of 2 (padded to one inside the kernel), direct and split paths:
# (seq_lens, query_lens, Hq, Hkv, D, block_size, dtype, tree, forced splits or None)
ODD_HEAD_DIMS = {
    "d12_decode_fp32": ([9, 30], [1, 1], 4, 2, 12, 4, torch.float32, False, None),
    "d48_chain_fp16": ([8, 21], [2, 5], 2, 1, 48, 16, torch.float16, False, None),
    "d80_tree_bf16_split": ([150, 9], [5, 9], 4, 2, 80, 16, torch.bfloat16, True, 3),
    "d96_split_fp32": ([200], [3], 2, 2, 96, 32, torch.float32, False, 4),
    "d112_decode_bf16": ([40, 1], [1, 1], 8, 8, 112, 16, torch.bfloat16, False, None),
    # Gemma 4's full layers (512: 16-row tiles), a prefill-like chain and a tree over a forced split; 320 padded to 512
    "d512_chain_bf16": ([40, 19], [17, 4], 4, 2, 512, 16, torch.bfloat16, False, None),
    "d512_tree_fp32_split": ([90], [6], 2, 1, 512, 16, torch.float32, True, 2),
    "d320_decode_fp16": ([33], [1], 2, 2, 320, 16, torch.float16, False, None),
}


@pytest.mark.parametrize("name", list(ODD_HEAD_DIMS))
def test_triton_any_head_dim(name, device):
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton import paged_attention_triton

    seq, ql, hq, hkv, d, bs, dtype, tree, splits = ODD_HEAD_DIMS[name]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, strided=True, seed=d, device=device)
    if splits is None:
        out = paged_attention(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask, backend="triton")
    else:
        out = paged_attention_triton(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask,
                                     scale=d ** -0.5, num_splits=splits, min_split_tokens=64)
    assert out.shape == case.q.shape and out.is_contiguous()
    tol = TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case), atol=tol, rtol=tol)


def test_triton_rejects_head_dim_over_512(device):
    pytest.importorskip("triton")
    case = make_case([8], [2], 2, 1, 520, 16, torch.float32, device=device)
    with pytest.raises(ValueError, match="head_dim <= 512"):
        paged_attention(*case.args(), max_query_len=2, backend="triton")


@pytest.mark.parametrize("backend", kernel_backends())
def test_check_false_same_result(backend, device):
    """check=False only skips the value checks: same output as the checked call."""
    kw = _good(device)
    checked = _call(kw, backend=backend)
    unchecked = _call(kw, backend=backend, check=False)
    torch.testing.assert_close(unchecked, checked, atol=0, rtol=0)


@pytest.mark.gpu
def test_cuda_graph_capture_no_sync():
    """The Triton path never syncs (sync debug mode 'error') and replays in a CUDA graph with
    new seq_lens / cu_query_lens values (grid from static shapes, values read in the kernel)."""
    case = make_case([300, 40, 1000], [5, 1, 3], 8, 2, 128, 16, torch.bfloat16, seed=2, device="cuda")
    args = case.args()

    def run():
        return paged_attention(*args, max_query_len=5, backend="triton", check=False)

    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    graph.replay()
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case), atol=3e-2, rtol=3e-2)
    # shorter rows, same tensors: the replay must follow the new values
    case.seq_lens.copy_(torch.tensor([200, 40, 999], dtype=torch.int32))
    case.dense_k = [k[:L] for k, L in zip(case.dense_k, [200, 40, 999])]
    case.dense_v = [v[:L] for v, L in zip(case.dense_v, [200, 40, 999])]
    graph.replay()
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("n,tree", [(1, False), (5, False), (9, True)])
def test_cuda_long_context_auto_split(n, tree):
    """Llama-like heads, one long row plus short ones: the automatic split count is > 1."""
    case = make_case([8000, 700, n], [n, n, n], 32, 8, 128, 16, torch.bfloat16, tree=tree, seed=n, device="cuda")
    out = paged_attention(*case.args(), max_query_len=n, tree_mask=case.tree_mask, backend="triton")
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case), atol=3e-2, rtol=3e-2)


def test_split_and_tile_choice_from_static_shapes():
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton import (MIN_SPLIT_TOKENS, choose_splits, choose_tiling,
                                                       head_dim_padded, plan_launch)

    # Llama-8B heads on a 132-SM GPU: B=1 with 32k tokens is split into many programs ...
    queries, block_m, block_n = choose_tiling(max_query_len=5, group=4, head_dim=128)
    assert (queries, block_m) == (8, 32) and block_m >= 16
    splits, min_tokens = choose_splits(132, programs=1 * 8, capacity=32768, block_n=block_n)
    assert splits >= 32 and min_tokens % block_n == 0 and min_tokens >= MIN_SPLIT_TOKENS
    # ... B=32 needs few splits, a short block table few, the interpreter one
    assert choose_splits(132, 32 * 8, 32768, block_n)[0] <= 4
    assert choose_splits(None, 8, 32768, block_n)[0] == 1
    # short block tables split too, never below MIN_SPLIT_TOKENS a split (the H200's 1k rows: 4 splits
    # 10.8 / 14.0 us at B = 1 / 8 against one split's 23.4 / 24.6); a table of one split's tokens: one
    for batch in (1, 8):
        assert choose_splits(132, batch * 8, 1024, block_n) == (4, MIN_SPLIT_TOKENS)
    assert choose_splits(132, 32 * 8, 1024, block_n)[0] == 3  # 256 programs: 3 x 528 / 256
    assert choose_splits(132, 8, 300, block_n)[0] == 2
    assert choose_splits(132, 8, MIN_SPLIT_TOKENS, block_n)[0] == 1
    assert choose_splits(132, 8, 2048, block_n)[0] == 8
    assert choose_splits(132, 8, 8192, block_n)[0] == 32  # B=1 at 8k: 32 splits of 256 tokens (as measured)
    assert choose_splits(132, 8 * 8, 8192, block_n)[0] == 9
    assert [head_dim_padded(d) for d in (12, 16, 80, 96, 112, 128, 256)] == [16, 16, 128, 128, 128, 128, 256]
    plan = plan_launch(torch.device("cpu"), 1, 8, 4, 80, 1, 1024)
    assert (plan.num_splits, plan.head_dim_p2, plan.num_tiles) == (1, 128, 1)
    # decode (N=1) with a GQA group of 8 fills a 16-row tile; N=9 with G=8 fits one 128-row
    # tile (each KV page read once); a 64-node tree with G=4 takes two
    assert choose_tiling(1, 8, 128)[:2] == (1, 16)
    assert choose_tiling(9, 8, 128)[:2] == (16, 128)
    q64 = choose_tiling(64, 4, 64)[0]
    assert -(-64 // q64) == 2


def test_tiles_fit_the_devices_shared_memory():
    """choose_tiling under a device's shared memory a block: an RTX 30xx / 40xx (101376 bytes) takes
    fp32 prefill tiles of 64 rows over chunks of 32 (the 128 x 64 tile needs 164352 there: its launch
    would fail); bf16 / fp16 keep 128 x 64 on every generation the kernels run on; an A100 (166912)
    narrows the fp32 chunk only; an H100 (232448) changes nothing; every chosen tile's bound fits."""
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton import choose_tiling, tile_shared_bytes

    for limit, elt, expected in ((101376, 4, (8, 64, 32)), (101376, 2, (16, 128, 64)), (166912, 4, (16, 128, 32)),
                                 (166912, 2, (16, 128, 64)), (232448, 4, (16, 128, 64)), (None, 4, (16, 128, 64))):
        assert choose_tiling(4096, 8, 128, elt, limit) == expected, (limit, elt)
        _, block_m, block_n = expected
        assert limit is None or tile_shared_bytes(block_m, block_n, 128, elt) <= limit
    assert choose_tiling(4096, 8, 256, 4, 101376) == (2, 16, 16)  # fp32 head_dim 256: chunks of 16 as a last resort
    assert tile_shared_bytes(16, 16, 256, 4) <= 101376
    assert choose_tiling(1, 8, 128, 4, 101376)[:2] == (1, 16)  # decode's tile is small anyway


@pytest.mark.parametrize("head_dim,tile", [(128, (64, 32, 8)), (256, (16, 16, 2))])
@pytest.mark.parametrize("tree", [False, True])
def test_triton_tiles_narrowed_for_a_small_shared_memory_match_sdpa(tree, head_dim, tile, device, monkeypatch):
    """The narrowed tiles (fp32, a GQA group of 8: 64 rows over chunks of 32 at D = 128, 16 over 16
    at D = 256: what an RTX 30xx / 40xx plans for prefill) give SDPA's outputs: a 40-token call over
    pages of 16."""
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention import triton as attention_triton

    monkeypatch.setattr(attention_triton, "_shared_limit", lambda device: 101376)
    case = make_case([70, 45], [40, 33], 8, 1, head_dim, 16, torch.float32, tree=tree, seed=5, device=device)
    plan = attention_triton.plan_launch(case.q.device, 2, 1, 8, head_dim, case.max_query_len, 1024, element_size=4)
    assert (plan.block_m, plan.block_n, plan.queries) == tile
    out = paged_attention(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask, backend="triton")
    torch.testing.assert_close(out.cpu().double(), sdpa_oracle(case), atol=TOL[torch.float32], rtol=TOL[torch.float32])


@pytest.mark.gpu
def test_the_devices_shared_memory_is_read():
    """On a GPU: the limit the tiling reads (Triton's own launch check's) is the device's, and an
    H100 / H200 (232448 bytes a block) plans the tiles it always did."""
    from specdec_fast.kernels.attention import triton as attention_triton

    limit = attention_triton._shared_limit(torch.device("cuda"))
    assert isinstance(limit, int) and limit >= 48 * 1024, limit
    if torch.cuda.get_device_capability() >= (9, 0):
        assert limit == 232448
        for elt in (2, 4):
            plan = attention_triton.plan_launch(torch.device("cuda"), 1, 8, 8, 128, 4096, 8192, element_size=elt)
            assert (plan.block_m, plan.block_n) == (128, 64)


@pytest.mark.slow
def test_triton_kernels_compile_for_sm90():
    """Ahead-of-time compile for an H100 (TTIR -> PTX -> ptxas) in a process without the
    interpreter: the GPU code path type-checks and fits shared memory even with no GPU here."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(__file__), "aot_compile_attention.py")
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas in this triton install")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "merge ok" in proc.stdout


# The C++ op cuts a (row, KV head) task's keys into ranges when there are fewer tasks than
# threads (csrc/paged_attention.cpp key_splits: at least 256 keys a range) and merges them.
# (seq_lens, query_lens, Hq, Hkv, head_dim, block_size, dtype, mode): row lengths that leave
# some ranges empty or partial, causal / tree / block masks.
KEY_RANGE_CASES = {
    "decode_one_row_g4": ([1500], [1], 4, 1, 64, 16, torch.float32, "causal"),
    "chain5_two_rows_ragged": ([1100, 300], [5, 5], 8, 1, 80, 16, torch.bfloat16, "causal"),
    "tree9_long": ([1030], [9], 4, 1, 64, 32, torch.float16, "tree"),
    "block16_long": ([777, 520], [16, 16], 2, 1, 32, 16, torch.float32, "block"),
}


@pytest.mark.skipif(not cpp_tested(), reason="the C++ backend is not tested here")
@pytest.mark.parametrize("threads", [3, 8])
@pytest.mark.parametrize("name", list(KEY_RANGE_CASES))
def test_cpp_key_splits_over_threads(name, threads):
    seq, ql, hq, hkv, d, bs, dtype, mode = KEY_RANGE_CASES[name]
    case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=mode == "tree", seed=len(name))
    causal = mode != "block"
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)  # the C++ op's OpenMP threads: fewer tasks than threads -> splits
        out = paged_attention(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask,
                              causal=causal, backend="cpp")
        torch.set_num_threads(1)
        one = paged_attention(*case.args(), max_query_len=case.max_query_len, tree_mask=case.tree_mask,
                              causal=causal, backend="cpp")
    finally:
        torch.set_num_threads(before)
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), sdpa_oracle(case, causal=causal), atol=tol, rtol=tol)
    torch.testing.assert_close(out.double(), one.double(), atol=tol, rtol=tol)
    if dtype == torch.float32:  # merged ranges sum in another order: not bit for bit
        assert not torch.equal(out, one), "the split path was not taken"
