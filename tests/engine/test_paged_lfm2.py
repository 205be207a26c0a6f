"""LFM2, LFM2-MoE and LFM3 on the paged runner (runners/paged_lfm2.py): gated short-convolution layers (kernel 3; each row's
window of its last 2 inputs kept, snapshotted per draft token and rolled back at commit) with attention layers
(per-head q/k norms, RoPE); LFM2-MoE's blocks after its dense first layer (sigmoid scores in the model dtype + the
block's expert_bias, renormalised, scaled); LFM3's sandwich norms, per-head attention gate, sliding layer (a window of
5, reached by the tests' rows) and RoPE per layer type (half of the full layer's heads rotated). Tiny models of 3
layers (conv, conv, attention; LFM3: conv, sliding, full; 4 heads of 12 over 2 KV heads).

The runner's logits equal the model's own forward on every backend through prefill, left-padded score calls,
rollbacks and chained calls; bfloat16 stays close; greedy generate(runner="paged") equals model.generate with a
draft model, prompt lookup and plain decoding; the static graph twin gives the eager tokens. Controls: no rollback,
no chaining (runner_checks.assert_rollback_controls_fail), the gate C left out; LFM2-MoE's correction bias and
scale; LFM3's attention gate, sandwich norms and window each left out."""
import pytest
import torch

from specdec_fast.runners.paged_lfm2 import PagedLfm2Runner, lfm2_unsupported_reason
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .models import VOCAB, make_model
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_rollback_controls_fail, assert_runner_matches_forward)


KINDS = ("lfm2", "lfm2_moe", "lfm3")


def tiny(kind: str = "lfm2", seed: int = 0, **config):
    """make_model's LFM2 / LFM2-MoE of 3 layers (config: fields changed before it is built), its norms and the MoE
    blocks' expert_bias randomised (their inits are ones and zeros)."""
    model = make_model(kind, layers=3, seed=seed)
    if config:
        import transformers as tf

        for name, value in config.items():
            setattr(model.config, name, value)
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(model.config).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
        for name, buffer in model.named_buffers():
            if name.endswith("expert_bias"):
                buffer.copy_(0.3 * torch.randn(buffer.shape, generator=gen))
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedLfm2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def test_the_runner_and_its_pool():
    """The runner is picked; one attention layer on the paged cache, two convolution windows of 48 channels x 2
    (a committed one, K + 1 snapshots and a spare)."""
    model = tiny()
    assert paged_runner_class(model) is PagedLfm2Runner and lfm2_unsupported_reason(model) is None
    runner = _runner(model)
    runner.allocate(2, 20)
    assert runner.cache.kv.shape[0] == 1 and len(runner.states) == 2
    assert tuple(runner.states[0].conv.shape) == (2, 48, 2) and tuple(runner.states[0].conv_tent.shape) == (2, 5, 48, 2)


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_hf_forward(kind, backend, device):
    device = backend_device(backend, device)
    model = tiny(kind).to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


@pytest.mark.parametrize("config", [dict(use_expert_bias=False), dict(norm_topk_prob=False)])
def test_lfm2_moe_without_its_bias_or_renormalisation(config):
    """LFM2-MoE's routing without the expert_bias (the top k of the scores alone) and without renormalisation."""
    model = tiny("lfm2_moe", **config)
    assert_runner_matches_forward(model, _runner(model), VOCAB)


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_close_to_the_forward(kind):
    """LFM2 against the float32 forward; LFM2-MoE against transformers' own bf16 forward (its routing in bf16: both
    ~3.5% of the logits' scale from float32 on the tiny model, 0.7% from each other)."""
    reference = tiny(kind) if kind == "lfm2" else None
    model = tiny(kind).to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedLfm2Runner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB,
                                 reference=reference)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_paged_equals_generate(kind):
    assert_greedy_paged_equals_generate(tiny(kind, seed=5), VOCAB)


@pytest.mark.parametrize("kind", ["lfm2", "lfm3"])
def test_static_graph_twin_gives_the_eager_tokens(kind):
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny(kind, seed=3), VOCAB)


def test_controls(monkeypatch):
    """The rollback and the chaining (as every recurrent runner's); the gate C left out: the runner's in_proj with
    C's rows zero and a bias of 1 on them (C = 1, y = conv(B x))."""
    model = tiny()
    assert_rollback_controls_fail(monkeypatch, PagedLfm2Runner, model, VOCAB, max_new_tokens=8, num_draft_tokens=3,
                                  block_size=4)
    runner = _runner(model)
    for layer in runner.layers:
        if layer.kind == "linear_attention":
            weight = layer.mixer.in_proj[0]
            width = weight.shape[0] // 3
            gate_rows = torch.zeros(weight.shape[0], dtype=torch.bool)
            gate_rows[width:2 * width] = True
            layer.mixer.in_proj = (weight.masked_fill(gate_rows[:, None], 0.0), gate_rows.to(weight.dtype))
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


@pytest.mark.parametrize("left_out", ["correction", "weight_scale"])
def test_lfm2_moe_controls(left_out):
    """LFM2-MoE's expert_bias in the choice, its routed_scaling_factor on the weights: each left out moves the logits
    off the forward's."""
    model = tiny("lfm2_moe")
    runner = _runner(model)
    for layer in runner.layers:
        if layer.moe is not None:
            setattr(layer.moe, left_out, None)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


@pytest.mark.parametrize("left_out", ["gate", "post_operator_norm", "post_ffn_norm", "window"])
def test_lfm3_controls(left_out):
    """LFM3's attention gate, its two sandwich norms and its sliding layer's window: each left out moves the logits off
    the forward's."""
    model = tiny("lfm3")
    runner = _runner(model)
    if left_out == "window":
        runner.layer_windows = (None,) * len(runner.layer_windows)
    for layer in runner.layers:
        if left_out != "window" and hasattr(layer, left_out):
            setattr(layer, left_out, None)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_a_conv_bias_is_refused():
    model = tiny()
    model.config.conv_bias = True
    assert "conv_bias" in lfm2_unsupported_reason(model)
