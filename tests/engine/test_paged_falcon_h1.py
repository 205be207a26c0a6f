"""Falcon-H1 on the paged runner (runners/paged_falcon_h1.py): a Mamba2 mixer (runners/mamba2.py, Falcon-H1's
variations: ssm_in_multiplier, the per-channel mup_vector, the gated norm optional and before or after the gate)
and attention side by side in every layer, the Mamba2 states rolled back at commit, under Falcon-H1's μP
multipliers. Tiny models (3 layers; Mamba2 of 8 heads of 8, 2 groups of state 16, kernel 4; attention of 4 heads
over 2 KV heads of 16), every multiplier away from 1; NORMS: no gated norm ("gate"), the norm before the gate
("norm_gate"), after it ("gate_norm").

The runner's logits equal the model's own forward on every backend through prefill, left-padded score calls,
rollbacks and chained calls; bfloat16 stays close; greedy generate(runner="paged") equals model.generate with a
draft model, prompt lookup and plain decoding; the static graph twin gives the eager tokens. Controls: no
rollback, no chaining (runner_checks.assert_rollback_controls_fail), and each multiplier left out."""
import pytest
import torch

from specdec_fast.runners.paged_falcon_h1 import PagedFalconH1Runner, falcon_h1_unsupported_reason
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_rollback_controls_fail, assert_runner_matches_forward)

VOCAB = 96
NORMS = {"gate": dict(mamba_rms_norm=False), "norm_gate": dict(mamba_rms_norm=True, mamba_norm_before_gate=True),
         "gate_norm": dict(mamba_rms_norm=True, mamba_norm_before_gate=False)}


def tiny_falcon_h1(norm: str = "norm_gate", seed: int = 0):
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.FalconH1Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2,
        mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=8, lm_head_multiplier=0.5, embedding_multiplier=2.0,
        mlp_multipliers=[0.7, 1.3], key_multiplier=0.8, attention_out_multiplier=0.9, attention_in_multiplier=1.1,
        ssm_multipliers=[1.2, 0.8, 1.1, 0.9, 1.05], ssm_in_multiplier=0.75, ssm_out_multiplier=1.25,
        max_position_embeddings=256, initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        **NORMS[norm])
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            mixer = layer.mamba
            mixer.dt_bias.normal_(0, 0.5)
            mixer.A_log.normal_(0, 0.5)
            mixer.D.normal_(1, 0.3)
            if isinstance(mixer.norm, torch.nn.Module) and hasattr(mixer.norm, "weight"):
                mixer.norm.weight.normal_(1, 0.2)
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedFalconH1Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def test_the_runner_and_its_pool():
    """Every layer has a KV cache and a Mamba2 state (a committed one and K + 1 snapshots)."""
    model = tiny_falcon_h1()
    assert paged_runner_class(model) is PagedFalconH1Runner and falcon_h1_unsupported_reason(model) is None
    runner = _runner(model)
    runner.allocate(2, 20)
    assert runner.cache.kv.shape[0] == 3 and len(runner.states) == 3
    # conv over [x | B | C] = 64 + 2 x 2 x 16 = 128 channels; the state: 8 heads of 8 x 16
    assert tuple(runner.states[0].conv.shape) == (2, 128, 3) and tuple(runner.states[0].rec_tent.shape) == (2, 5, 8, 8, 16)
    assert runner.layers[0].mixer.mup is not None and runner.layers[0].mixer.in_scale == 0.75


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("norm", list(NORMS))
def test_logits_equal_hf_forward(norm, backend, device):
    device = backend_device(backend, device)
    model = tiny_falcon_h1(norm).to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


def test_bfloat16_close_to_the_float32_forward():
    reference = tiny_falcon_h1()
    model = tiny_falcon_h1().to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedFalconH1Runner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB,
                                 reference=reference)


@pytest.mark.parametrize("norm", ["gate", "norm_gate"])
def test_greedy_paged_equals_generate(norm):
    """With a draft model, prompt lookup, plain decoding, and (gate) its first layer drafting: assistant_early_exit
    cuts Falcon-H1's config, whose layer_types is layers_block_type, a property of num_hidden_layers (its setattr
    raised: found by the families fuzzer)."""
    extra = (dict(assistant_early_exit=1),) if norm == "gate" else ()
    assert_greedy_paged_equals_generate(tiny_falcon_h1(norm, seed=5), VOCAB, extra=extra)


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny_falcon_h1(seed=3), VOCAB)


@pytest.mark.parametrize("left_out", ["embedding", "lm_head", "key", "attention_in", "attention_out", "ssm_out",
                                      "gate_multiplier", "down_multiplier", "in_scale", "mup"])
def test_controls(left_out, monkeypatch):
    """The rollback and the chaining (as every recurrent runner's), and each multiplier set to 1 on the runner
    (the mixer's input scale and mup_vector on each layer's Mamba2): each moves the logits off the forward's."""
    model = tiny_falcon_h1()
    if left_out == "embedding":
        assert_rollback_controls_fail(monkeypatch, PagedFalconH1Runner, model, VOCAB, max_new_tokens=8,
                                      num_draft_tokens=3, block_size=4)
    runner = _runner(model)
    if left_out in runner.multipliers:
        runner.multipliers[left_out] = 1.0
    elif left_out in ("gate_multiplier", "down_multiplier"):
        setattr(runner, left_out, 1.0)
    else:
        for layer in runner.layers:
            setattr(layer.mixer, left_out, 1.0 if left_out == "in_scale" else None)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)
