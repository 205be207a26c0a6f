"""Llama 4's text decoder on the paged runner (runners/paged_llama4.py): chunked attention on the
RoPE layers (chunks of 8 here, so every check crosses boundaries), NoPE layers with the attention
temperature (floor_scale 4: it changes every 4 positions), RoPE on interleaved pairs, the weightless
q/k L2 norm, top-1 sigmoid MoE layers whose weight scales the expert's input beside dense layers.

The runner's logits equal the model's own forward on every backend (prefill, left-padded score calls,
rollback; rows cross chunk boundaries inside a call); bfloat16 stays close; greedy
generate(runner="paged") equals model.generate with a draft, prompt lookup and plain decoding; long
rows keep the chunked layers on the ring cache. Controls: the chunk, the temperature, the pair order,
the q/k norm and the input scaling are each needed. Refusals by name."""
import pytest
import torch

import specdec_fast
import specdec_fast.api as api
from specdec_fast.runners.paged_llama4 import PagedLlama4Runner, llama4_unsupported_reason
from specdec_fast.runners.registry import choose_runner, paged_runner_class

from ..conftest import backend_device
from .models import left_padded_prompts, make_draft
from .runner_checks import assert_bf16_close_to_forward, assert_runner_matches_forward, hf_logits

VOCAB = 96
CHUNK = 8
KINDS = ("scout", "maverick")


def tiny_llama4(kind: str = "scout", seed: int = 0, **overrides):
    """A random fp32 Llama4ForCausalLM: 4 layers (the fourth NoPE: full attention with the temperature,
    the others chunked RoPE layers), 4 q / 2 kv heads of 16, 4 experts, top 1, a shared expert. "scout":
    every layer MoE, q/k norms (Scout's); "maverick": MoE on layers 1 and 3 beside dense MLPs of
    another width, no q/k norm (Maverick's)."""
    import transformers as tf

    torch.manual_seed(seed)
    maverick = kind == "maverick"
    config = tf.Llama4TextConfig(**{**dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=2 if maverick else 1, use_qk_norm=not maverick, attention_chunk_size=CHUNK,
        floor_scale=4, attn_scale=0.5, max_position_embeddings=256, initializer_range=0.15, bos_token_id=1,
        eos_token_id=2, pad_token_id=0,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}), **overrides})
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    model.generation_config.eos_token_id = None
    return model


def test_layers_read_as_llama4_computes_them():
    model = tiny_llama4("maverick")
    assert paged_runner_class(model) is PagedLlama4Runner and llama4_unsupported_reason(model) is None
    runner = PagedLlama4Runner(model, max_new_tokens=8, num_draft_tokens=3)
    assert runner.layer_chunks == (CHUNK, CHUNK, CHUNK, None)
    assert [layer.rope for layer in runner.layers] == [True, True, True, False]
    assert [layer.scaled_query for layer in runner.layers] == [False, False, False, True]
    assert [layer.moe is not None for layer in runner.layers] == [False, True, False, True]
    assert all(layer.qk_norm is None for layer in runner.layers)  # Maverick: no q/k norm
    assert all(layer.rope_order is not None for layer in runner.layers[:3]) and runner.layers[3].rope_order is None


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_hf_forward(kind, backend, device):
    device = backend_device(backend, device)
    model = tiny_llama4(kind).to(device)
    runner = PagedLlama4Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    contexts = assert_runner_matches_forward(model, runner, VOCAB)
    assert max(len(c) for c in contexts) > 2 * CHUNK  # the rows crossed chunk boundaries
