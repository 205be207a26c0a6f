"""OLMo Hybrid on the paged runner (runners/paged_olmo_hybrid.py): Qwen3.5's Gated DeltaNet (paged_qwen3_next.py)
with q / k / v projected apart, a gate of its own and beta up to 2 (allow_neg_eigval), between OLMo 3 attention
layers (whole-projection q / k norms, RoPE in float32, post-branch norms). Tiny models of 3 layers (DeltaNet,
DeltaNet, attention; 2 key heads of 8, 4 value heads of 12, kernel 4; attention 4 heads over 2 KV heads of 12).

The runner's logits equal the model's own forward on every backend through prefill, left-padded score calls,
rollbacks and chained calls, with RoPE and without (NoPE: a config without rope_theta); bfloat16 stays close;
a long prompt prefills in chunks; greedy generate(runner="paged") equals model.generate with a draft model,
prompt lookup and plain decoding; the static graph twin gives the eager tokens. Controls: no rollback, no
chaining (runner_checks.assert_rollback_controls_fail), beta not doubled, the rotation left out."""
import pytest
import torch

from specdec_fast.runners.paged_olmo_hybrid import PagedOlmoHybridRunner
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .models import VOCAB, make_model
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_rollback_controls_fail, assert_runner_matches_forward)


def tiny(seed: int = 0, rope: bool = True):
    """make_model's OLMo Hybrid of 3 layers; the DeltaNet's decays moderated (A_log's init reaches 16: most of the
    state would vanish each token) and the norms randomised (their init is ones); rope False: no rope_theta (NoPE)."""
    model = make_model("olmo_hybrid", layers=3, seed=seed)
    if not rope:
        import transformers as tf

        config = model.config
        config.rope_parameters = {"rope_type": "default"}
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(config).float().eval()
        assert model.model.rotary_emb is None
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("A_log"):
                param.copy_(torch.rand(param.shape, generator=gen).log())  # A in (0, 1)
            elif "norm" in name:
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedOlmoHybridRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def test_the_runner_and_its_pool():
    """The runner is picked; one attention layer on the paged cache, two DeltaNet states (a committed one, K + 1
    snapshots and a spare); beta doubled."""
    model = tiny()
    assert paged_runner_class(model) is PagedOlmoHybridRunner
    runner = _runner(model)
    runner.allocate(2, 20)
    assert runner.cache.kv.shape[0] == 1 and len(runner.states) == 2
    # conv: [q | k | v] = 2 x 2 x 8 + 4 x 12 = 80 channels, kernel 4; the delta rule: 4 value heads of 8 x 12
    assert tuple(runner.states[0].conv.shape) == (2, 80, 3) and tuple(runner.states[0].rec_tent.shape) == (2, 5, 4, 8, 12)
    assert runner.layers[0].mixer.beta_scale == 2.0


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_logits_equal_hf_forward(backend, device):
    device = backend_device(backend, device)
    model = tiny().to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


def test_nope_logits_equal_hf_forward():
    model = tiny(rope=False)
    assert_runner_matches_forward(model, _runner(model), VOCAB)


def test_bfloat16_close_to_the_bfloat16_forward():
    """Against transformers' own bf16 forward: both are ~4% of the logits' scale from the float32 forward here (the
    recurrent state's inputs rounded to bf16), 0.6% from each other."""
    model = tiny().to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedOlmoHybridRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB)


def test_a_long_prompt_prefills_in_chunks(monkeypatch):
    """A prompt of 21 tokens in chunks of 8 (the chunk boundary crossed twice): the last logits are the forward's."""
    from specdec_fast.runners import paged_qwen3_next

    from .runner_checks import hf_logits

    monkeypatch.setattr(paged_qwen3_next, "PREFILL_CHUNK", 8)
    model = tiny(seed=2)
    ids = torch.randint(3, VOCAB, (1, 21), generator=torch.Generator().manual_seed(4))
    runner = PagedOlmoHybridRunner(model, max_new_tokens=4, num_draft_tokens=1)
    logits = runner.prefill(ids, torch.ones_like(ids))
    torch.testing.assert_close(logits[0], hf_logits(model, ids[0].tolist())[-1], atol=1e-4, rtol=1e-4)


def test_greedy_paged_equals_generate():
    assert_greedy_paged_equals_generate(tiny(seed=5), VOCAB)


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny(seed=3), VOCAB)


@pytest.mark.parametrize("left_out", ["rollback", "beta_scale", "rope"])
def test_controls(left_out, monkeypatch):
    """The rollback and the chaining (as every recurrent runner's); beta not doubled; the rotation left out: each
    moves the logits off the forward's."""
    model = tiny()
    if left_out == "rollback":
        assert_rollback_controls_fail(monkeypatch, PagedOlmoHybridRunner, model, VOCAB, max_new_tokens=8,
                                      num_draft_tokens=3, block_size=4)
        return
    runner = _runner(model)
    if left_out == "beta_scale":
        for layer in runner.layers:
            if layer.kind == "linear_attention":
                layer.mixer.beta_scale = 1.0
    else:
        runner.inv_freq = None
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)
