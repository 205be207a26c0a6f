"""AFMoE (Arcee Trinity) and Laguna (poolside) on the paged runner (runners/paged_gated_attention.py): a gate on
the attention's output (AFMoE's sigmoid per element, Laguna's softplus per head or per element), per-head q/k
norms, sliding and full layers (AFMoE's full ones NoPE; Laguna's rotating half of each head, its layers of 4 and 6
query heads), sigmoid-routed experts (runners/_moe.py SIGMOID_TOPK_VARIANTS) with a shared expert.

The runner's logits equal the model's own forward on every backend through prefill, left-padded score calls,
rollbacks and chained calls (the window of 8 passed); bfloat16 stays close; greedy generate(runner="paged")
equals model.generate with a draft model, prompt lookup and plain decoding; the static graph twin gives the
eager tokens. Controls: each piece of the math left out moves the logits off the forward's."""
import pytest
import torch

from specdec_fast.runners.paged_gated_attention import PagedGatedAttentionRunner
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .models import make_model
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_runner_matches_forward)

VOCAB = 96
# (kind, Laguna's gating): AFMoE; Laguna with a gate a head, and one an element
CASES = [("afmoe", None), ("laguna", "per-head"), ("laguna", "per-element")]


def tiny(kind: str, gating=None, seed: int = 0, layers: int = 3):
    """make_model's kind of 3 layers (sliding, full, sliding), the correction biases randomised (the
    initialiser's zeros would leave the choice to the scores alone)."""
    model = make_model(kind, vocab=VOCAB, layers=layers, seed=seed)
    if gating is not None and gating != model.config.gating:  # the gate projection's width follows the config
        config = model.config
        config.gating = gating
        model = type(model)(config).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            mlp = layer.mlp
            bias = getattr(mlp, "expert_bias", None)
            bias = bias if bias is not None else getattr(getattr(mlp, "gate", None), "e_score_correction_bias", None)
            if bias is not None:
                bias.normal_(0, 0.3)
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedGatedAttentionRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def test_the_runner_and_its_layers():
    """Both types take this runner; AFMoE rotates its sliding layers only, Laguna every layer with its own query
    heads; the first layer is dense, the others MoE."""
    afmoe, laguna = tiny("afmoe"), tiny("laguna")
    assert paged_runner_class(afmoe) is paged_runner_class(laguna) is PagedGatedAttentionRunner
    runner = _runner(afmoe)
    assert [layer.rope for layer in runner.layers] == [True, False, True]
    assert [layer.moe is None for layer in runner.layers] == [True, False, False]
    assert runner.embed_scale == 48**0.5
    runner = _runner(laguna)
    assert [layer.heads for layer in runner.layers] == [4, 6, 4] and all(layer.rope for layer in runner.layers)
    assert runner.layers[1].moe.output_scale == 1.5 and runner.layers[1].moe.logit_cap == 2.0


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("kind,gating", CASES)
def test_logits_equal_hf_forward(kind, gating, backend, device):
    device = backend_device(backend, device)
    model = tiny(kind, gating).to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


@pytest.mark.parametrize("kind", ["afmoe", "laguna"])
def test_bfloat16_close_to_the_float32_forward(kind):
    reference = tiny(kind)
    model = tiny(kind).to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedGatedAttentionRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB,
                                 reference=reference)


@pytest.mark.parametrize("kind", ["afmoe", "laguna"])
def test_greedy_paged_equals_generate(kind):
    assert_greedy_paged_equals_generate(tiny(kind, seed=5), VOCAB)


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny("laguna", seed=3), VOCAB)


def _spoil(runner, left_out: str) -> None:
    """One piece of the runner's math left out (or, for the rotation, added where the model has none)."""
    moes = [layer.moe for layer in runner.layers if layer.moe is not None]
    if left_out == "gate":  # the attention's output ungated
        runner._gated = lambda o, h, layer: o.reshape(o.shape[0], -1)
    elif left_out == "nope":  # AFMoE's full layers rotated as its sliding ones
        for layer in runner.layers:
            layer.rope = True
    elif left_out == "mup":
        runner.embed_scale = None
    elif left_out == "branch_norms":  # AFMoE's norms of each branch's output
        for layer in runner.layers:
            layer.post_attention = layer.post_mlp = None
    elif left_out == "softplus":  # Laguna's per-head gate through AFMoE's sigmoid
        runner._gated = lambda o, h, layer: (o * torch.sigmoid(h @ layer.gate.T).unsqueeze(-1)).reshape(o.shape[0], -1)
    elif left_out in ("weight_scale", "output_scale", "logit_cap"):
        for moe in moes:
            setattr(moe, left_out, None)
    elif left_out == "correction":
        for moe in moes:
            moe.correction = torch.zeros_like(moe.correction)
    else:
        raise ValueError(left_out)


@pytest.mark.parametrize("kind,left_out", [
    ("afmoe", "gate"), ("afmoe", "nope"), ("afmoe", "mup"), ("afmoe", "branch_norms"), ("afmoe", "weight_scale"),
    ("afmoe", "correction"), ("laguna", "gate"), ("laguna", "softplus"), ("laguna", "output_scale"),
    ("laguna", "logit_cap"), ("laguna", "correction")])
def test_controls(kind, left_out):
    """Each piece of the math left out moves the logits off the forward's."""
    model = tiny(kind, "per-head" if kind == "laguna" else None)
    runner = _runner(model)
    _spoil(runner, left_out)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_per_layer_heads_on_the_triton_plan():
    """Laguna's layers of 4 and 6 query heads over 2 KV heads each get a Triton launch plan of their own group
    size: paged_base._plan keys on the query heads (a recording planner in place of kernels/attention's
    plan_launch, which reads the CUDA device)."""
    from .models import left_padded_prompts

    runner = _runner(tiny("laguna"))
    runner.prefill(*left_padded_prompts([3, 5], vocab=VOCAB))
    runner._triton = (None, None, lambda device, batch, kv_heads, group, *args, **kw: (kv_heads, group))
    plans = [runner._plan(4, i, layer.heads) for i, layer in enumerate(runner.layers)]
    assert plans == [(2, 2), (2, 3), (2, 2)] and len(runner._plans) == 2
