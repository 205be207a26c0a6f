"""The Gemma runner's own controls and refusals, Gemma 1, 2 and 3 (its shared checks: test_paged_families.py)."""
import pytest
import torch

from specdec_fast.runners.paged_gemma import PagedGemmaRunner, gemma_rms_norm
from specdec_fast.runners.registry import paged_unsupported_reason

from .family_models import VOCAB, tiny_family
from .models import gemma3_multimodal
from .runner_checks import assert_runner_matches_forward


def test_controls_each_gemma_piece_is_needed():
    """Leaving out the soft-cap, using one RoPE table for every layer, or Llama's scale in place of
    query_pre_attn_scalar's breaks the logits; the norm is Gemma's (1 + weight) in float32."""
    model = tiny_family("gemma3")
    for spoil in (lambda r: setattr(r, "softcap", None), lambda r: setattr(r, "rope_keys", ["full_attention"] * 2),
                  lambda r: setattr(r, "scale", r.head_dim**-0.5)):
        runner = PagedGemmaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
        assert runner.rope_keys == ["sliding_attention", "full_attention"]
        spoil(runner)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, runner, VOCAB)
    norm = model.model.layers[0].post_feedforward_layernorm.to(torch.bfloat16)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(gemma_rms_norm(x, (norm.weight, norm.eps)), norm(x))


def test_controls_gemma2_needs_both_soft_caps_and_no_qk_norm():
    """Gemma 2: the attention soft-cap (in the kernels) and the final one are each needed; it has
    no q / k norms (Gemma 3's)."""
    model = tiny_family("gemma2")
    runner = PagedGemmaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.attn_softcap == 1.5 and runner.layers[0].q_norm is None
    assert_runner_matches_forward(model, runner, VOCAB)
    for spoil in (lambda r: setattr(r, "attn_softcap", None), lambda r: setattr(r, "softcap", None)):
        runner = PagedGemmaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
        spoil(runner)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, runner, VOCAB)


def test_control_vaultgemma_norms_no_branch_output():
    """VaultGemma: Gemma 2's layer (its attention soft-cap read) whose branches' outputs are added unnormed (the
    runner's post norms None); norming them with the next input norms, as Gemma 2 would, breaks the logits."""
    model = tiny_family("vaultgemma")
    runner = PagedGemmaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.attn_softcap == 1.5 and all(layer.post_attention is None and layer.post_feedforward is None
                                              for layer in runner.layers)
    for layer in runner.layers:
        layer.post_attention = layer.post_feedforward = layer.pre_feedforward
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_control_gemma1s_second_norm_is_the_mlps_input():
    """Gemma 1: post_attention_layernorm is the MLP's input norm (Llama's layout) and no branch is
    normed; norming the attention branch with it, as Gemma 2 / 3 do theirs, breaks the logits."""
    model = tiny_family("gemma")
    runner = PagedGemmaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.layers[0].post_attention is None and runner.softcap is None and runner.scale == 16**-0.5
    for layer in runner.layers:
        layer.post_attention = layer.pre_feedforward
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_refusals():
    """Bidirectional attention (EmbeddingGemma) by name. Attention soft-capping is no refusal: the
    kernels cap Gemma 2's scores, and Gemma 3's attention never reads the field (a config that sets
    it gives the forward's logits with no cap)."""
    capped = tiny_family("gemma3", attn_logit_softcapping=1.5)
    assert paged_unsupported_reason(capped) is None
    assert_runner_matches_forward(capped, PagedGemmaRunner(capped, max_new_tokens=8, num_draft_tokens=3, block_size=4),
                                  VOCAB)
    assert "bidirectional" in paged_unsupported_reason(tiny_family("gemma3", use_bidirectional_attention=True))
    assert "bidirectional" in paged_unsupported_reason(tiny_family("gemma2", use_bidirectional_attention=True))


def test_gemma3_multimodal_runs_its_text_decoder():
    """Gemma3ForConditionalGeneration on text prompts: the runner binds its language model and text_config (the
    windows of its sliding layers included), its logits equal the whole model's forward, and greedy generate(runner=
    "paged") equals model.generate with a draft of itself, a text-only Gemma 3 and prompt lookup."""
    import specdec_fast
    from specdec_fast.runners.registry import paged_runner_class

    from .models import left_padded_prompts, make_draft

    model = gemma3_multimodal(vocab=VOCAB)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration" and paged_runner_class(model) is PagedGemmaRunner
    runner = PagedGemmaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.layer_windows == (4, 4, None) and runner.config.model_type == "gemma3_text"
    assert_runner_matches_forward(model, runner, VOCAB)
    ids, mask = left_padded_prompts([5, 9], vocab=VOCAB - 3, seed=2)  # text ids: no image / boundary token
    kw = dict(do_sample=False, max_new_tokens=12, pad_token_id=0)
    expected = model.generate(ids, attention_mask=mask, **kw)
    # drafts: itself, prompt lookup, and a text-only Gemma 3 of the same vocabulary (Gemma 3 1B drafting for 27B: the
    # multimodal config holds its vocab_size in its text config, which the pair check reads)
    for drafting in (dict(prompt_lookup_num_tokens=2), dict(assistant_model=make_draft(model, noise=0.03)),
                     dict(assistant_model=tiny_family("gemma3"))):
        assert torch.equal(specdec_fast.generate(model, ids, mask, runner="paged", **kw, **drafting), expected), drafting
    specdec_fast.release_engines(model)
