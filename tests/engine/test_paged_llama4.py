"""Llama 4's text decoder on the paged runner (runners/paged_llama4.py): chunked attention on the
RoPE layers (chunks of 5 here, so every check crosses boundaries), NoPE layers with the attention
temperature (floor_scale 4: it changes every 4 positions), RoPE on interleaved pairs, the weightless
q/k L2 norm, top-1 sigmoid MoE layers whose weight scales the expert's input beside dense layers.

The runner's logits equal the model's own forward on every backend (prefill, left-padded score calls,
rollback; rows cross chunk boundaries inside a call); bfloat16 stays close; greedy
generate(runner="paged") equals model.generate with a draft, prompt lookup and plain decoding; long
rows keep the chunked layers on the ring cache. Controls: the chunk, the temperature, the pair order,
the q/k norm and the input scaling are each needed. Token trees cross chunks. Refusals by name."""
import pytest
import torch

import specdec_fast
import specdec_fast.api as api
from specdec_fast.runners.hf import UnsupportedModelError
from specdec_fast.runners.paged_llama4 import PagedLlama4Runner, llama4_unsupported_reason
from specdec_fast.runners.registry import choose_runner, paged_runner_class

from ..conftest import backend_device
from .models import left_padded_prompts, make_draft
from .runner_checks import assert_bf16_close_to_forward, assert_runner_matches_forward, hf_logits

VOCAB = 96
CHUNK = 5  # off the pages (4) and the kernels' tiles: boundaries fall inside them
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


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_close_to_the_float32_forward(kind):
    reference = tiny_llama4(kind)
    model = tiny_llama4(kind).to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedLlama4Runner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB,
                                 reference=reference)


def _generate_each_row(target, ids, mask, **kw):
    """model.generate on each row alone (no pads), right-aligned into one [B, width + new] tensor."""
    rows = []
    for b in range(ids.shape[0]):
        prompt = ids[b, mask[b].bool()][None]
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt), **kw)
        rows.append(torch.cat([ids[b, : ids.shape[1] - prompt.shape[1]], out[0]]))
    return torch.stack(rows)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_paged_equals_generate(kind):
    """Every drafting method (a draft model, prompt lookup, the target's first 2 layers: its base model at .model
    though its base_model_prefix says language_model) gives model.generate's tokens, 20 new tokens past several
    chunks. Batch 1, and
    a left-padded batch of 3 against generate on each row alone: transformers' temperature counts a padded
    row's positions from the first pad (the module docstring), so its batched output differs from its own
    output on the row alone wherever the pads move a row across a multiple of floor_scale (4 here)."""
    target = tiny_llama4(kind, seed=5)
    kw = dict(do_sample=False, max_new_tokens=20, pad_token_id=0)
    for lengths in ([6], [4, 10, 7]):
        ids, mask = left_padded_prompts(lengths, vocab=VOCAB, seed=len(lengths))
        expected = _generate_each_row(target, ids, mask, **kw)
        if len(lengths) == 1:
            assert torch.equal(expected, target.generate(ids, attention_mask=mask, **kw))
        for drafting in (dict(assistant_model=make_draft(target, noise=0.03), num_assistant_tokens=3),
                         dict(prompt_lookup_num_tokens=2), dict(assistant_early_exit=2), {}):
            out = api.generate(target, ids, mask, runner="paged", **kw, **drafting)  # runner="paged": no fallback
            assert torch.equal(out, expected), (lengths, drafting)
    specdec_fast.release_engines(target)


def test_a_padded_batch_equals_batched_generate_at_the_published_floor_scale():
    """With floor_scale 8192 (Scout's and Maverick's configs) the temperature is 1 on every row of the
    suite, padded or not: the paged batch equals model.generate's batched output itself."""
    target = tiny_llama4("scout", seed=7, floor_scale=8192)
    ids, mask = left_padded_prompts([3, 9, 6], vocab=VOCAB, seed=4)
    kw = dict(do_sample=False, max_new_tokens=16, pad_token_id=0)
    out = api.generate(target, ids, mask, runner="paged", assistant_model=make_draft(target, noise=0.03),
                       num_assistant_tokens=3, **kw)
    assert torch.equal(out, target.generate(ids, attention_mask=mask, **kw))
    specdec_fast.release_engines(target)


def test_long_rows_keep_the_chunked_layers_on_a_ring(monkeypatch):
    """Prefill in chunks of 3 tokens: the ring (sized for the chunk and the tentative tokens) is
    smaller than a row, so the chunked layers read a ring and the NoPE layer the full cache; the
    logits still equal the forward's."""
    from specdec_fast.runners.paged_base import PagedRunnerBase

    monkeypatch.setattr(PagedRunnerBase, "ring_chunk", 3)
    model = tiny_llama4("scout")
    runner = PagedLlama4Runner(model, max_new_tokens=24, num_draft_tokens=3, block_size=4)
    assert_runner_matches_forward(model, runner, VOCAB)
    assert runner._ring_layers == (0, 1, 2) and len(runner.caches) == 2
    ring = runner.caches[-1]
    assert ring.ring_blocks < ring.max_blocks_per_row


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_token_trees_cross_chunks(tree):
    """Token trees of a draft model, static and dynamic, whose nodes cross chunk boundaries (chunks of 5,
    accepted paths longer than a chunk): a node and its ancestors sit at the context's length + their depths,
    which the kernels place by the tree's bits; greedy equals model.generate (floor_scale 8192: the padded
    batch is generate's own), with a close draft and a far one."""
    target = tiny_llama4("scout", seed=9, floor_scale=8192)
    ids, mask = left_padded_prompts([4, 9], vocab=VOCAB, seed=8)
    kw = dict(do_sample=False, max_new_tokens=24, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, **kw)
    hists = []
    for noise in (0.03, 0.3):  # a close draft: paths of 4-8 tokens accepted (past a chunk within a tree); a far one
        out, stats = api.generate(target, ids, mask, runner="paged", assistant_model=make_draft(target, noise=noise),
                                  tree=tree, return_stats=True, **kw)
        specdec_fast.release_engines(target)
        assert torch.equal(out, expected), noise
        hists.append(stats.accepted_hist)
    assert sum(hists[0][5:]) > 0 and hists[1][0] > 0, f"accepted paths longer than a chunk, and rejections: {hists}"


def _logits_after(model, tokens, spoil=None):
    runner = PagedLlama4Runner(model, max_new_tokens=2, num_draft_tokens=1, block_size=4)
    if spoil is not None:
        spoil(runner)
    return runner.prefill(torch.tensor([tokens]), None)[0]


def test_controls_each_piece_is_needed():
    """Each spoiled piece moves the logits off the forward's: no chunks (full attention), no temperature,
    pairs read as halves (no reordering), no q/k norm, the routing weight on the output instead of the
    input."""
    model = tiny_llama4("scout")
    tokens = [5, 9, 3, 7, 11, 4, 8, 2, 9, 10, 33, 12, 6]
    expected = hf_logits(model, tokens)[-1]
    torch.testing.assert_close(_logits_after(model, tokens), expected, atol=1e-4, rtol=1e-4)

    def each_layer(name, value):
        return lambda runner: [setattr(layer, name, value) for layer in runner.layers]

    def output_weighed(runner):
        for layer in runner.layers:
            layer.moe.scale_input = False

    spoils = {"chunks": lambda r: setattr(r, "layer_chunks", ()), "temperature": each_layer("scaled_query", False),
              "pairs": each_layer("rope_order", None), "qk norm": each_layer("qk_norm", None),
              "input scaling": output_weighed}
    for name, spoil in spoils.items():
        assert not torch.allclose(_logits_after(model, tokens, spoil), expected, atol=1e-2, rtol=0), name


def test_refusals_name_the_reason():
    assert "num_experts_per_tok 2" in llama4_unsupported_reason(tiny_llama4("scout", num_experts_per_tok=2))
    model = tiny_llama4("scout")
    model.config.layer_types = ["chunked_attention", "sliding_attention", "chunked_attention", "full_attention"]
    assert "layer_types" in llama4_unsupported_reason(model)
    model = tiny_llama4("scout")
    model.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 500000.0, "factor": 2.0}
    model.model.rotary_emb.rope_type = "dynamic"
    assert choose_runner(model, None, 40) == "paged"  # within the positions of its first frequencies
    assert "changes its frequencies past 256" in llama4_unsupported_reason(model, 400)
    # past them neither runner (the hf runner refuses chunked layers): one error with both reasons
    with pytest.raises(UnsupportedModelError, match=r"chunked_attention.*and the paged runner cannot run it: rope_type"):
        choose_runner(model, None, 400)


@pytest.mark.parametrize("head", ["eagle3", "dflash"])
def test_draft_heads_read_its_hidden_states(head):
    """An EAGLE-3 head and a DFlash block drafter (random) over Llama 4: the target runner captures the
    hidden states they read; greedy equals model.generate past several chunks (floor_scale 8192: the
    padded batch is generate's own)."""
    from .heads import assert_head_drafts_greedy

    assert_head_drafts_greedy(tiny_llama4("maverick", seed=3, floor_scale=8192), head, VOCAB)


def test_generate_outputs_equal_generates_own():
    """return_dict_in_generate with scores, attentions and hidden states (eager attention): equal to
    model.generate's, the chunked layers' step attentions as wide as transformers' sliding cache of the
    chunk keeps, and the returned cache's layers (chunked: the last C - 1 keys) as long as its own."""
    target = tiny_llama4("scout", seed=3, floor_scale=8192)
    target.config._attn_implementation = "eager"
    ids, mask = left_padded_prompts([5, 8], vocab=VOCAB, seed=3)
    kw = dict(do_sample=False, max_new_tokens=10, pad_token_id=0, return_dict_in_generate=True, output_scores=True,
              output_attentions=True, output_hidden_states=True)
    expected = target.generate(ids, attention_mask=mask, **kw)
    got = api.generate(target, ids, mask, runner="paged", assistant_model=make_draft(target, noise=0.05), **kw)
    specdec_fast.release_engines(target)
    assert torch.equal(got.sequences, expected.sequences)
    for theirs, ours in zip(expected.scores, got.scores):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    for step_theirs, step_ours in zip(expected.attentions, got.attentions):
        for theirs, ours in zip(step_theirs, step_ours):
            torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    for step_theirs, step_ours in zip(expected.hidden_states, got.hidden_states):
        for theirs, ours in zip(step_theirs, step_ours):
            torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    cache = getattr(got, "cache", None) or got.past_key_values
    theirs_cache = getattr(expected, "cache", None) or expected.past_key_values
    assert [layer.keys.shape for layer in cache.layers] == [layer.keys.shape for layer in theirs_cache.layers]
    assert cache.layers[0].keys.shape[2] == CHUNK - 1


def test_a_published_checkpoint_loads_as_its_text_decoder(tmp_path):
    """Meta's Llama 4 checkpoints hold a Llama4Config (model_type llama4) around the text config, the decoder under
    language_model.: paged_runner_from_pretrained picks the runner by the text decoder's type and runs the
    Llama4ForCausalLM that AutoModelForCausalLM loads, with the forward's logits."""
    from specdec_fast.runners import paged_runner_from_pretrained

    from .models import llama4_multimodal_checkpoint

    model = tiny_llama4("maverick")
    llama4_multimodal_checkpoint(model, tmp_path)
    runner = paged_runner_from_pretrained(str(tmp_path), max_new_tokens=4, num_draft_tokens=1)
    assert type(runner) is PagedLlama4Runner and type(runner.model).__name__ == "Llama4ForCausalLM"
    tokens = [5, 9, 3, 7, 11, 4, 8, 2, 9]
    torch.testing.assert_close(runner.prefill(torch.tensor([tokens]), None)[0], hf_logits(model, tokens)[-1],
                               atol=1e-4, rtol=1e-4)


def test_static_graph_twin_gives_the_eager_tokens():
    """The CUDA-graph loop's CPU twin (static shapes, every buffer reused): the chunks, the float32 temperature and
    the input-scaled experts give the eager loop's tokens in each graph mode."""
    from .test_cuda_graphs_static import assert_static_twin_gives_eager_tokens

    assert_static_twin_gives_eager_tokens(tiny_llama4("scout", seed=3), VOCAB, max_new_tokens=14)
