"""The StarCoder2 runner's other families' controls (their shared checks: test_paged_families.py): Nemotron's
LayerNorm1P adds 1 to its weights; StableLM's per-head q / k LayerNorms and its parallel residual (the MLP reads the
attention's input norm, no second norm) are each needed."""
import pytest
import torch
import torch.nn.functional as F

from specdec_fast.runners.paged_starcoder2 import PagedStarcoder2Runner, head_layer_norm

from .family_models import VOCAB, tiny_family
from .runner_checks import assert_runner_matches_forward


def _spoilt(kind: str, spoil) -> None:
    model = tiny_family(kind)
    runner = PagedStarcoder2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    for layer in runner.layers:
        spoil(layer)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_control_nemotron_adds_one_to_its_norm_weights():
    model = tiny_family("nemotron")
    runner = PagedStarcoder2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    norm = model.model.layers[0].input_layernorm
    assert torch.equal(runner.layers[0].ln_in[0], norm.weight + 1.0) and runner.layers[0].gate is None
    _spoilt("nemotron", lambda layer: setattr(layer, "ln_in", (layer.ln_in[0] - 1.0, *layer.ln_in[1:])))


def test_controls_stablelm_head_norms_and_parallel_residual():
    assert PagedStarcoder2Runner(tiny_family("stablelm"), max_new_tokens=4, num_draft_tokens=1).layers[0].ln_post is None
    _spoilt("stablelm", lambda layer: setattr(layer, "q_norm", None))
    _spoilt("stablelm", lambda layer: setattr(layer, "ln_post", layer.ln_in))  # the sequential layer's second norm


def test_head_layer_norm_is_each_heads_layer_norm_in_bf16():
    """One rounding, as nn.LayerNorm computes a bf16 input (float32 inside, the weight applied there)."""
    model = tiny_family("stablelm")
    norms = model.model.layers[0].self_attn.q_layernorm.to(torch.bfloat16)
    x = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    weights = torch.stack([norm.weight for norm in norms.norms])
    expected = torch.stack([F.layer_norm(x[:, h], (16,), norms.norms[h].weight, None, norms.norms[h].eps)
                            for h in range(4)], dim=1)
    assert torch.equal(head_layer_norm(x, (weights, norms.norms[0].eps)), expected)
