"""MiMo-V2-Flash on the paged runner (runners/paged_mimo.py): value heads narrower than the key heads (stored padded
to the key width in the cache, the attention's output sliced back), the values scaled before the cache, sliding
layers of twice the KV heads with attention sinks (window 8, passed), a third of each head rotated with a RoPE a
layer type, DeepSeek-V3's grouped sigmoid routing without shared experts.

The runner's logits equal the model's own forward on every backend through prefill, left-padded score calls,
rollbacks and chained calls; bfloat16 stays close; greedy generate(runner="paged") equals model.generate with a
draft model, prompt lookup and plain decoding; the static graph twin gives the eager tokens. Controls: each piece
of the math left out moves the logits off the forward's."""
import pytest
import torch

from specdec_fast.runners.paged_mimo import PagedMimoRunner
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .models import VOCAB, make_model
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_runner_matches_forward)


def tiny(seed: int = 0):
    """make_model's MiMo-V2-Flash of 3 layers (full, sliding, sliding), its sinks and correction biases randomised
    (the initialiser's are near zero or zero)."""
    model = make_model("mimo_v2_flash", layers=3, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.self_attn.sinks is not None:
                layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=gen))
            bias = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(torch.randn(bias.shape, generator=gen) * 0.3)
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedMimoRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def test_the_runner_and_its_caches():
    """A cache per KV shape: the full layer's 2 KV heads, the sliding layers' 4, each of the key width (12) that
    the values (8 wide) are padded to; sinks on the sliding layers only."""
    model = tiny()
    assert paged_runner_class(model) is PagedMimoRunner
    runner = _runner(model)
    runner.allocate(2, 20)
    assert [runner.kv_shape(i) for i in range(3)] == [(2, 12), (4, 12), (4, 12)]
    assert sorted(tuple(cache.kv.shape[-2:]) for cache in runner.caches) == [(2, 12), (4, 12)]
    assert [s is None for s in runner.attn_sinks] == [True, False, False]


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_logits_equal_hf_forward(backend, device):
    device = backend_device(backend, device)
    model = tiny().to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


def test_bfloat16_close_to_the_float32_forward():
    reference = tiny()
    model = tiny().to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedMimoRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB,
                                 reference=reference)


def test_greedy_paged_equals_generate():
    assert_greedy_paged_equals_generate(tiny(seed=5), VOCAB)


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny(seed=3), VOCAB)


@pytest.mark.parametrize("left_out", ["v_scale", "sinks", "rope", "correction"])
def test_controls(left_out):
    """The values' scale, the sliding layers' sinks, the rotation (of a third of each head), the routing's
    correction bias: each left out moves the logits off the forward's."""
    model = tiny()
    runner = _runner(model)
    if left_out == "v_scale":
        for layer in runner.layers:
            layer.v_scale = 1.0
    elif left_out == "sinks":
        runner.attn_sinks = ()
    elif left_out == "rope":
        runner.rope_tables = {key: (inv_freq * 0, scaling) for key, (inv_freq, scaling) in runner.rope_tables.items()}
    else:
        for layer in runner.layers:
            if layer.moe is not None:
                layer.moe.correction = torch.zeros_like(layer.moe.correction)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_values_wider_than_keys_are_refused():
    from specdec_fast.runners.paged_mimo import mimo_unsupported_reason

    model = tiny()
    model.config.v_head_dim = 16
    assert "v_head_dim 16 wider than head_dim 12" in mimo_unsupported_reason(model)
