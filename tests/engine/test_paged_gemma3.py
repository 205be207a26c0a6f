"""The Gemma 3 runner's own controls and refusals (its shared checks: test_paged_families.py)."""
import pytest
import torch

from specdec_fast.runners.paged_gemma3 import PagedGemma3Runner, gemma_rms_norm
from specdec_fast.runners.registry import paged_unsupported_reason

from .family_models import VOCAB, tiny_family
from .runner_checks import assert_runner_matches_forward


def test_controls_each_gemma_piece_is_needed():
    """Leaving out the soft-cap, using one RoPE table for every layer, or Llama's scale in place of
    query_pre_attn_scalar's breaks the logits; the norm is Gemma's (1 + weight) in float32."""
    model = tiny_family("gemma3")
    for spoil in (lambda r: setattr(r, "softcap", None), lambda r: setattr(r, "rope_keys", ["full_attention"] * 2),
                  lambda r: setattr(r, "scale", r.head_dim**-0.5)):
        runner = PagedGemma3Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
        assert runner.rope_keys == ["sliding_attention", "full_attention"]
        spoil(runner)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, runner, VOCAB)
    norm = model.model.layers[0].post_feedforward_layernorm.to(torch.bfloat16)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(gemma_rms_norm(x, (norm.weight, norm.eps)), norm(x))


def test_refusals():
    """Attention soft-capping (Gemma 2's) and bidirectional attention (EmbeddingGemma) by name."""
    assert "attn_logit_softcapping" in paged_unsupported_reason(tiny_family("gemma3", attn_logit_softcapping=30.0))
    assert "bidirectional" in paged_unsupported_reason(tiny_family("gemma3", use_bidirectional_attention=True))
