"""Sliding-window layers on a ring cache (runners/paged_cache.py ring_blocks; runners/paged_base.py
ring_windows / ring_chunk): a row keeps R blocks for its windowed layers instead of its whole
budget, its table repeating them, and the prompt runs in chunks the ring is sized for. The default
chunk (1024 tokens) makes the ring larger than every row of the suite, so here it is lowered to 3
tokens: then the ring (2-3 blocks of 4) is smaller than the rows. Logits equal the model's
forward on every backend through prefill chunks, left padding, score calls and rollback; greedy
decoding equals model.generate far past the window (a draft model, trees, the static twin);
sampled, the static twin draws the eager tokens; the pool is smaller; a captured prefill joined
from its chunks equals transformers' hidden states. Controls: a ring one block short gives other
logits; a call that would write more than the ring keeps is refused."""
import pytest
import torch
import transformers as tf

import specdec_fast
from specdec_fast.runners import PagedLlamaRunner, paged_base
from specdec_fast.runners.paged_base import PagedRunnerBase
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device, on_device
from .models import left_padded_prompts, make_draft
from .runner_checks import assert_runner_matches_forward
from .test_sliding_window_models import COMMON

CONFIGS = {  # every layer slides (window 4); full and sliding layers mixed; a MoE MLP under the window; Gemma 3's
    # own runner (runners/paged_gemma.py)
    "mistral": lambda: tf.MistralConfig(sliding_window=4, **COMMON),
    "gemma3": lambda: tf.Gemma3TextConfig(sliding_window=4, head_dim=12, query_pre_attn_scalar=12,
                                          sliding_window_pattern=2, **COMMON),
    "ministral": lambda: tf.MinistralConfig(sliding_window=4, head_dim=12, **COMMON),
    "mixtral": lambda: tf.MixtralConfig(sliding_window=5, num_local_experts=4, num_experts_per_tok=2, **COMMON),
    # Gemma 4's own runner (runners/paged_gemma4.py): sliding and full layers of two head widths (a ring cache and a
    # full one for each), its last two layers reading the others' K/V, per-layer inputs
    "gemma4": lambda: tf.Gemma4TextConfig(sliding_window=4, head_dim=12, global_head_dim=16, num_kv_shared_layers=2,
                                          layer_types=["sliding_attention", "full_attention"] * 2,
                                          hidden_size_per_layer_input=8, vocab_size_per_layer_input=128,
                                          **dict(COMMON, num_hidden_layers=4)),
}
_MODELS = {}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(PagedRunnerBase, "ring_chunk", 3)
    specdec_fast.release_engines()
    yield
    specdec_fast.release_engines()


def _model(kind: str):
    if kind not in _MODELS:
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(CONFIGS[kind](), attn_implementation="sdpa").eval()
        model.generation_config.eos_token_id = None
        _MODELS[kind] = model
    return _MODELS[kind]


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_logits_equal_the_forward_on_a_ring(kind, backend, device):
    device = backend_device(backend, device)
    model = on_device(device, _model(kind))
    runner = paged_runner_class(model)(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert_runner_matches_forward(model, runner, COMMON["vocab_size"])
    ring = runner.caches[-1]
    assert runner._ring_layers and ring.ring_blocks < ring.max_blocks_per_row, "the test needs a ring"
    assert len(ring.blocks_of(1)) == ring.ring_blocks  # the 9-token row holds its ring, not its budget


def test_a_rows_table_repeats_its_ring_and_the_pool_shrinks():
    """A row's table repeats its R blocks; the pool of a long row is a fraction of the full one's."""
    model = _model("mistral")
    runner = PagedLlamaRunner(model, max_new_tokens=200, num_draft_tokens=3, block_size=4)
    ids, mask = left_padded_prompts([9, 5], vocab=COMMON["vocab_size"], seed=3)
    runner.prefill(ids, mask)
    ring = runner.caches[-1]
    table = ring.block_table[0].tolist()
    blocks = ring.blocks_of(0)
    assert len(runner.caches) == 1 and runner._ring_layers == (0, 1, 2)  # every Mistral layer slides
    assert table[:len(blocks) * 3] == blocks * 3 and len(blocks) == ring.ring_blocks == 2  # (4 + 4 - 1) / 4
    full = PagedLlamaRunner(model, max_new_tokens=200, num_draft_tokens=3, block_size=4)
    full.ring_windows = False
    full.prefill(ids, mask)
    assert runner.kv_bytes * 10 < full.kv_bytes


@pytest.mark.parametrize("drafting", ["draft", "tree", "static"])
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_greedy_equals_generate_far_past_the_window(kind, drafting):
    model = _model(kind)
    ids, mask = left_padded_prompts([6, 11, 2], vocab=COMMON["vocab_size"], seed=21)
    kw = dict(max_new_tokens=30, do_sample=False, pad_token_id=0)
    extra = {"draft": dict(num_assistant_tokens=3), "tree": dict(tree=3),
             "static": dict(num_assistant_tokens=2, cuda_graphs="static")}[drafting]
    engine = specdec_fast.SpeculativeEngine(model, make_draft(model, noise=0.2), block_size=4, max_batch_size=3,
                                            max_seq_len=48, num_assistant_tokens=3, max_draft_tokens=3)
    out, stats = engine.generate(ids, mask, return_stats=True, **kw, **extra)
    assert engine.target_runner._ring_layers and engine.draft_runner._ring_layers
    assert torch.equal(out, model.generate(ids, attention_mask=mask, **kw))
    assert stats.accepted_hist[0] > 0 and sum(stats.accepted_hist[1:]) > 0, "rejections and accepts both"


def test_sampled_static_twin_draws_the_eager_tokens():
    model = _model("ministral")
    ids, mask = left_padded_prompts([7, 3], vocab=COMMON["vocab_size"], seed=5)
    draft = make_draft(model, noise=0.2)
    kw = dict(do_sample=True, seed=11, max_new_tokens=24, pad_token_id=0)
    runs = [specdec_fast.SpeculativeEngine(model, draft, block_size=4, max_batch_size=2, max_seq_len=40,
                                           num_assistant_tokens=3, cuda_graphs=graphs).generate(ids, mask, **kw)
            for graphs in (False, "static")]
    assert torch.equal(runs[1], runs[0])


def test_a_chunked_prefill_captures_the_prompts_hidden_states():
    model = _model("ministral")
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    runner.capture_hidden_states((0, 2, 3))
    ids, mask = left_padded_prompts([9, 4], vocab=COMMON["vocab_size"], seed=8)
    runner.prefill(ids, mask)
    assert runner._ring_layers
    hidden = runner.take_prefill_hidden()
    with torch.no_grad():
        states = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    want = torch.cat([states[j] for j in (0, 2, 3)], -1)
    for b in range(2):
        real = mask[b].bool()
        torch.testing.assert_close(hidden[b, real], want[b, real], atol=1e-4, rtol=1e-4)


def test_control_a_ring_one_block_short_gives_other_logits(monkeypatch):
    sized = paged_base.ring_blocks_for
    monkeypatch.setattr(paged_base, "ring_blocks_for", lambda *args: sized(*args) - 1)
    monkeypatch.setattr(paged_base, "ring_span", lambda *args: 1 << 20)  # the refusal below, off
    model = _model("mistral")
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, COMMON["vocab_size"])


def test_a_call_writing_more_than_the_ring_keeps_is_refused():
    model = _model("mistral")
    runner = PagedLlamaRunner(model, max_new_tokens=40, num_draft_tokens=3, block_size=4)
    runner.allocate(2, 60)
    ids, mask = left_padded_prompts([5, 3], vocab=COMMON["vocab_size"], seed=1)
    with pytest.raises(ValueError, match="tentative tokens per call exceed what this runner's ring cache"):
        runner.prefill(ids, mask, budgets=[60, 60], num_draft_tokens=12)


def test_an_engine_sizes_its_pool_by_the_full_layers_and_says_so():
    """kv_sizes: per pooled token only the full layers; the rings a fixed amount; the engine's note names them."""
    model = _model("gemma3")  # sliding and full layers mixed
    runner = paged_runner_class(model)(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    per_token, fixed = runner.kv_sizes(2, 100)
    per_layer = 2 * COMMON["num_key_value_heads"] * 12 * 4  # K and V, 2 heads of 12, float32
    windowed = sum(w is not None for w in runner.layer_windows)
    assert 0 < windowed < 3 and per_token == (3 - windowed) * per_layer and fixed == windowed * per_layer * 2 * 2 * 4
    engine = specdec_fast.SpeculativeEngine(model, block_size=4, max_batch_size=2, max_seq_len=100)
    assert f"the target's {windowed} windowed layers keep 2 blocks a row" in engine.memory_note
    assert engine.target_runner.kv_bytes == 2 * 104 * per_token + fixed  # 2 rows of 104 tokens (+ K + 1), + the rings


@pytest.mark.parametrize("drafting", ["eagle3", "dflash"])
def test_a_head_reads_a_chunked_prefill_of_a_ring_target(drafting):
    """A draft head over a windowed target on rings: the head's context comes from the target's
    prefill, run in chunks and joined (EAGLE-3: hidden states 1-3; DFlash: its target layers); greedy
    still equals the target's greedy decoding (random heads: exactness, not acceptance)."""
    from .heads import random_dflash, random_head

    model = _model("mistral")
    head = random_head(model, 40, seed=3) if drafting == "eagle3" else random_dflash(model, block_size=4)
    ids, mask = left_padded_prompts([11, 6], vocab=COMMON["vocab_size"], seed=13)
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    engine = specdec_fast.SpeculativeEngine(model, draft_head=head, block_size=4, max_batch_size=2, max_seq_len=40)
    out = engine.generate(ids, mask, **kw)
    assert engine.target_runner._ring_layers
    assert torch.equal(out, model.generate(ids, attention_mask=mask, **kw))
