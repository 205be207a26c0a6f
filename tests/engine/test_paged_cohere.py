"""The Cohere runner's own controls (its shared checks: test_paged_families.py): Llama's RoPE
layout (cat, halves) in place of Cohere's interleaved one, the logits without logit_scale, or
Cohere 2's NoPE layers rotated, no longer give the model's logits."""
import pytest

import specdec_fast.runners.paged_cohere as paged_cohere
from specdec_fast.kernels.llama_ops.reference import rotate_half_apply

from .family_models import VOCAB, tiny_family
from .runner_checks import assert_runner_matches_forward


def test_controls_the_interleaved_rope_and_the_logit_scale(monkeypatch):
    model = tiny_family("cohere")
    runner = paged_cohere.PagedCohereRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    runner.logit_scale = 1.0
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)
    monkeypatch.setattr(paged_cohere, "rotate_interleaved", rotate_half_apply)
    runner = paged_cohere.PagedCohereRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_control_cohere2s_full_layers_do_not_rotate():
    """Cohere 2: its full-attention layers are NoPE (layer.rope False); rotating them too, as
    Cohere 1 does every layer, no longer gives the model's logits."""
    model = tiny_family("cohere2")
    runner = paged_cohere.PagedCohereRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert [layer.rope for layer in runner.layers] == [True, False] and runner.layers[0].q_norm is None
    for layer in runner.layers:
        layer.rope = True
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_controls_cohere2_moe():
    """Cohere 2 MoE: its dense prefix layer rotates (force_rope) though full, its sparse full layer does not; the
    averaged shared expert, the sigmoid routing's renormalisation and the RMSNorm are each needed."""
    model = tiny_family("cohere2_moe")
    runner = paged_cohere.PagedCohereRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert [layer.rope for layer in runner.layers] == [True, True, False]
    assert [layer.moe is not None for layer in runner.layers] == [False, True, True] and not runner.rms
    for spoil in (lambda r: setattr(r.layers[0], "rope", False),
                  lambda r: [setattr(layer.moe, "shared_average", False) for layer in r.layers[1:]]):
        runner = paged_cohere.PagedCohereRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
        spoil(runner)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, runner, VOCAB)
    model = tiny_family("cohere2_moe_sigmoid")
    runner = paged_cohere.PagedCohereRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.rms and runner.layers[1].moe.routing_kind == "topk_sigmoid_sum"
    for spoil in (lambda r: setattr(r, "rms", False),
                  lambda r: [setattr(layer.moe, "renorm", False) for layer in r.layers[1:]]):
        runner = paged_cohere.PagedCohereRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
        spoil(runner)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, runner, VOCAB)
