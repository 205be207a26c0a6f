"""The OLMo runner's own controls (its shared checks: test_paged_families.py): OLMo 2's RMSNorm
weighs in float32 (bfloat16 rounds otherwise) and OLMo 3 rotates each layer type with its RoPE; EXAONE 4.0's
NoPE full layers and per-head q / k norms."""
import pytest
import torch

from specdec_fast.runners.paged_olmo2 import PagedOlmo2Runner, olmo_rms_norm

from .family_models import VOCAB, tiny_family
from .runner_checks import assert_runner_matches_forward


def test_the_norms_weigh_in_float32():
    """In bfloat16, multiplying by the weight after the cast (Llama's RMSNorm) rounds differently
    from OLMo 2's float32 product, which is the model's and the runner's."""
    model = tiny_family("olmo2").to(torch.bfloat16)
    norm = model.model.layers[0].post_attention_layernorm
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(olmo_rms_norm(x, (norm.weight, norm.variance_epsilon)), norm(x))
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    llama_style = norm.weight * normed.to(x.dtype)
    assert not torch.equal(llama_style, norm(x))


def test_olmo3_takes_each_layer_type_s_rope():
    """Its two tables differ, and a runner that rotates every layer with the sliding layers'
    table no longer gives the model's logits."""
    model = tiny_family("olmo3")
    runner = PagedOlmo2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.rope_keys == ["sliding_attention", "full_attention"]
    sliding, full = runner.rope_tables["sliding_attention"], runner.rope_tables["full_attention"]
    assert not torch.equal(sliding[0], full[0])
    runner.rope_keys = ["sliding_attention"] * 2
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_controls_exaone4_nope_full_layers_and_per_head_norms():
    """EXAONE 4.0 on this runner: its full layers are NoPE (where a window is set) and its q / k norms weigh each
    head ([D] weights); rotating every layer, or the per-head norms' weights left out (ones), moves the logits off
    the forward's."""
    model = tiny_family("exaone4")
    runner = PagedOlmo2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert [layer.rope for layer in runner.layers] == [True, False] and runner.llama_pieces
    assert_runner_matches_forward(model, runner, VOCAB)
    def unit_qk_norms(r):
        for layer in r.layers:
            layer.q_norm = (torch.ones_like(layer.q_norm[0]), layer.q_norm[1])

    for spoil in (lambda r: setattr(r.layers[1], "rope", True), unit_qk_norms):
        spoiled = PagedOlmo2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
        spoil(spoiled)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, spoiled, VOCAB)


def test_controls_flex_olmo_routes_its_experts():
    """FlexOlmo: every layer's MLP is OLMoE's experts (renormalised top 2 of 8); dropping the renormalisation changes
    the logits -- visible with a large norm epsilon only: the post-feedforward RMSNorm cancels a per-token scale
    (at eps 1e-6 the difference was 5e-5, under the tolerance)."""
    model = tiny_family("flex_olmo", rms_norm_eps=1.0)
    runner = PagedOlmo2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert all(layer.moe is not None and layer.moe.renorm for layer in runner.layers)
    assert_runner_matches_forward(model, runner, VOCAB)
    for layer in runner.layers:
        layer.moe.renorm = False
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_controls_olmo1_clamps_its_projections_and_norms_without_weights():
    """OLMo 1 (paged_olmo.py): q / k / v clamped to clip_qkv (1.5 here: some values reach it) before RoPE, and
    weightless float32 LayerNorms; without the clamp, or with Llama's RMSNorm for its LayerNorm, the logits are not
    the model's."""
    from specdec_fast.runners import paged_olmo
    from specdec_fast.runners._layer_math import rms_norm_reference

    model = tiny_family("olmo")
    runner = paged_olmo.PagedOlmoRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    h = paged_olmo.olmo_layer_norm(model.model.embed_tokens.weight[:40])
    q = torch.nn.functional.linear(h, *runner.layers[0].q)
    assert runner.clip == 1.5 and 0 < (q.abs() > 1.5).float().mean() < 0.5
    runner.clip = None
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paged_olmo, "olmo_layer_norm", lambda x: rms_norm_reference(x, torch.ones_like(x[0]), 1e-5))
        runner = paged_olmo.PagedOlmoRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, runner, VOCAB)
