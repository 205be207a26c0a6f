"""mla_attention (kernels/attention: MLA with absorbed projections over a latent paged cache) on
every backend against a dense oracle written here: each query head scores every visible entry by
its whole [c, k_rot] and averages the entries' first R dims. Awkward sizes: a latent of 48 (padded
to 64), rotated dims of 8 (padded to 16), DeepSeek-V3's 512 + 64, 1 / 3 / 20 heads (20: two head
tiles, the second part empty), pages of 1 / 4 / 16, rows of 1-70 entries with 1-5 new ones, token
trees, forced KV splits (merged), fp32 and bf16. Controls: the value is the latent only (not
k_rot), and the rotated dims are scored."""
import pytest
import torch

from specdec_fast.kernels.attention import mla_attention

from tests.kernels.backends import kernel_backends

from .attention_cases import make_case

SHAPES = [([7], [1]), ([33, 5, 18], [4, 1, 3]), ([70], [5]), ([1, 40], [1, 2])]


def dense_mla(case, rank: int, scale: float, dims=None) -> torch.Tensor:
    """out [T, Hq, R] from the dense entries of each row (float64): query i of a row of n new entries
    sits at prefix + i and sees the prefix and new entry j <= i (with a tree: j's bit set). dims: the
    entry dims scored (default all)."""
    outs = []
    cu = case.cu_query_lens.tolist()
    for b, entries in enumerate(case.dense_k):
        e = entries[:, 0].double()  # [L, R + DR]
        n = cu[b + 1] - cu[b]
        prefix = e.shape[0] - n
        for i in range(n):
            t = cu[b] + i
            q = case.q[t].cpu().double()  # [Hq, R + DR]
            keys = e if dims is None else e[:, dims]
            s = scale * (q if dims is None else q[:, dims]) @ keys.T  # [Hq, L]
            j = torch.arange(e.shape[0]) - prefix
            visible = j <= i
            if case.tree_mask is not None:
                bits = int(case.tree_mask[t])
                visible &= torch.tensor([jj < 0 or bool((bits >> jj) & 1) for jj in j.tolist()])
            s[:, ~visible] = float("-inf")
            outs.append(torch.softmax(s, -1) @ e[:, :rank])
    return torch.stack(outs)


def _case(shape, hq, rank, rope, block_size, dtype, tree=False, seed=0, device="cpu"):
    seq_lens, query_lens = shape
    return make_case(seq_lens, query_lens, hq, 1, rank + rope, block_size, dtype, tree=tree, seed=seed, device=device)


def _run(case, rank, scale, backend, **kw):
    return mla_attention(case.q, case.k_cache, case.block_table, case.seq_lens, case.cu_query_lens, rank=rank,
                         max_query_len=case.max_query_len, tree_mask=case.tree_mask, scale=scale, backend=backend, **kw)


def _tolerance(dtype):
    return dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("hq, rank, rope, block_size", [(3, 32, 8, 4), (20, 48, 16, 1), (1, 32, 8, 16), (2, 512, 64, 4)])
@pytest.mark.parametrize("tree", [False, True])
def test_equals_the_dense_oracle(backend, shape, hq, rank, rope, block_size, tree, device):
    if backend == "triton":
        pytest.importorskip("triton")
    if tree and max(shape[1]) == 1:
        pytest.skip("a tree of one node is the causal case")
    case = _case(shape, hq, rank, rope, block_size, torch.float32, tree=tree, seed=hq + rank, device=device)
    scale = (rank + rope) ** -0.5 * 1.3
    out = _run(case, rank, scale, backend)
    assert out.shape == (case.q.shape[0], hq, rank)
    torch.testing.assert_close(out.cpu().double(), dense_mla(case, rank, scale), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_splits_and_dtypes(splits, dtype, device):
    """The KV sequence split over programs and merged (a split may hold no visible entry: rows of 1);
    bf16 within its rounding."""
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton_mla import mla_attention_triton

    case = _case(([33, 1, 70], [4, 1, 2]), 20, 48, 16, 4, dtype, seed=splits, device=device)
    scale = 64 ** -0.5
    out = mla_attention_triton(case.q, case.k_cache, case.block_table, case.seq_lens, case.cu_query_lens, rank=48,
                               max_query_len=case.max_query_len, scale=scale, num_splits=splits)
    torch.testing.assert_close(out.cpu().double(), dense_mla(case, 48, scale), **_tolerance(dtype))


@pytest.mark.parametrize("tile", [(32, 16, 8), (32, 32, 8), (16, 32, 4)])
def test_triton_tiles(tile, device):
    """The benchmark's wider tiles (triton_mla.TILES): 32 rows hold 32 heads of one query, or 2 queries
    of 16 heads (20 heads: padded), over a tree and a split."""
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton_mla import mla_attention_triton

    for hq in (3, 20, 40):
        case = _case(([33, 5, 18], [4, 1, 3]), hq, 48, 16, 4, torch.float32, tree=True, seed=hq, device=device)
        out = mla_attention_triton(case.q, case.k_cache, case.block_table, case.seq_lens, case.cu_query_lens, rank=48,
                                   max_query_len=case.max_query_len, tree_mask=case.tree_mask, scale=0.15,
                                   num_splits=2, tile=tile)
        torch.testing.assert_close(out.cpu().double(), dense_mla(case, 48, 0.15), atol=2e-5, rtol=2e-5)


def test_controls_the_value_is_the_latent_and_the_rotated_dims_score(device):
    """The oracle would catch a kernel that averaged k_rot into the value, or scored the latent alone."""
    pytest.importorskip("triton")
    case = _case(([20], [3]), 3, 32, 8, 4, torch.float32, device=device)
    out = _run(case, 32, 0.2, "triton").cpu().double()
    full = dense_mla(case, 40, 0.2)  # the value with k_rot: its first 32 dims are the same, so compare those too
    torch.testing.assert_close(out, full[..., :32], atol=2e-5, rtol=2e-5)
    latent_only = dense_mla(case, 32, 0.2, dims=slice(0, 32))
    assert (out - latent_only).abs().max() > 1e-2


def test_refusals(device):
    case = _case(([5], [1]), 2, 32, 8, 4, torch.float32)
    with pytest.raises(ValueError, match="rank must be"):
        _run(case, 40, 0.2, "torch")
    two_heads = make_case([5], [1], 2, 2, 40, 4, torch.float32)
    with pytest.raises(ValueError, match="one head"):
        _run(two_heads, 32, 0.2, "torch")
    pytest.importorskip("triton")
    wide = _case(([5], [1]), 2, 1024, 8, 4, torch.float32, device=device)
    with pytest.raises(ValueError, match="rank <= 512"):
        _run(wide, 1024, 0.2, "triton")


def test_the_plan_takes_the_wide_tile_where_an_h200_timed_it_faster():
    """plan_mla's default tile (triton_mla's docstring: the H200's rows of 2026-11-30): WIDE_TILE for 16-bit
    latents of 512 dims and >= 32 heads; fp32 (the wide tile spills 6 KB there), 20 heads (not timed) and
    narrower latents keep 16 rows."""
    pytest.importorskip("triton")
    from specdec_fast.kernels.attention.triton_mla import WIDE_TILE, plan_mla

    def tile(heads, rank, dtype):
        plan = plan_mla(torch.device("cpu"), 1, heads, rank, 1, 4096, num_splits=1, dtype=dtype)
        return plan.block_m, plan.block_n, plan.num_warps

    assert tile(128, 512, torch.bfloat16) == tile(64, 512, torch.float16) == WIDE_TILE == (32, 32, 8)
    assert tile(128, 512, torch.float32) == tile(20, 512, torch.bfloat16) == tile(128, 512, None) == (16, 16, 4)
    assert tile(128, 48, torch.bfloat16) == (16, 32, 4)
