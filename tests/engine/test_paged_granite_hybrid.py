"""Granite 4.0's hybrids on the paged runner (runners/paged_granite_hybrid.py): Mamba2 layers (runners/mamba2.py)
whose states are rolled back at commit, attention layers on the paged cache, a shared SwiGLU MLP and (Granite
4.0-H Tiny / Small) experts, under Granite's four scalars. Tiny models (layers M * M M: Mamba2 of 8 heads of
16, 2 groups of state 16, kernel 4; attention of 4 heads over 2 KV heads of 16): "h_micro" (no experts),
"h_tiny" (8 experts of 32, top 2), "rope" (h_tiny with RoPE on its attention layer); embedding_multiplier 2,
residual_multiplier 0.5, attention_multiplier 0.1, logits_scaling 3; and "bamba" (Bamba: the same layers without
experts or scalars, RoPE on half of each head, its MLP and norms under other names); dt_bias, A_log, D and the
gated norm's weight drawn away from their initial values.

The runner is chosen by the config (runners/registry.BY_CONFIG): the hybrids here, Granite 4.0's dense
transformers on the Llama runner. Its logits equal the model's own forward on every backend through prefill,
left-padded score calls, rollbacks and chained calls; bfloat16 stays close; greedy generate(runner="paged")
equals model.generate with a draft model, prompt lookup and plain decoding; the static graph twin gives the
eager tokens. Controls: no rollback, no chaining (runner_checks.assert_rollback_controls_fail), and the
scalars: each left out moves the logits off the forward's."""
import pytest
import torch

from specdec_fast.runners.paged_granite_hybrid import PagedGraniteHybridRunner
from specdec_fast.runners.paged_llama import PagedLlamaRunner
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device
from .runner_checks import (assert_bf16_close_to_forward, assert_greedy_paged_equals_generate,
                            assert_rollback_controls_fail, assert_runner_matches_forward)

VOCAB = 96
KINDS = ("h_micro", "h_tiny", "rope", "bamba")


def tiny_granite_hybrid(kind: str = "h_tiny", seed: int = 0, **overrides):
    import transformers as tf

    torch.manual_seed(seed)
    layers = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
    if kind == "bamba":
        config = tf.BambaConfig(**dict(dict(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
            mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0), **overrides))
        return _drawn(tf.AutoModelForCausalLM.from_config(config).float().eval())
    config = tf.GraniteMoeHybridConfig(**dict(dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=4,
        layer_types=layers, num_attention_heads=4, num_key_value_heads=2, num_local_experts=0 if kind == "h_micro" else 8,
        num_experts_per_tok=2, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_head=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=8, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1,
        logits_scaling=3.0, position_embedding_type="rope" if kind == "rope" else None, max_position_embeddings=256,
        initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0), **overrides))
    return _drawn(tf.AutoModelForCausalLM.from_config(config).float().eval())


def _drawn(model):
    """The Mamba2 layers' dt_bias, A_log, D and gated norm weight drawn away from their initial values; no EOS."""
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.block_type == "linear_attention":
                layer.mamba.dt_bias.normal_(0, 0.5)
                layer.mamba.A_log.normal_(0, 0.5)
                layer.mamba.D.normal_(1, 0.3)
                layer.mamba.norm.weight.normal_(1, 0.2)
    model.generation_config.eos_token_id = None
    return model


def _runner(model, **kw):
    return PagedGraniteHybridRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, **kw)


def test_the_runner_is_chosen_by_the_config(tmp_path):
    """The hybrids (Mamba2 layers, or experts) on this runner, the dense transformers on the Llama runner; so does
    paged_runner_from_pretrained, from the checkpoint's config; so does tensor parallelism (the hybrids and the
    experts on their own runner, the dense transformers on the Llama one's)."""
    from specdec_fast.runners.registry import paged_runner_from_pretrained, shard_model

    assert paged_runner_class(tiny_granite_hybrid("h_micro")) is PagedGraniteHybridRunner
    assert paged_runner_class(tiny_granite_hybrid("bamba")) is PagedGraniteHybridRunner
    experts_only = tiny_granite_hybrid(layer_types=["full_attention"] * 4)  # attention layers, experts
    assert paged_runner_class(experts_only) is PagedGraniteHybridRunner
    dense = tiny_granite_hybrid("h_micro", layer_types=["full_attention"] * 4)
    assert paged_runner_class(dense) is PagedLlamaRunner
    hybrid = tiny_granite_hybrid("h_micro")
    hybrid.save_pretrained(tmp_path)
    runner = paged_runner_from_pretrained(tmp_path, max_new_tokens=4, num_draft_tokens=1)
    assert type(runner) is PagedGraniteHybridRunner and len(runner.recurrent_shapes) == 3
    from specdec_fast.runners.paged_granite_hybrid_tp import TPPagedGraniteHybridRunner
    from specdec_fast.runners.paged_llama_tp import TPPagedLlamaRunner
    from specdec_fast.runners.registry import _tp_runner_for_config

    assert _tp_runner_for_config(hybrid.config) is TPPagedGraniteHybridRunner  # its Mamba2 layers by heads
    assert _tp_runner_for_config(experts_only.config) is TPPagedGraniteHybridRunner  # its experts by their width
    assert _tp_runner_for_config(dense.config) is TPPagedLlamaRunner
    with pytest.raises(ValueError, match="tensor parallelism needs torch.distributed initialised"):
        shard_model(hybrid, None)  # taken: the group is what is missing


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_hf_forward(kind, backend, device):
    device = backend_device(backend, device)
    model = tiny_granite_hybrid(kind).to(device)
    assert_runner_matches_forward(model, _runner(model, backend=backend), VOCAB)


def test_bfloat16_close_to_the_float32_forward():
    reference = tiny_granite_hybrid("h_micro")
    model = tiny_granite_hybrid("h_micro").to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedGraniteHybridRunner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB,
                                 reference=reference)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_paged_equals_generate(kind):
    assert_greedy_paged_equals_generate(tiny_granite_hybrid(kind, seed=5), VOCAB)


def test_static_graph_twin_gives_the_eager_tokens():
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny_granite_hybrid(seed=3), VOCAB)


@pytest.mark.parametrize("scalar", ["embedding_multiplier", "residual_multiplier", "logits_scaling", "scale"])
def test_controls(scalar, monkeypatch):
    """The rollback and the chaining (as every recurrent runner's), and each of Granite's scalars set to 1 on the
    runner (the softmax scale: attention_multiplier's): each moves the logits off the forward's."""
    model = tiny_granite_hybrid("rope")
    if scalar == "scale":
        assert_rollback_controls_fail(monkeypatch, PagedGraniteHybridRunner, model, VOCAB, max_new_tokens=8,
                                      num_draft_tokens=3, block_size=4)
    runner = _runner(model)
    setattr(runner, scalar, 1.0)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)
