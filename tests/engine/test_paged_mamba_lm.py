"""Pure Mamba language models on the paged runner (runners/paged_mamba_lm.py): every layer a Mamba2 mixer
(runners/mamba2.py) or a Mamba1 one (runners/mamba1.py: Mamba, Falcon-Mamba with its dt / B / C norms), its state
rolled back at commit, no attention, the residual stream in float32 (residual_in_fp32). Tiny models of 3 layers
(Mamba2: 8 heads of 12, 2 groups of state 16, kernel 4; Mamba1: 96 channels of state 8, dt rank 6, kernel 4), their
dt biases, A_log, D (and Mamba2's gated norm) randomised.

The runner's logits equal the model's own forward on every backend through prefill, left-padded score calls,
rollbacks and chained calls; bfloat16 stays close to transformers' bf16 forward; greedy generate(runner="paged")
equals model.generate with a draft model, prompt lookup and plain decoding; the static graph twin gives the eager
tokens. Controls: no rollback, no chaining (runner_checks.assert_rollback_controls_fail)."""
import pytest
import torch

from specdec_fast.runners.paged_mamba_lm import PagedMambaRunner, mamba_lm_unsupported_reason
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .models import VOCAB, make_model
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_rollback_controls_fail, assert_runner_matches_forward)


KINDS = ("mamba2", "mamba", "falcon_mamba")


def tiny(kind: str = "mamba2", seed: int = 0):
    model = make_model(kind, layers=3, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.backbone.layers:
            mixer = layer.mixer
            dt_bias = mixer.dt_bias if kind == "mamba2" else mixer.dt_proj.bias
            dt_bias.copy_(0.5 * torch.randn(dt_bias.shape, generator=gen))
            mixer.A_log.copy_(0.5 * torch.randn(mixer.A_log.shape, generator=gen))
            mixer.D.copy_(1 + 0.3 * torch.randn(mixer.D.shape, generator=gen))
            if kind == "mamba2":
                mixer.norm.weight.copy_(1 + 0.2 * torch.randn(mixer.norm.weight.shape, generator=gen))
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedMambaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def test_the_runner_and_its_pool():
    """The runner is picked for each kind; a Mamba2 model's three states (conv over x | B | C = 96 + 2 x 2 x 16 channels, the scan 8 heads of
    12 x 16), one unused KV layer (the pool's bookkeeping)."""
    for kind in KINDS[1:]:
        assert paged_runner_class(tiny(kind)) is PagedMambaRunner
    model = tiny()
    assert paged_runner_class(model) is PagedMambaRunner and mamba_lm_unsupported_reason(model) is None
    runner = _runner(model)
    runner.allocate(2, 20)
    assert len(runner.states) == 3 and runner.kv_layer_count == 1
    assert tuple(runner.states[0].conv.shape) == (2, 160, 3) and tuple(runner.states[0].rec.shape) == (2, 8, 12, 16)


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_hf_forward(kind, backend, device):
    device = backend_device(backend, device)
    model = tiny(kind).to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_close_to_the_bfloat16_forward(kind):
    model = tiny(kind).to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedMambaRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_paged_equals_generate(kind):
    assert_greedy_paged_equals_generate(tiny(kind, seed=5), VOCAB)


@pytest.mark.parametrize("kind", ["mamba2", "mamba"])
def test_static_graph_twin_gives_the_eager_tokens(kind):
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny(kind, seed=3), VOCAB)


@pytest.mark.parametrize("kind", ["mamba2", "mamba"])
def test_controls(kind, monkeypatch):
    assert_rollback_controls_fail(monkeypatch, PagedMambaRunner, tiny(kind), VOCAB, max_new_tokens=8,
                                  num_draft_tokens=3, block_size=4)


def test_falcon_mambas_norms_left_out_move_the_logits():
    """Falcon-Mamba's weightless RMS norms of dt, B and C: a runner without them is off the forward's logits."""
    model = tiny("falcon_mamba")
    runner = _runner(model)
    for block in runner.layers:
        block.mixer.rms_eps = None
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_refusals():
    model = tiny()
    model.config.time_step_limit = (0.0, 0.1)
    assert "time_step_limit" in mamba_lm_unsupported_reason(model)
    model = tiny("mamba")
    model.config.use_bias = True
    assert "use_bias" in mamba_lm_unsupported_reason(model)


def test_the_bf16_residual_stream_stays_float32():
    """residual_in_fp32 (transformers' default): in a bf16 model the stream between layers is float32. The runner's
    bf16 prefill logits are then within 0.2% of the logits' scale of transformers' bf16 forward (0.0 measured here);
    the control, the stream rounded to bf16 at each layer, lands 0.6% away."""
    from .models import left_padded_prompts
    from .runner_checks import hf_logits

    model = tiny().to(torch.bfloat16)
    ids, mask = left_padded_prompts([4, 7], vocab=VOCAB, seed=6)
    distances = {}
    for in_fp32 in (True, False):
        runner = PagedMambaRunner(model, max_new_tokens=4, num_draft_tokens=1)
        runner.residual_in_fp32 = in_fp32
        logits = runner.prefill(ids, mask).float()
        refs = [hf_logits(model, ids[b, mask[b].bool()].tolist()).float()[-1] for b in range(2)]
        distances[in_fp32] = max(((logits[b] - ref).abs().max() / ref.abs().max()).item() for b, ref in enumerate(refs))
    assert distances[True] < 2e-3 < distances[False], distances


def _scores_distance(model, **kw) -> float:
    """Greedy generate(runner="paged") with output_scores on two left-padded rows against model.generate's: the
    largest score difference (the tokens must agree)."""
    import specdec_fast

    from .models import left_padded_prompts

    ids, mask = left_padded_prompts([5, 2], vocab=VOCAB, seed=3)
    opts = dict(do_sample=False, max_new_tokens=6, pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    ref = model.generate(ids, attention_mask=mask, **opts)
    ours = specdec_fast.generate(model, ids, mask, runner="paged", prompt_lookup_num_tokens=2, **opts, **kw)
    assert torch.equal(ours.sequences, ref.sequences)
    return max((a - b).abs().max().item() for a, b in zip(ref.scores, ours.scores))


@pytest.mark.parametrize("kind", KINDS)
def test_output_scores_equal_generate(kind, monkeypatch):
    """output_scores are recomputed after the loop by the model's own forwards (engine/outputs.step_forwards). A
    Mamba1 model's forward of several tokens over a cache restarts its scan, and Mamba's / Falcon-Mamba's steps take
    no attention mask: they go one token a step, maskless, as their generate does. Controls: either rule left out
    moves a Mamba1 model's scores (found by the families fuzzer: 1.2-1.6 off)."""
    from specdec_fast.engine import outputs

    model = tiny(kind)
    assert _scores_distance(model) < 1e-4
    if kind == "mamba2":
        return
    for rule in ("MASKLESS_STEP_TYPES", "SCAN_RESTARTING_TYPES"):
        with monkeypatch.context() as patch:
            patch.setattr(outputs, rule, ())
            assert _spoiled_distance(model) > 1e-2, rule


def _spoiled_distance(model) -> float:
    """_scores_distance where a spoiled rule may also fail outright (a mask broadcast over a step's width raises, or
    the tokens part): infinity then."""
    try:
        return _scores_distance(model)
    except (RuntimeError, AssertionError):
        return float("inf")


def test_the_first_layer_drafts():
    """assistant_early_exit=1: the model's first layer drafts over the paged runner (its config's layer_types, a
    property of the layer count, is not cut: it has no setter); greedy equals model.generate."""
    import specdec_fast

    from .models import left_padded_prompts

    model = tiny("mamba", seed=4)
    ids, mask = left_padded_prompts([9, 1, 3], vocab=VOCAB, seed=2)
    opts = dict(do_sample=False, max_new_tokens=8, pad_token_id=0)
    expected = model.generate(ids, attention_mask=mask, **opts)
    assert torch.equal(specdec_fast.generate(model, ids, mask, assistant_early_exit=1, runner="paged", **opts), expected)


def test_the_mamba1_scan_in_chunks(monkeypatch):
    """The Mamba1 scan's inputs a chunk at a time (mamba1.SCAN_CHUNK, 2 here: the prefill's rows of up to 9 tokens and
    the score calls of up to 4 cross chunks): the logits are the forward's."""
    from specdec_fast.runners import mamba1

    monkeypatch.setattr(mamba1, "SCAN_CHUNK", 2)
    model = tiny("falcon_mamba")
    assert_runner_matches_forward(model, _runner(model), VOCAB)
