"""PagedGemma3Runner: Gemma 3's text decoder (sandwich norms, Gemma's (1 + weight) RMSNorm in
float32, per-head q / k norms, a RoPE per layer type, the scaled embedding, query_pre_attn_scalar,
final-logit soft-capping) gives the model's own logits on every backend, and greedy
generate(runner="paged") equals model.generate token for token."""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.runners.paged_gemma3 import PagedGemma3Runner, gemma_rms_norm
from specdec_fast.runners.registry import paged_runner_class, paged_unsupported_reason

from .models import left_padded_prompts, make_draft
from .runner_checks import assert_bf16_close_to_forward, assert_runner_matches_forward
from ..conftest import backend_device

VOCAB = 96


def tiny_gemma3(seed: int = 0, layers: int = 2, **overrides):
    """A random Gemma 3 text model: layers alternating sliding (a window of 200, which the tests'
    rows stay inside; local base 300) and full attention (base 900, linear scaling 2),
    query_pre_attn_scalar 20 (not head_dim), final-logit soft-capping 5 (logits of a few units:
    the cap bites), norm weights spread around 0 (Gemma's norms scale by 1 + weight)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.15, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, sliding_window=200, query_pre_attn_scalar=20,
        final_logit_softcapping=overrides.pop("final_logit_softcapping", 5.0),
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 300.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 900.0}},
        **overrides)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(-0.5, 0.5)
    model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_logits_equal_hf_forward(backend, device):
    device = backend_device(backend, device)
    model = tiny_gemma3().to(device)
    assert paged_runner_class(model) is PagedGemma3Runner
    runner = PagedGemma3Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert runner.rope_keys == ["sliding_attention", "full_attention"]
    assert_runner_matches_forward(model, runner, VOCAB)


def test_bfloat16_close_to_hf_forward():
    model = tiny_gemma3().to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedGemma3Runner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB)


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_paged_equals_generate(batch):
    target = tiny_gemma3(seed=5)
    draft = make_draft(target, noise=0.03)
    ids, mask = left_padded_prompts([6] if batch == 1 else [4, 10, 7], vocab=VOCAB, seed=batch)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    for drafting in (dict(assistant_model=draft, num_assistant_tokens=3), dict(prompt_lookup_num_tokens=2), {}):
        out = api.generate(target, ids, mask, do_sample=False, max_new_tokens=20, pad_token_id=0, runner="paged",
                           **drafting)
        assert torch.equal(out, expected), drafting


def test_controls_each_gemma_piece_is_needed():
    """Leaving out the soft-cap, using one RoPE table for every layer, or Llama's scale in place of
    query_pre_attn_scalar's breaks the logits; the norm is Gemma's (1 + weight) in float32."""
    model = tiny_gemma3()
    for spoil in (lambda r: setattr(r, "softcap", None), lambda r: setattr(r, "rope_keys", ["full_attention"] * 2),
                  lambda r: setattr(r, "scale", r.head_dim**-0.5)):
        runner = PagedGemma3Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
        spoil(runner)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, runner, VOCAB)
    norm = model.model.layers[0].post_feedforward_layernorm.to(torch.bfloat16)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(gemma_rms_norm(x, (norm.weight, norm.eps)), norm(x))


def test_refusals():
    """Rows past a sliding window go to the hf runner; attention soft-capping (Gemma 2's) and
    bidirectional attention (EmbeddingGemma) are refused by name."""
    model = tiny_gemma3()
    assert api.choose_runner(model, None, 150) == "paged" and api.choose_runner(model, None, 250) == "hf"
    assert "attn_logit_softcapping" in paged_unsupported_reason(tiny_gemma3(attn_logit_softcapping=30.0))
    assert "bidirectional" in paged_unsupported_reason(tiny_gemma3(use_bidirectional_attention=True))
