"""Jamba on the paged runner (runners/paged_jamba.py): Mamba1 layers (runners/mamba1.py, their dt / B / C normed by
Jamba's weighted RMSNorms; states rolled back at commit) with attention layers without positions, experts every
other layer (softmax top 2, not renormalised). Tiny models of 4 layers (mamba, attention + experts, mamba, attention
+ experts; 96 channels of state 8; 4 heads over 2 KV heads of 12), the Mamba parameters and norms randomised.

The runner's logits equal the model's own forward on every backend through prefill, left-padded score calls,
rollbacks and chained calls; bfloat16 stays close to transformers' bf16 forward; greedy generate(runner="paged")
equals model.generate with a draft model, prompt lookup and plain decoding; the static graph twin gives the eager
tokens. Controls: no rollback, no chaining (runner_checks.assert_rollback_controls_fail), the dt / B / C norms."""
import pytest
import torch

from specdec_fast.runners.paged_jamba import PagedJambaRunner, jamba_unsupported_reason
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .models import VOCAB, make_model
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_rollback_controls_fail, assert_runner_matches_forward)


def tiny(seed: int = 0):
    model = make_model("jamba", layers=4, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            mixer = getattr(layer, "mamba", None)
            if mixer is None:
                continue
            for param, mean, std in ((mixer.dt_proj.bias, 0, 0.5), (mixer.A_log, 0, 0.5), (mixer.D, 1, 0.3)):
                param.copy_(mean + std * torch.randn(param.shape, generator=gen))
            for norm in (mixer.dt_layernorm, mixer.b_layernorm, mixer.c_layernorm):
                norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, generator=gen))
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedJambaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def test_the_runner_and_its_pool():
    """The runner is picked; two attention layers on the paged cache, two Mamba states (conv 96 x 3, scan 96 x 8);
    the attention layers' MLPs are MoE blocks."""
    model = tiny()
    assert paged_runner_class(model) is PagedJambaRunner and jamba_unsupported_reason(model) is None
    runner = _runner(model)
    runner.allocate(2, 20)
    assert runner.cache.kv.shape[0] == 2 and len(runner.states) == 2
    assert tuple(runner.states[0].conv.shape) == (2, 96, 3) and tuple(runner.states[0].rec.shape) == (2, 96, 8)
    assert [layer.moe is not None for layer in runner.layers] == [False, True, False, True]


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_logits_equal_hf_forward(backend, device):
    device = backend_device(backend, device)
    model = tiny().to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


def test_bfloat16_close_to_the_bfloat16_forward():
    model = tiny().to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedJambaRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB)


def test_greedy_paged_equals_generate():
    assert_greedy_paged_equals_generate(tiny(seed=5), VOCAB)


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny(seed=3), VOCAB)


def test_controls(monkeypatch):
    """The rollback and the chaining (as every recurrent runner's); the dt / B / C norms left out."""
    model = tiny()
    assert_rollback_controls_fail(monkeypatch, PagedJambaRunner, model, VOCAB, max_new_tokens=8, num_draft_tokens=3,
                                  block_size=4)
    runner = _runner(model)
    for layer in runner.layers:
        if layer.kind == "linear_attention":
            layer.mixer.norms = None
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_a_mamba_projection_bias_is_refused():
    model = tiny()
    model.config.mamba_proj_bias = True
    assert "mamba_proj_bias" in jamba_unsupported_reason(model)


def test_output_scores_equal_generate(monkeypatch):
    """output_scores (engine/outputs.step_forwards): Jamba's forward of several tokens over a cache restarts its
    Mamba scan, so its steps go one token at a time, as its generate does; the control (the rule left out) is
    off by > 1e-2 (the families fuzzer found 2.25)."""
    from specdec_fast.engine import outputs

    from .test_paged_mamba_lm import _scores_distance, _spoiled_distance

    model = tiny(seed=2)
    assert _scores_distance(model) < 1e-4
    monkeypatch.setattr(outputs, "SCAN_RESTARTING_TYPES", ())
    assert _spoiled_distance(model) > 1e-2
