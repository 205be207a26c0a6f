"""MiniMax-Text-01 / M1 on the paged runner (runners/paged_minimax.py): lightning attention layers (runners/lightning.py:
each row's [H, D, D] state snapshotted per draft token and rolled back at commit) with a GQA attention layer every
3rd, Mixtral's experts in every layer, residual factors of each layer kind applied to the normed input. Tiny models of
3 layers (4 heads of 12; transformers' prefill in blocks of 4, so its block form and its token-by-token form both
run).

The scan equals a token-by-token recurrence over padded rows, in chunks of any size; the runner's logits equal the
model's own forward on every backend through prefill, left-padded score calls, rollbacks and chained calls, with the
scan in chunks of 2; bfloat16 stays close; greedy generate(runner="paged") equals model.generate with a draft model,
prompt lookup and plain decoding; the static graph twin gives the eager tokens. Controls: no rollback, no chaining
(runner_checks.assert_rollback_controls_fail), no decay, each kind's residual factors swapped. The norms are
randomised, so a residual of the raw input instead of the normed one would not pass either."""
from functools import partial

import pytest
import torch

from specdec_fast.kernels.chunk_scan import chunk_scan
from specdec_fast.runners import lightning
from specdec_fast.runners.chunked_prefill import scalar_decay_prefill
from specdec_fast.runners.paged_minimax import PagedMiniMaxRunner, minimax_unsupported_reason
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .models import VOCAB, make_model
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_rollback_controls_fail, assert_runner_matches_forward)


def tiny(seed: int = 0):
    """make_model's MiniMax of 3 layers, its norms randomised (their inits are ones)."""
    model = make_model("minimax", layers=3, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedMiniMaxRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def _token_by_token(slope, q, k, v, real, state):
    """The recurrence written out: S = lambda S + k^T v at each real column, o = q S (float64)."""
    lam = torch.exp(-slope.double())[None, :, None, None]
    outs, states = [], []
    state = state.double()
    for t in range(q.shape[2]):
        update = k[:, :, t, :, None].double() * v[:, :, t, None, :].double()
        state = torch.where(real[:, t, None, None, None], lam * state + update, state)
        outs.append(q[:, :, t, None].double() @ state)
        states.append(state)
    return torch.cat(outs, dim=2), state, torch.stack(states, dim=1)


@pytest.mark.parametrize("chunk", [1, 2, 3, 64])
def test_the_scan_is_the_recurrence(monkeypatch, chunk):
    """Rows of 7, 4 and 1 real tokens (left padding zero) from random states, every output and every snapshot; the
    prefill's chunk form (its outputs, the last state) too."""
    monkeypatch.setattr(lightning, "CHUNK", chunk)
    gen = torch.Generator().manual_seed(chunk)
    batch, heads, n, dim = 3, 2, 7, 5
    real = torch.arange(n)[None, :] >= torch.tensor([0, 3, 6])[:, None]
    q, k, v = (torch.randn(batch, heads, n, dim, generator=gen) * real[:, None, :, None] for _ in range(3))
    state = torch.randn(batch, heads, dim, dim, generator=gen)
    slope = torch.tensor([0.3, 0.05])
    rank = real.long().cumsum(1) - 1
    o, last, after = lightning.lightning_scan(slope, q, k, v, rank, state)
    ref_o, ref_last, ref_after = _token_by_token(slope, q, k, v, real, state)
    tol = dict(atol=1e-5, rtol=1e-5)  # float32 against float64
    torch.testing.assert_close((o * real[:, None, :, None]).double(), ref_o * real[:, None, :, None], **tol)
    torch.testing.assert_close(last.double(), ref_last, **tol)
    torch.testing.assert_close(after.double(), ref_after, **tol)
    # a prefill's form (runners/chunked_prefill.py, chunks of the same size; its carry the torch loop)
    g = -slope[None, :, None] * real[:, None, :]
    carried = state.clone()
    o = scalar_decay_prefill(partial(chunk_scan, backend="torch"), q, k, v, g, carried, chunk)
    torch.testing.assert_close((o * real[:, None, :, None]).double(), ref_o * real[:, None, :, None], **tol)
    torch.testing.assert_close(carried.double(), ref_last, **tol)


def test_the_runner_and_its_pool():
    """The runner is picked; one attention layer on the paged cache, two linear states of 4 heads x 12 x 12 (a
    committed one, K + 1 snapshots and a spare)."""
    model = tiny()
    assert paged_runner_class(model) is PagedMiniMaxRunner and minimax_unsupported_reason(model) is None
    runner = _runner(model)
    runner.allocate(2, 20)
    assert runner.cache.kv.shape[0] == 1 and len(runner.states) == 2
    assert tuple(runner.states[0].rec.shape) == (2, 4, 12, 12) and tuple(runner.states[0].rec_tent.shape) == (2, 5, 4,
                                                                                                               12, 12)


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_logits_equal_hf_forward(backend, device):
    device = backend_device(backend, device)
    model = tiny().to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


def test_logits_with_the_scan_in_chunks_of_two(monkeypatch):
    monkeypatch.setattr(lightning, "CHUNK", 2)
    model = tiny(seed=1)
    assert_runner_matches_forward(model, _runner(model), VOCAB)


def test_bfloat16_close_to_the_forward():
    reference = tiny()
    model = tiny().to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedMiniMaxRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB,
                                 reference=reference)


def test_greedy_paged_equals_generate():
    """Against each row's own generate: transformers 5.24 decodes a left-padded MiniMax batch wrongly where layer 0 is
    a lightning layer (as in the checkpoints: its cache's length is read from layer 0, which holds no keys, so the
    decode steps' attention masks lose the padding; rows 0 and 2 of this batch then differ from their own generate,
    and with layer 0 an attention layer every row agrees)."""
    assert_greedy_paged_equals_generate(tiny(seed=5), VOCAB, per_row=True)


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny(seed=3), VOCAB)


def _spoiled(runner, spoil) -> None:
    for layer in runner.layers:
        spoil(layer)


@pytest.mark.parametrize("spoil", [
    lambda layer: setattr(layer.mixer, "slope", torch.zeros_like(layer.mixer.slope)) if layer.kind != "full_attention"
    else None,  # no decay
    lambda layer: (setattr(layer, "attn_alpha", layer.attn_beta), setattr(layer, "attn_beta", layer.attn_alpha)),
    lambda layer: (setattr(layer, "mlp_alpha", layer.mlp_beta), setattr(layer, "mlp_beta", layer.mlp_alpha)),
], ids=["no-decay", "attention-factors-swapped", "mlp-factors-swapped"])
def test_controls(spoil):
    model = tiny()
    runner = _runner(model)
    _spoiled(runner, spoil)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_rollback_controls(monkeypatch):
    assert_rollback_controls_fail(monkeypatch, PagedMiniMaxRunner, tiny(), VOCAB, max_new_tokens=8,
                                  num_draft_tokens=3, block_size=4)


def test_refusals():
    model = tiny()
    model.config.sliding_window = 16
    assert "sliding_window" in minimax_unsupported_reason(model)
    model.config.sliding_window = None
    model.config.layer_types = ["linear_attention", "mamba", "full_attention"]
    assert "layer_types" in minimax_unsupported_reason(model)


def _scores_distance(model) -> float:
    """Greedy generate(runner="paged") with output_scores on two unpadded rows (transformers' padded MiniMax batch is
    wrong: test_greedy_paged_equals_generate) against model.generate's: the largest score difference."""
    import specdec_fast

    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    opts = dict(do_sample=False, max_new_tokens=6, pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    ref = model.generate(ids, **opts)
    ours = specdec_fast.generate(model, ids, runner="paged", prompt_lookup_num_tokens=2, **opts)
    assert torch.equal(ours.sequences, ref.sequences)
    return max((a - b).abs().max().item() for a, b in zip(ref.scores, ours.scores))


def test_output_scores_equal_generate(monkeypatch):
    """output_scores are recomputed after the loop by the model's own forwards (engine/outputs.step_forwards): a MiniMax
    forward of several tokens over a cache reads the cache's length from its lightning layer 0 (no keys), so its causal
    mask is wrong; its steps go one token a forward, as its generate does. Control: the rule left out (2.3 off)."""
    from specdec_fast.engine import outputs

    model = tiny(seed=5)
    assert _scores_distance(model) < 1e-4
    monkeypatch.setattr(outputs, "LAYER0_LENGTH_TYPES", ())
    assert _scores_distance(model) > 1e-2
