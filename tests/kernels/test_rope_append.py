"""rope_append_kv (RoPE on q and k, Qwen3's q/k norm, and the KV append in one Triton launch)
against its torch reference, over awkward head dims (12, 80), GQA groups, block sizes, ragged
rows with padding tokens, strided q/k/v views of one qkv product, and the three dtypes."""
import pytest
import torch

from specdec_fast.kernels.cache_ops import rope_append_kv, rope_append_kv_reference

pytest.importorskip("triton")

# (Hq, Hkv, D, block_size, dtype, counts, qk_norm)
CASES = {
    "llama_d16_fp32": (4, 4, 16, 4, torch.float32, [3, 1, 5], False),
    "gqa_d12_bf16_norm": (6, 2, 12, 16, torch.bfloat16, [1, 0, 4], True),
    "d80_fp16": (4, 1, 80, 8, torch.float16, [2, 7], False),
    "d128_bf16_g8": (8, 1, 128, 16, torch.bfloat16, [1], False),
    "d64_fp32_norm_padding": (3, 3, 64, 32, torch.float32, [2, 2], True),
}


def _case(hq, hkv, d, bs, dtype, counts, qk_norm, device, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, real = len(counts), sum(counts)
    total = real + 2  # two padding tokens at the tail (the runner's in-call padding)
    qkv = torch.randn(total, (hq + 2 * hkv) * d, generator=gen).to(dtype)  # one fused product [T, (Hq+2Hkv)*D]
    q = qkv[:, : hq * d].view(total, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(total, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(total, hkv, d)
    ang = torch.randn(total, d // 2, generator=gen) * 20
    ang = torch.cat((ang, ang), -1)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    per_row = 4
    num_blocks = batch * per_row + 1
    table = torch.randperm(num_blocks, generator=gen)[: batch * per_row].view(batch, per_row).int()
    lens = torch.tensor([int(torch.randint(0, per_row * bs - c + 1, (1,), generator=gen)) for c in counts], dtype=torch.int32)
    cu = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
    caches = torch.randn(2, num_blocks, bs, hkv, d, generator=gen).to(dtype)
    norm = None
    if qk_norm:
        norm = (torch.rand(d, generator=gen).to(dtype) + 0.5, 1e-6, torch.rand(d, generator=gen).to(dtype) + 0.5, 1e-5)
    return qkv, q, k, v, cos, sin, caches, table, lens, cu, norm


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name, device):
    hq, hkv, d, bs, dtype, counts, qk_norm = CASES[name]
    qkv, q, k, v, cos, sin, caches, table, lens, cu, norm = _case(hq, hkv, d, bs, dtype, counts, qk_norm, "cpu", len(name))
    qkv_ref, caches_ref = qkv.clone(), caches.clone()
    hd = hq * d
    rope_append_kv_reference(qkv_ref[:, :hd].view(-1, hq, d), k, v, cos, sin, caches_ref[0], caches_ref[1], table, lens, cu, norm)

    dev = lambda t: t.clone().to(device)  # noqa: E731 (a copy: .to(cpu) would alias the inputs)
    qkv_d, caches_d = dev(qkv), dev(caches)
    norm_d = None if norm is None else (dev(norm[0]), norm[1], dev(norm[2]), norm[3])
    q_d = qkv_d[:, :hd].view(-1, hq, d)
    k_d = qkv_d[:, hd : hd + hkv * d].view(-1, hkv, d)
    v_d = qkv_d[:, hd + hkv * d :].view(-1, hkv, d)
    rope_append_kv(q_d, k_d, v_d, dev(cos), dev(sin), caches_d[0], caches_d[1], dev(table), dev(lens), dev(cu),
                   qk_norm=norm_d, backend="triton")
    # interpreter: float32 -> bfloat16 casts truncate (tests/kernels/test_llama_ops_triton.py)
    tol = TOL[dtype] * (1 if dtype != torch.bfloat16 or torch.device(device).type == "cuda" else 3)
    torch.testing.assert_close(qkv_d.cpu(), qkv_ref, rtol=tol, atol=tol)  # q rotated; k, v untouched
    assert torch.equal(qkv_d[:, hd:].cpu(), qkv[:, hd:]), "k and v are only read"
    torch.testing.assert_close(caches_d.cpu(), caches_ref, rtol=tol, atol=tol)
    assert torch.equal(caches_d[1].cpu(), caches_ref[1]), "v is copied bit for bit"
    changed = (caches_ref != caches).any(-1).any(-1).sum().item()
    assert changed == sum(counts) * 2 or dtype != torch.float32, "every real token wrote K and V (and padding none)"


# (Hq, Hkv, D, rotated R, dtype, q/k norms): a partial rotary embedding (GLM-4.5: R = D / 2), R / 2
# and D - R not powers of 2, with the norms over all D dims
PARTIAL = {"half_of_64_fp32": (4, 2, 64, 32, torch.float32, False),
           "40_of_80_bf16_norms": (4, 2, 80, 40, torch.bfloat16, True),
           "48_of_64_fp32_norms_mha": (3, 3, 64, 48, torch.float32, True)}


@pytest.mark.parametrize("name", list(PARTIAL))
def test_partial_rotary(name, device):
    """cos / sin [T, R], R < D: the first R dims of q and k rotated (i paired with i + R/2), the other
    D - R passed (normed where the norms are given), V copied whole; the torch reference equals
    transformers' apply_rotary_pos_emb of a partial model (GLM-4.5's), the Triton kernel the
    reference; a full-width rotation of the same angles differs (the control)."""
    from transformers.models.glm4_moe.modeling_glm4_moe import apply_rotary_pos_emb

    hq, hkv, d, rot, dtype, qk_norm = PARTIAL[name]
    qkv, q, k, v, cos, sin, caches, table, lens, cu, norm = _case(hq, hkv, d, 4, dtype, [3, 2], qk_norm, "cpu", 7)
    cos, sin = cos[:, : rot // 2].repeat(1, 2).contiguous(), sin[:, : rot // 2].repeat(1, 2).contiguous()
    got = {}
    for backend, dev in (("torch", "cpu"), ("triton", device)):
        if backend == "triton":
            pytest.importorskip("triton")
        q_b, caches_b = q.clone().to(dev), caches.clone().to(dev)
        norm_b = None if norm is None else (norm[0].to(dev), norm[1], norm[2].to(dev), norm[3])
        rope_append_kv(q_b, k.to(dev), v.to(dev), cos.to(dev), sin.to(dev), caches_b[0], caches_b[1], table.to(dev),
                       lens.to(dev), cu.to(dev), qk_norm=norm_b, backend=backend)
        got[backend] = (q_b.cpu(), caches_b.cpu())
    if norm is None:  # transformers' own partial rotation of q (heads first: [1, H, T, D])
        theirs, _ = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
        assert torch.equal(got["torch"][0], theirs[0].transpose(0, 1))
    tol = TOL[dtype] * (1 if dtype != torch.bfloat16 or torch.device(device).type == "cuda" else 3)
    torch.testing.assert_close(got["triton"][0], got["torch"][0], rtol=tol, atol=tol)
    torch.testing.assert_close(got["triton"][1], got["torch"][1], rtol=tol, atol=tol)
    full = torch.cat((cos, cos[:, : d - rot]), 1) if d - rot <= rot else None
    if full is not None:  # the control: every dim rotated (other pairs) gives another q
        q_full = q.clone()
        rope_append_kv(q_full, k, v, full, torch.cat((sin, sin[:, : d - rot]), 1), caches.clone()[0], caches.clone()[1],
                       table, lens, cu, qk_norm=norm, backend="torch")
        assert not torch.allclose(q_full, got["torch"][0], atol=1e-3)


@pytest.mark.parametrize("rotary", [16, 10])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_query_scale(dtype, rotary, device):
    """q_scale (Ministral 3's per-token temperature) multiplies each token's rotated query (all of
    it: with a partial rotation, the passed dims too), rounded as `q * scale` in the model dtype, on
    both backends; K and V are not scaled; without it the query differs (the control)."""
    hq, hkv, d, bs = 4, 2, 16, 4
    qkv, q, k, v, cos, sin, caches, table, lens, cu, _ = _case(hq, hkv, d, bs, dtype, [3, 2], False, "cpu", 5)
    cos, sin = cos[:, : rotary // 2].repeat(1, 2).contiguous(), sin[:, : rotary // 2].repeat(1, 2).contiguous()
    scale = (1 + 0.3 * torch.arange(q.shape[0], dtype=torch.float32)).to(dtype)
    got = {}
    for backend, dev in (("torch", "cpu"), ("triton", device)):
        if backend == "triton":
            pytest.importorskip("triton")
        q_b, caches_b = q.clone().to(dev), caches.clone().to(dev)
        rope_append_kv(q_b, k.to(dev), v.to(dev), cos.to(dev), sin.to(dev), caches_b[0], caches_b[1], table.to(dev),
                       lens.to(dev), cu.to(dev), q_scale=scale.to(dev), backend=backend)
        got[backend] = (q_b.cpu(), caches_b.cpu())
    plain, plain_caches = q.clone(), caches.clone()
    rope_append_kv(plain, k, v, cos, sin, plain_caches[0], plain_caches[1], table, lens, cu, backend="torch")
    assert torch.equal(got["torch"][0], plain * scale[:, None, None]) and torch.equal(got["torch"][1], plain_caches)
    # interpreter: float32 -> bfloat16 casts truncate (as test_matches_reference)
    tol = TOL[dtype] * (1 if dtype != torch.bfloat16 or torch.device(device).type == "cuda" else 3)
    torch.testing.assert_close(got["triton"][0], got["torch"][0], rtol=tol, atol=tol)
    torch.testing.assert_close(got["triton"][1], got["torch"][1], rtol=tol, atol=tol)
    assert not torch.allclose(got["triton"][0], plain, atol=1e-2)


def test_exact_in_float16_and_float32(device):
    """fp16/fp32: each product and the sum rounded as torch rounds them: equal bit for bit."""
    for dtype in (torch.float16, torch.float32):
        qkv, q, k, v, cos, sin, caches, table, lens, cu, norm = _case(4, 2, 32, 16, dtype, [2, 3], False, "cpu", 5)
        q_ref, caches_ref = q.clone(), caches.clone()
        rope_append_kv_reference(q_ref, k, v, cos, sin, caches_ref[0], caches_ref[1], table, lens, cu)
        qkv_d, caches_d = qkv.clone().to(device), caches.clone().to(device)
        q_d = qkv_d[:, :128].view(-1, 4, 32)
        rope_append_kv(q_d, qkv_d[:, 128:192].view(-1, 2, 32), qkv_d[:, 192:].view(-1, 2, 32), cos.to(device),
                       sin.to(device), caches_d[0], caches_d[1], table.to(device), lens.to(device), cu.to(device),
                       backend="triton")
        if dtype == torch.float32 and torch.device(device).type == "cuda":
            continue  # the compiler may contract x * c - y * s into an FMA (one rounding fewer)
        assert torch.equal(q_d.cpu(), q_ref) and torch.equal(caches_d.cpu(), caches_ref), dtype


def test_bad_input(device):
    q, kv = torch.randn(2, 4, 8), torch.randn(2, 2, 8)
    cos = torch.randn(2, 8)
    caches = torch.zeros(2, 3, 4, 2, 8)
    table, lens, cu = torch.zeros(1, 3, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32)
    args = (caches[0], caches[1], table, lens, cu)
    with pytest.raises(ValueError, match="head_dim must be even"):
        rope_append_kv(torch.randn(2, 4, 7), kv[..., :7], kv[..., :7], cos[:, :7], cos[:, :7], *args)
    with pytest.raises(ValueError, match="cos must have shape"):
        rope_append_kv(q, kv, kv, cos[:1], cos, *args)
    with pytest.raises(ValueError, match="qk_norm must be"):
        rope_append_kv(q, kv, kv, cos, cos, *args, qk_norm=(torch.ones(7), 1e-6, torch.ones(8), 1e-6))
    with pytest.raises(ValueError, match="k_new and v_new must both be"):
        rope_append_kv(*(t.to(device) for t in (q, kv[:, :1], kv, cos, cos, *args)), backend="triton")
    with pytest.raises(ValueError, match="no C\\+\\+ backend"):
        rope_append_kv(q, kv, kv, cos, cos, *args, backend="cpp")
