"""Nemotron-H on the paged runner (runners/paged_nemotron_h.py): Mamba2 layers (runners/mamba2.py) whose states
are rolled back at commit (runners/paged_recurrent.py), between attention layers without positions on the
paged cache and relu^2 MLP or MoE blocks. Tiny models: blocks M * - M - (2 Mamba2 layers of 8 heads of 8, 2
groups of state 16, kernel 4; one attention layer of 4 heads over 2 KV heads of 16), or M E * E M with MoE
blocks (Nemotron 3 Nano's: 8 ungated experts of 32 in 2 groups, 1 kept, top 2, a shared MLP of 48; "moe_latent":
the experts in a latent width of 24); dt_bias, A_log, D, the gated norm's weight and the routers' correction
bias drawn away from their initial values so that each term shows.

The runner's logits equal the model's own forward on every backend through prefill, left-padded score calls,
commits that keep part of the tentative tokens and two score calls before one commit; a prefill in chunks
carries the state across them; bfloat16 stays close; greedy generate(runner="paged") equals model.generate
with a draft model, prompt lookup, the model's own first layers and plain decoding; the static graph twin gives
the eager tokens. Controls: commit without selecting the states (the rollback), a score call from the committed
state instead of the last snapshot, and dt unclamped (its time_step_min) each move the logits off the forward's.
Refused by name: token trees."""
import pytest
import torch

import specdec_fast
import specdec_fast.api as api
from specdec_fast.runners.paged_nemotron_h import PagedNemotronHRunner, nemotron_h_unsupported_reason
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .models import left_padded_prompts, make_draft
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_rollback_controls_fail, assert_runner_matches_forward)

VOCAB = 96
BLOCKS = ["linear_attention", "full_attention", "mlp", "linear_attention", "mlp"]
KINDS = ("dense", "moe", "moe_latent")
MOE = dict(layers_block_type=["linear_attention", "moe", "full_attention", "moe", "linear_attention"], n_routed_experts=8,
           num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2,
           topk_group=1, routed_scaling_factor=2.0)


def tiny_nemotron_h(seed: int = 0, kind: str = "dense", **overrides):
    import transformers as tf

    torch.manual_seed(seed)
    if kind != "dense":
        overrides = dict(MOE, **({"moe_latent_size": 24} if kind == "moe_latent" else {}), **overrides)
    config = tf.NemotronHConfig(**dict(dict(
        vocab_size=VOCAB, hidden_size=64, layers_block_type=BLOCKS, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16,
        conv_kernel=4, chunk_size=8, max_position_embeddings=256, initializer_range=0.15, bos_token_id=1, eos_token_id=2,
        pad_token_id=0), **overrides))
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.block_type == "linear_attention":
                mixer = layer.mixer
                mixer.dt_bias.normal_(0, 0.5)
                mixer.A_log.normal_(0, 0.5)
                mixer.D.normal_(1, 0.3)
                mixer.norm.weight.normal_(1, 0.2)
            if layer.block_type == "moe":
                layer.mixer.gate.weight.normal_(0, 0.3)
                layer.mixer.gate.e_score_correction_bias.normal_(0, 0.5)
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedNemotronHRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def test_registry_and_the_pool():
    """The paged runner is picked; the pool holds the attention layer only, each Mamba2 layer a committed state
    and K + 1 snapshots (and a spare slot for padded positions' writes)."""
    model = tiny_nemotron_h()
    assert paged_runner_class(model) is PagedNemotronHRunner and nemotron_h_unsupported_reason(model) is None
    runner = _runner(model)
    runner.allocate(2, 20)
    assert runner.cache.kv.shape[0] == 1 and len(runner.states) == 2
    st = runner.states[0]
    # conv over [x | B | C] = 8 x 8 + 2 x 2 x 16 = 128 channels, kernel 4; the state: 8 heads of 8 x 16
    assert tuple(st.conv.shape) == (2, 128, 3) and tuple(st.rec_tent.shape) == (2, 5, 8, 8, 16)
    states = 2 * 2 * (2 + 4) * (128 * 3 * 4 + 8 * 8 * 16 * 4)  # layers x rows x (committed, 4 snapshots, spare) x bytes
    assert runner.kv_sizes(2, 20) == (2 * 2 * 16 * 4, states)  # 1 attention layer's K and V a token; the states
    assert runner.kv_bytes == runner.cache.kv.numel() * 4 + states


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_hf_forward(kind, backend, device):
    device = backend_device(backend, device)
    model = tiny_nemotron_h(kind=kind).to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


def test_a_prefill_in_chunks_carries_the_state(monkeypatch):
    """Chunks of 2 tokens: the prompts of 5 and 9 run 3 and 5 chunks, the state carried between them."""
    monkeypatch.setattr("specdec_fast.runners.mamba2.PREFILL_CHUNK", 2)
    model = tiny_nemotron_h(seed=1)
    assert_runner_matches_forward(model, _runner(model), VOCAB)


def test_bfloat16_close_to_the_float32_forward():
    reference = tiny_nemotron_h()
    model = tiny_nemotron_h().to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedNemotronHRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB,
                                 reference=reference)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_paged_equals_generate(kind, batch):
    assert_greedy_paged_equals_generate(tiny_nemotron_h(seed=5, kind=kind), VOCAB, lengths=[6] if batch == 1 else (4, 10, 7),
                                        extra=(dict(assistant_early_exit=2),))


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny_nemotron_h(seed=3), VOCAB)


def test_controls(monkeypatch):
    """Spoiled: (1) commit leaves the committed states as they were; (2) every score call starts from the
    committed state; (3) dt not clamped at time_step_min (set to 0.5 here, above most softplus values). Each
    moves the logits off the forward's, which assert_runner_matches_forward checks."""
    from specdec_fast.runners import mamba2

    assert_rollback_controls_fail(monkeypatch, PagedNemotronHRunner, tiny_nemotron_h(), VOCAB, max_new_tokens=8,
                                  num_draft_tokens=3, block_size=4)
    clamped = tiny_nemotron_h(time_step_min=0.5)
    assert_runner_matches_forward(clamped, _runner(clamped), VOCAB)
    monkeypatch.setattr(mamba2.Mamba2, "__init__", lambda self, mixer, init=mamba2.Mamba2.__init__:
                        (init(self, mixer), setattr(self, "dt_min", 0.0))[0])
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(clamped, _runner(clamped), VOCAB)


@pytest.mark.parametrize("latent", [None, 24])
def test_the_moe_block_equals_transformers(latent):
    """Nemotron 3 Nano's MoE block (runners/_moe.py's ungated layout: routing, experts in the latent width
    where set, the shared MLP) against transformers' NemotronHMoE on the same tokens, each of the torch
    paths: a few pairs gathered, a prefill's chosen experts, every expert."""
    from specdec_fast.runners._moe import MoE

    model = tiny_nemotron_h(kind="moe_latent" if latent else "moe")
    block = model.model.layers[1].mixer
    moe = MoE(block, model.config)
    assert moe.layout == "ungated" and (moe.latent is not None) == bool(latent) and moe.shared[0][0] is None
    for tokens in (1, 9):
        h = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
        expected = block(h[None])[0]
        for prefill in (False, True):
            torch.testing.assert_close(moe(h, prefill), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernels", ["cpp", "triton"])
@pytest.mark.parametrize("latent", [None, 24])
def test_the_moe_experts_run_in_the_moe_kernels(kernels, latent):
    """The ungated relu^2 experts through kernels/moe (act "relu2": the C++ op, the Triton schedules interpreted)
    equal transformers' NemotronHMoE, decode-sized and prefill-sized calls."""
    from specdec_fast.kernels._backend import cpp_op_available
    from specdec_fast.runners._moe import MoE

    if kernels == "triton":
        pytest.importorskip("triton")
    elif not cpp_op_available("moe_experts"):
        pytest.skip("the C++ op did not build")
    model = tiny_nemotron_h(kind="moe_latent" if latent else "moe")
    block = model.model.layers[1].mixer
    moe = MoE(block, model.config, kernels)
    assert moe.kernels == kernels and moe.kernel_act == "relu2"
    for tokens in (1, 9):
        h = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
        torch.testing.assert_close(moe(h, True), block(h[None])[0], atol=1e-5, rtol=1e-5)


def test_token_trees_decode_exactly():
    """Token trees on the Mamba2 layers (each node from its parent's state and convolution window): greedy equals
    model.generate with a draft model."""
    from specdec_fast.drafters.token_tree import TokenTree

    target = tiny_nemotron_h()
    ids, mask = left_padded_prompts([4, 10, 7], vocab=VOCAB, seed=3)
    kw = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, **kw)
    out, stats = api.generate(target, ids, mask, runner="paged", assistant_model=make_draft(target, noise=0.03),
                              tree=TokenTree.from_branching([2, 2, 1]), return_stats=True, **kw)
    assert torch.equal(out, expected) and stats.mean_accepted_length > 1.5
    specdec_fast.release_engines(target)


def test_refusals():
    """The hf runner refuses the recurrent layers (runner="hf": by name)."""
    from specdec_fast.runners.hf import hf_refusal

    target = tiny_nemotron_h()
    assert "keeps a recurrent state" in hf_refusal(target)
