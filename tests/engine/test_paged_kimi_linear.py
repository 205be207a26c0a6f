"""Kimi Linear on the paged runner (runners/paged_kimi_linear.py): Kimi Delta Attention layers (runners/kda.py: a
decay per key channel; each row's [H, D, D] state and convolution window snapshotted per draft token and rolled back
at commit) with a latent attention layer every 3rd (no positions; absorbed over a latent paged cache), a dense first MLP,
then DeepSeek-V3-routed experts with a shared one. Tiny models of 3 layers (4 heads of 12), their norms, correction
biases, decays and dt biases randomised.

The prefill's chunk form equals the recurrence written out, in chunks of any size; the runner's logits equal the
model's own forward on every backend through prefill, left-padded score calls, rollbacks and chained calls, with the
chunk form over several chunks; bfloat16 stays close; greedy generate(runner="paged") equals model.generate with a
draft model, prompt lookup and plain decoding; the static graph twin gives the eager tokens; output_scores equal
model.generate's. Controls: no rollback, no chaining (runner_checks.assert_rollback_controls_fail), one decay a head
instead of a channel, the gate's sigmoid left out, the latent's shared key part left out, the key's rows read as
the value's."""
from functools import partial

import pytest
import torch

from specdec_fast.kernels.chunk_scan import chunk_scan
from specdec_fast.runners import kda
from specdec_fast.runners.chunked_prefill import row_decay_prefill
from specdec_fast.runners.paged_kimi_linear import PagedKimiLinearRunner, kimi_linear_unsupported_reason
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .models import VOCAB, make_model
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_rollback_controls_fail, assert_runner_matches_forward)


def tiny(seed: int = 0):
    """make_model's Kimi Linear of 3 layers, its norms, correction biases, A_log and dt_bias randomised."""
    model = make_model("kimi_linear", layers=3, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in list(model.named_parameters()) + list(model.named_buffers()):
            if "norm" in name:
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
            elif name.endswith(("e_score_correction_bias", "dt_bias")):
                param.copy_(0.3 * torch.randn(param.shape, generator=gen))
            elif name.endswith("A_log"):
                param.copy_(torch.randn(param.shape, generator=gen) - 1)
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedKimiLinearRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def _recurrence(q, k, v, g, beta):
    """transformers' recurrent rule written out over [B, H, n, D] rows from a zero state (float64)."""
    batch, heads, n, dim = k.shape
    state = torch.zeros(batch, heads, dim, dim, dtype=torch.float64)
    outs = []
    for t in range(n):
        state = state * g[:, :, t].double().exp().unsqueeze(-1)
        delta = (v[:, :, t].double() - (state * k[:, :, t, :, None].double()).sum(-2)) * beta[:, :, t, None].double()
        state = state + k[:, :, t, :, None].double() * delta.unsqueeze(-2)
        outs.append((state * q[:, :, t, :, None].double()).sum(-2))
    return torch.stack(outs, dim=2), state


@pytest.mark.parametrize("chunk", [1, 3, 4, 64])
def test_the_chunk_form_is_the_recurrence(chunk):
    """The prefill's chunk form (runners/chunked_prefill.py row_decay_prefill, its carry the torch loop) against the
    recurrence in float64, from a zero state: every output and the last state."""
    gen = torch.Generator().manual_seed(chunk)
    batch, heads, n, dim = 2, 3, 10, 5
    q, k = (torch.nn.functional.normalize(torch.randn(batch, heads, n, dim, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(batch, heads, n, dim, generator=gen)
    g = -torch.rand(batch, heads, n, dim, generator=gen)
    beta = torch.rand(batch, heads, n, generator=gen)
    state = torch.zeros(batch, heads, dim, dim)
    o = row_decay_prefill(partial(chunk_scan, backend="torch"), q, k, v, g, beta, state, chunk)
    ref_o, ref_state = _recurrence(q, k, v, g, beta)
    torch.testing.assert_close(o.double(), ref_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.double(), ref_state, atol=1e-5, rtol=1e-5)


def test_the_runner_and_its_pool():
    """The runner is picked; one attention layer on the paged cache (one head of the latent's 16 + 8 a token), two
    KDA states of 4 heads x 12 x 12 and windows of 3 x 48 channels x 3 (a committed one, K + 1 snapshots, a spare)."""
    model = tiny()
    assert paged_runner_class(model) is PagedKimiLinearRunner and kimi_linear_unsupported_reason(model) is None
    runner = _runner(model)
    runner.allocate(2, 20)
    assert runner.cache.kv.shape[0] == 1 and runner.kv_shape(0) == (1, 24) and len(runner.states) == 2
    assert tuple(runner.states[0].rec.shape) == (2, 4, 12, 12) and tuple(runner.states[0].conv.shape) == (2, 144, 3)
    assert tuple(runner.states[0].rec_tent.shape) == (2, 5, 4, 12, 12)


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_logits_equal_hf_forward(backend, device):
    device = backend_device(backend, device)
    model = tiny().to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


def test_logits_with_the_prefill_over_several_chunks(monkeypatch):
    monkeypatch.setattr(kda, "CHUNK", 2)
    model = tiny(seed=1)
    assert_runner_matches_forward(model, _runner(model), VOCAB)


def test_bfloat16_close_to_the_forward():
    """Against transformers' own bf16 forward: on the tiny model both are ~2-2.4% of the logits' scale from float32
    (a score call's one logit 3.2%), 0.8% from each other."""
    model = tiny().to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedKimiLinearRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB)


def test_greedy_paged_equals_generate():
    assert_greedy_paged_equals_generate(tiny(seed=5), VOCAB)


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny(seed=3), VOCAB)


def test_output_scores_equal_generate():
    from .test_paged_mamba_lm import _scores_distance

    assert _scores_distance(tiny(seed=2)) < 1e-4


def test_rollback_controls(monkeypatch):
    assert_rollback_controls_fail(monkeypatch, PagedKimiLinearRunner, tiny(), VOCAB, max_new_tokens=8,
                                  num_draft_tokens=3, block_size=4)


def _per_head_decay(net):
    """A KDA layer whose gates give each head one decay (its channels' mean): the Gated DeltaNet's, not KDA's."""
    real = net.gates

    def gates(h):
        g, beta = real(h)
        return g.mean(-1, keepdim=True).expand_as(g), beta
    net.gates = gates


def _no_sigmoid(net):
    real = net.output

    def output(o, h):
        g_b = net.g_b
        net.g_b = (g_b[0] * 0, torch.full((g_b[0].shape[0],), 50.0))  # sigmoid(50) = 1: the gate left out
        try:
            return real(o, h)
        finally:
            net.g_b = g_b
    net.output = output


@pytest.mark.parametrize("spoil", [_per_head_decay, _no_sigmoid], ids=["a-decay-per-head", "no-output-gate"])
def test_kda_controls(spoil):
    model = tiny()
    runner = _runner(model)
    for layer in runner.layers:
        if layer.kind == "linear_attention":
            spoil(layer.mixer)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


@pytest.mark.parametrize("spoil", ["shared-key", "value-from-the-key"])
def test_latent_controls(spoil):
    """The latent attention's key is [k_nope | k_rot], k_rot shared by the heads: a runner that zeroes it differs; its
    values are W_UV's, not W_UK's: a runner that reads the key's rows as the value's differs."""
    model = tiny()
    runner = _runner(model)
    for layer in runner.layers:
        if layer.kind != "full_attention":
            continue
        if spoil == "shared-key":
            weight = layer.kv_a[0].clone()
            weight[-runner.rope:] = 0
            layer.kv_a = (weight, None)
        else:
            layer.w_uv = layer.w_uk
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_refusals():
    model = tiny()
    model.config.attention_bias = True
    assert "attention_bias" in kimi_linear_unsupported_reason(model)
    model.config.attention_bias = False
    model.config.layer_types = ["linear_attention", "mamba", "full_attention"]
    assert "layer_types" in kimi_linear_unsupported_reason(model)
