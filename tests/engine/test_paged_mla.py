"""Multi-head latent attention on the paged runner (runners/paged_mla.py): DeepSeek-V3 (a low-rank
query, interleaved RoPE, YaRN with its mscale in the softmax scale, a dense first layer, grouped
sigmoid routing with a shared MLP; 3 layers, so one cache entry holds a single layer), the same
without a query rank (q_proj, rotate-half RoPE), GLM-4.7-Flash (glm4_moe_lite) and DeepSeek-V2
(RoPE on complex pairs in float32; softmax routing, greedy as V2-Lite's and group-limited as V2's).

The pool holds one latent plane a layer: two layers share an entry of the usual K / V layout. The
runner's logits equal the model's own forward on every backend (prefill, left-padded score calls,
rollback; the absorbed products differ by rounding only); bfloat16 stays close; greedy
generate(runner="paged") equals model.generate with a draft, prompt lookup, plain decoding and a
token tree (compact_kv moves both layers of a shared entry); the static graph twin gives the eager
tokens. Controls: the interleaved RoPE, the YaRN scale and the shared planes are each needed; the
runner with a K and a V plane a layer gives the same logits from twice the pool. Refusals by name.

DeepSeek-V3.2 (one of the kinds above) and GLM-5 (DSA_KINDS: DeepSeek Sparse Attention): within index_topk the
dense path; past it (index_topk 6) the sparse path (runners/sparse_mla.py) equals the model's own forward and
generate where its choice has no tie at the k-th key (index_ties), on every backend, from a NaN-filled pool too;
control: past index_topk the model's logits differ from every-key-chosen ones."""
import contextlib

import pytest
import torch

import specdec_fast
import specdec_fast.api as api
from specdec_fast.runners.paged_mla import PagedMlaRunner, mla_scale, mla_unsupported_reason
from specdec_fast.runners.registry import choose_runner, paged_runner_class

from ..conftest import backend_device
from .models import left_padded_prompts, make_draft
from .runner_checks import assert_bf16_close_to_forward, assert_runner_matches_forward, hf_logits

VOCAB = 96
KINDS = ("deepseek_v3", "deepseek_v3_q_proj", "glm4_moe_lite", "deepseek_v2", "deepseek_v2_groups", "deepseek_v32",
         "axk1")
DSA_KINDS = ("deepseek_v32", "glm_moe_dsa")  # DeepSeek Sparse Attention: dense within index_topk (64 here)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}


def tiny_mla(kind: str, seed: int = 0, **overrides):
    """A random fp32 MLA model of ``kind``: 4 heads, r = 32, dn = 16, dr = 8, dv = 12; 16 experts of 32
    in 4 groups (2 kept), top 2, a shared MLP; layer 0 dense."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=256, initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  num_experts_per_tok=2, n_routed_experts=16, moe_intermediate_size=32, n_group=4, topk_group=2,
                  routed_scaling_factor=2.5, n_shared_experts=1, kv_lora_rank=32, qk_rope_head_dim=8,
                  qk_nope_head_dim=16, v_head_dim=12)
    if kind == "deepseek_v3":
        config = tf.DeepseekV3Config(num_hidden_layers=3, first_k_dense_replace=1, q_lora_rank=24, rope_parameters=YARN,
                                     **dict(common, **overrides))
    elif kind == "deepseek_v3_q_proj":
        config = tf.DeepseekV3Config(num_hidden_layers=2, first_k_dense_replace=1, q_lora_rank=None, rope_interleave=False,
                                     **dict(common, **overrides))
    elif kind in DSA_KINDS:  # V3's layer (interleaved RoPE always) with an indexer choosing index_topk keys a query;
        # GLM-5's second layer reuses the first's choice (indexer_types "shared")
        dsa = dict(num_hidden_layers=3, first_k_dense_replace=1, q_lora_rank=24, index_topk=64, index_head_dim=16,
                   index_n_heads=2, rope_parameters=YARN if kind == "deepseek_v32" else None)
        if kind == "glm_moe_dsa":
            dsa["indexer_types"] = ["full", "shared", "full"]
        cls = tf.DeepseekV32Config if kind == "deepseek_v32" else tf.GlmMoeDsaConfig
        config = cls(**dict(dsa, **common, **overrides))
    elif kind == "glm4_moe_lite":
        config = tf.Glm4MoeLiteConfig(num_hidden_layers=2, q_lora_rank=24, **dict(common, **overrides))
    elif kind == "axk1":  # A.X-K1: V3's layer, the MoE block's output normed (post_mlp_layernorm: randomised below)
        config = tf.AXK1Config(num_hidden_layers=3, first_k_dense_replace=1, q_lora_rank=24, rope_parameters=YARN,
                               **dict(common, **overrides))
    else:  # DeepSeek-V2: softmax routing, greedy (V2-Lite) or group-limited (V2), never renormalised; no query rank
        # (V2-Lite's) or one (V2's); RoPE on complex pairs
        groups = kind == "deepseek_v2_groups"
        v2 = {k: v for k, v in common.items() if k != "n_group" and k != "topk_group"}
        config = tf.DeepseekV2Config(num_hidden_layers=2, first_k_dense_replace=1, q_lora_rank=24 if groups else None,
                                     topk_method="group_limited_greedy" if groups else "greedy",
                                     **(dict(n_group=4, topk_group=1) if groups else {}),  # 1 group: the limit bites
                                     rope_parameters=YARN if groups else {"rope_type": "default", "rope_theta": 10000.0},
                                     **dict(v2, **overrides))
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:  # the router's correction bias (a buffer): it changes which experts win
            bias = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
            if bias is not None:
                bias.normal_(0, 0.5)
            out_norm = getattr(layer.mlp, "post_mlp_layernorm", None)  # A.X-K1's (ones at init)
            if out_norm is not None:
                out_norm.weight.normal_(1.0, 0.3)
    model.generation_config.eos_token_id = None
    return model


def test_the_pool_holds_one_latent_plane_per_layer():
    model = tiny_mla("deepseek_v3")
    assert paged_runner_class(model) is PagedMlaRunner and mla_unsupported_reason(model) is None
    runner = PagedMlaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    runner.allocate(2, 20)
    (cache,) = runner.caches
    assert tuple(cache.kv.shape) == (2, 2, 10, 4, 1, 40)  # 3 layers in 2 entries; one head of r + dr = 40
    planes = [(t.data_ptr(), u.data_ptr()) for t, u in zip(runner.k_caches, runner.v_caches)]
    assert all(k == v for k, v in planes) and len({k for k, _ in planes}) == 3  # the key is the value; 3 planes
    assert runner.kv_sizes(2, 20) == (2 * 2 * 40 * 4, 0)  # bytes a token: 2 entries of K and V planes, fp32
    assert runner.kv_bytes == cache.kv.numel() * 4


@pytest.mark.parametrize("kind", KINDS)
def test_the_scale_from_the_config_is_the_modules(kind):
    """mla_scale (the tensor-parallel runner's: no module there) equals transformers' scaling to the bit:
    qk_head_dim^-0.5, times YaRN's mscale^2 (deepseek_v3, deepseek_v2_groups) or not."""
    model = tiny_mla(kind)
    assert mla_scale(model.config) == model.model.layers[0].self_attn.scaling


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_hf_forward(kind, backend, device):
    device = backend_device(backend, device)
    model = tiny_mla(kind).to(device)
    runner = PagedMlaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert [layer.moe is not None for layer in runner.layers] == [False] + [True] * (len(runner.layers) - 1)
    assert_runner_matches_forward(model, runner, VOCAB)


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_close_to_the_float32_forward(kind):
    reference = tiny_mla(kind)
    model = tiny_mla(kind).to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedMlaRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB,
                                 reference=reference)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_paged_equals_generate(kind, batch):
    target = tiny_mla(kind, seed=5)
    ids, mask = left_padded_prompts([6] if batch == 1 else [4, 10, 7], vocab=VOCAB, seed=batch)
    kw = dict(do_sample=False, max_new_tokens=20, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, **kw)
    for drafting in (dict(assistant_model=make_draft(target, noise=0.03), num_assistant_tokens=3),
                     dict(prompt_lookup_num_tokens=2), {}):
        out = api.generate(target, ids, mask, runner="paged", **kw, **drafting)  # runner="paged": no fallback
        assert torch.equal(out, expected), drafting
    specdec_fast.release_engines(target)


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_youtu_a_dense_latent_attention_model(backend, device):
    """Youtu-LLM (youtu): DeepSeek-V3's latent attention in a dense Llama layer, its embedding tied: the MLA runner's
    logits equal the forward on every backend; greedy equals model.generate (a draft, prompt lookup, plain)."""
    from .models import make_model

    device = backend_device(backend, device)
    model = make_model("youtu", vocab=VOCAB, layers=2).to(device)
    model.generation_config.eos_token_id = None
    runner = PagedMlaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert paged_runner_class(model) is PagedMlaRunner and all(layer.moe is None for layer in runner.layers)
    assert_runner_matches_forward(model, runner, VOCAB)
    if backend == "cpp":
        from .runner_checks import assert_greedy_paged_equals_generate

        assert_greedy_paged_equals_generate(model, VOCAB)


def test_a_token_tree_compacts_both_layers_of_an_entry(monkeypatch):
    """Tree decoding commits the accepted path through compact_kv, which moves every entry's two
    planes: here layers 0 / 1 share entry 0 and layer 2 has entry 1 alone. The tokens are greedy's."""
    from specdec_fast.kernels import cache_ops

    target = tiny_mla("deepseek_v3", seed=2)
    ids, mask = left_padded_prompts([5, 8], vocab=VOCAB, seed=4)
    kw = dict(do_sample=False, max_new_tokens=16, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, **kw)
    moved, real = [], cache_ops.compact_kv
    monkeypatch.setattr("specdec_fast.runners.paged_base.compact_kv",
                        lambda caches, *a, **k: moved.append(tuple(caches.shape[:2])) or real(caches, *a, **k))
    out = api.generate(target, ids, mask, runner="paged", assistant_model=make_draft(target, noise=0.05),
                       tree="static", **kw)
    specdec_fast.release_engines(target)
    assert torch.equal(out, expected)
    assert (2, 2) in moved  # the target's pool: 2 entries of 2 planes


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny_mla("deepseek_v3", seed=3), VOCAB)


def _next_logits(runner, tokens) -> torch.Tensor:
    """The logits after tokens[-1], scored over a cache that a prefill of tokens[:-1] wrote (a layer's
    plane read past the forward that wrote it)."""
    runner.prefill(torch.tensor([tokens[:-1]], device=runner.device), None, max_new_tokens=2, num_draft_tokens=0)
    return runner.score(torch.tensor([tokens[-1:]], device=runner.device))[0, -1]


def test_controls_rope_layout_scale_and_planes():
    """Each spoiled piece moves the logits off the forward's: the interleaved RoPE read as rotate-half,
    the softmax scale without YaRN's mscale^2, two layers on one plane. A K and a V plane a layer
    (kv_latent off) gives the same logits from twice the pool."""
    model = tiny_mla("deepseek_v3")
    tokens = [5, 9, 3, 7, 11, 4, 8]
    expected = hf_logits(model, tokens)[-1]

    def logits(spoil=None, cls=PagedMlaRunner):
        runner = cls(model, max_new_tokens=2, num_draft_tokens=1, block_size=4)
        if spoil is not None:
            spoil(runner)
        return _next_logits(runner, tokens), runner

    got, runner = logits()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    for spoil in (lambda r: setattr(r, "rope_form", "half"), lambda r: setattr(r, "scale", 24 ** -0.5)):
        assert not torch.allclose(logits(spoil)[0], expected, atol=1e-2, rtol=0)

    class OnePlane(PagedMlaRunner):  # layer 1 written over layer 0's plane: layer 0 then reads layer 1's latents
        def _allocate(self, *a):
            super()._allocate(*a)
            self.k_caches[1] = self.v_caches[1] = self.k_caches[0]

    assert not torch.allclose(logits(cls=OnePlane)[0], expected, atol=1e-2, rtol=0)

    class TwoPlanes(PagedMlaRunner):
        kv_latent = False

    got, two = logits(cls=TwoPlanes)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert two.kv_bytes == 3 * runner.kv_bytes // 2  # 3 entries of 2 planes against 2 (3 layers)
    assert two.kv_sizes(1, 16)[0] == 3 * runner.kv_sizes(1, 16)[0] // 2


def test_the_triton_path_runs_the_mla_kernel(monkeypatch, device):
    """On the Triton path every layer's attention is kernels/attention/triton_mla.py's (prefill and
    score), with the latent as wide as DeepSeek-V3's (512 + 64), and the logits are the forward's."""
    from specdec_fast.kernels.attention import triton_mla

    device = backend_device("triton", device)
    model = tiny_mla("deepseek_v3_q_proj", kv_lora_rank=512, qk_rope_head_dim=64).to(device)
    calls, real = [], triton_mla.mla_attention_triton
    monkeypatch.setattr(triton_mla, "mla_attention_triton", lambda q, *a, **k: calls.append(tuple(q.shape)) or real(q, *a, **k))
    runner = PagedMlaRunner(model, max_new_tokens=4, num_draft_tokens=1, block_size=4, backend="triton")
    tokens = [5, 9, 3, 7, 11]
    got = _next_logits(runner, tokens).cpu()
    torch.testing.assert_close(got, hf_logits(model, tokens)[-1], atol=1e-4, rtol=1e-4)
    assert calls == [(4, 4, 576)] * 2 + [(1, 4, 576)] * 2  # 2 layers: the prefill of 4, the score of 1


def test_refusals():
    """A latent wider than the MLA Triton kernel takes is refused on it by name (the hf runner takes
    the model); a RoPE whose frequencies change with the length too; another family's model is not
    this runner's."""
    pytest.importorskip("triton")
    wide = tiny_mla("deepseek_v3_q_proj", kv_lora_rank=1024)
    reason = mla_unsupported_reason(wide, backend="triton")
    assert reason is not None and "kv_lora_rank <= 512" in reason
    assert mla_unsupported_reason(wide) is None  # the C++ attention takes any head dim
    assert choose_runner(wide, None, 32, backend="triton") == "hf"
    dynamic = tiny_mla("deepseek_v3_q_proj", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                                               "factor": 2.0})
    reason = mla_unsupported_reason(dynamic, max_tokens_per_row=512)
    assert reason is not None and "dynamic" in reason
    from .test_paged_moe import tiny_moe

    assert "is not one of" in mla_unsupported_reason(tiny_moe("glm4_moe"))


def test_control_axk1_norms_its_moe_blocks_output():
    """A.X-K1's sparse layers norm their MoE block's output (routed + shared experts): the runner reads that norm
    there alone (layer 0 is dense), and without it the logits are not the model's."""
    model = tiny_mla("axk1")
    runner = PagedMlaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert [layer.moe_out_norm is not None for layer in runner.layers] == [False, True, True]
    for layer in runner.layers:
        layer.moe_out_norm = None
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


@pytest.mark.parametrize("kind", ["deepseek_v2", "deepseek_v2_groups", "deepseek_v3"])
def test_the_moe_block_equals_transformers(kind):
    """The MoE block of each routing (DeepSeek-V2's softmax, greedy and group-limited; V3's grouped
    sigmoid) equals transformers' own over 40 tokens; a control: V2's group limit ignored changes
    the output (the test would see a router that skips it)."""
    from specdec_fast.runners import _moe

    model = tiny_mla(kind)
    block = model.model.layers[1].mlp
    moe = _moe.MoE(block, model.config, "torch")
    h = torch.randn(40, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = block(h[None])[0]
        torch.testing.assert_close(moe(h), theirs, atol=1e-5, rtol=1e-5)
        if kind == "deepseek_v2_groups":
            moe.group_limited = False
            assert (moe(h) - theirs).abs().max() > 1e-3


@pytest.mark.parametrize("head", ["eagle3", "dflash"])
def test_draft_heads_read_its_hidden_states(head):
    """An EAGLE-3 head and a DFlash block drafter over DeepSeek-V3: greedy equals model.generate."""
    from .heads import assert_head_drafts_greedy

    assert_head_drafts_greedy(tiny_mla("deepseek_v3", seed=4), head, VOCAB)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_prefill_with_the_latents_expanded(kind, backend, monkeypatch, device):
    """expand_prefill_min lowered to 1: every prefill's attention runs expanded (per-head keys and values,
    SDPA over each row's own tokens), while its latents are cached for the score calls that follow
    (absorbed): the logits still equal the forward's through assert_runner_matches_forward's calls."""
    monkeypatch.setattr(PagedMlaRunner, "expand_prefill_min", 1)
    taken, real = [], PagedMlaRunner._expanded_attention
    monkeypatch.setattr(PagedMlaRunner, "_expanded_attention", lambda self, *a: taken.append(1) or real(self, *a))
    device = backend_device(backend, device)
    model = tiny_mla(kind).to(device)
    runner = PagedMlaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert_runner_matches_forward(model, runner, VOCAB)
    assert len(taken) == len(runner.layers)  # the one prefill, every layer


@contextlib.contextmanager
def index_ties(model):
    """While open, counts into the yielded list the queries whose own DSA indexer (``model``'s: transformers')
    took its k-th key among keys of equal finite score: there torch.topk's order among ties decides, which
    differs between tensor shapes (transformers' own cached and uncached forwards then choose differently
    too), so a comparison with transformers holds only where there is none (runners/sparse_mla.py)."""
    found, real_topk = [], torch.Tensor.topk

    def counting_topk(scores, k, dim=-1, *args, **kwargs):
        top = real_topk(scores, k, dim, *args, **kwargs)
        if scores.shape[-1] > k:
            kth = top.values[..., -1:]
            found.append(int((torch.isfinite(kth[..., 0]) & ((scores == kth).sum(-1) > (top.values == kth).sum(-1))).sum()))
        return top

    def counted(forward):
        def run(*args, **kwargs):
            torch.Tensor.topk = counting_topk
            try:
                return forward(*args, **kwargs)
            finally:
                torch.Tensor.topk = real_topk
        return run

    indexers = [layer.self_attn.indexer for layer in model.model.layers if getattr(layer.self_attn, "indexer", None)]
    for indexer in indexers:
        indexer.forward = counted(indexer.forward)
    try:
        yield found
    finally:
        for indexer in indexers:
            del indexer.forward


@pytest.mark.parametrize("kind", DSA_KINDS)
def test_sparse_attention_within_index_topk_is_dense(kind):
    """DeepSeek-V3.2 / GLM-5 in a pool whose rows fit index_topk run the dense path (the indexer chooses every
    visible key): the runner's logits equal the model's own forward (indexer and all). The pool holds the
    indexers' key planes beside the latents' all the same (a layer's [Di] a token: GLM-5's shared layer has none)."""
    model = tiny_mla(kind)
    assert paged_runner_class(model) is PagedMlaRunner and mla_unsupported_reason(model, max_tokens_per_row=4096) is None
    assert mla_scale(model.config) == model.model.layers[0].self_attn.scaling
    runner = PagedMlaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.layer_windows == (None,) * 3
    assert_runner_matches_forward(model, runner, VOCAB)
    assert not runner._sparse  # rows of 9 + 8 + 4 tokens at most
    indexers = 3 if kind == "deepseek_v32" else 2
    runner.allocate(2, 20)
    assert [tuple(c.kv.shape) for c in runner.caches] == [(2, 2, 10, 4, 1, 40), ((indexers + 1) // 2, 2, 10, 4, 1, 16)]
    assert runner.kv_sizes(2, 20) == ((2 * 2 * 40 + (indexers + 1) // 2 * 2 * 16) * 4, 0)


@pytest.mark.parametrize("kind", DSA_KINDS)
def test_sparse_attention_past_index_topk(kind):
    """Past index_topk (6 here) the indexer chooses among the keys. Control: the model's own logits there
    differ from the same weights' with every key chosen, and equal them before. A pool whose rows may pass it
    runs every call sparse (runners/sparse_mla.py): its logits equal the model's own forward through prefill,
    left-padded score calls and rollback; greedy generate equals model.generate with a draft and without, and
    the static graph twin gives the eager tokens -- each where the model's own choices have no tie at the k-th
    key (index_ties; 16 index heads make them rare in these random models). Token trees are refused there."""
    from specdec_fast.runners.hf import UnsupportedModelError

    sparse, dense = tiny_mla(kind, index_topk=6, index_n_heads=16), tiny_mla(kind, index_topk=64, index_n_heads=16)
    tokens = [5, 9, 3, 7, 11, 4, 8, 12, 6, 10, 13, 14]
    ours, full = hf_logits(sparse, tokens), hf_logits(dense, tokens)
    torch.testing.assert_close(ours[:6], full[:6])
    assert (ours[7:] - full[7:]).abs().amax(-1).min() > 1e-3  # past index_topk + 1 (position 6 drops one key of 7)
    assert choose_runner(sparse, None, 4096) == "paged"
    runner = PagedMlaRunner(sparse, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    with index_ties(sparse) as ties:
        assert_runner_matches_forward(sparse, runner, VOCAB)
    assert runner._sparse and sum(ties) == 0
    with pytest.raises(UnsupportedModelError, match="token trees"):
        runner.score(torch.tensor([[5, 6]] * 3), tree=(torch.ones(2, dtype=torch.int64), torch.arange(2)))
    target = tiny_mla(kind, seed=6, index_topk=6, index_n_heads=16)
    ids, mask = left_padded_prompts([4, 10, 7], vocab=VOCAB, seed=3)
    kw = dict(do_sample=False, max_new_tokens=12, pad_token_id=0)
    with index_ties(target) as ties:
        expected = target.generate(ids, attention_mask=mask, **kw)
        target(expected, attention_mask=torch.cat((mask, torch.ones(3, 12, dtype=mask.dtype)), dim=1))
    assert sum(ties) == 0
    draft = make_draft(target, noise=0.03)
    for drafting in (dict(assistant_model=draft, num_assistant_tokens=3), {}):
        assert torch.equal(api.generate(target, ids, mask, runner="paged", **kw, **drafting), expected), drafting
    static = api.generate(target, ids, mask, runner="paged", assistant_model=draft, num_assistant_tokens=3,
                          cuda_graphs="static", backend="cpp", **kw)
    assert torch.equal(static, expected)
    specdec_fast.release_engines(target)


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_sparse_attention_reads_no_unwritten_slot(backend):
    """Every cache of a sparse pool (latents, indexer keys) filled with NaN first: the logits still equal the
    model's forward. (The chosen positions past a short row's query once read such slots: 0 x NaN in the
    weighted sum gave NaN logits, now and then, from the uninitialised pool.)"""
    model = tiny_mla("glm_moe_dsa", index_topk=6, index_n_heads=16)
    runner = PagedMlaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    runner.allocate(3, 9 + 8 + 4)  # the rows' reservations fill their tables: no table entry falls back to block 0
    for cache in runner.caches:
        cache.kv.fill_(float("nan"))
    assert_runner_matches_forward(model, runner, VOCAB)
    assert runner._sparse and all(cache.kv.isnan().any() for cache in runner.caches)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sparse_attention_on_the_other_backends(backend, device):
    """The sparse path's keys and latents appended by the torch and Triton kernels (its choice and attention are
    torch ops on every backend): the logits equal the model's own forward, as on the C++ path above."""
    device = backend_device(backend, device)
    model = tiny_mla("glm_moe_dsa", index_topk=6, index_n_heads=16).to(device)
    runner = PagedMlaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    with index_ties(model) as ties:
        assert_runner_matches_forward(model, runner, VOCAB)
    assert runner._sparse and sum(ties) == 0
