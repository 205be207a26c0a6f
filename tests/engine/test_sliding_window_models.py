"""Sliding-window models on both runners: Mistral and Phi-3 (every layer slides), Qwen2 / Qwen3 with
use_sliding_window, Ministral and Gemma 2 / 3 (layer_types: full and sliding layers mixed), with prompts and generations
far past the window, left padding and drafts rejected: the tokens are model.generate's. runner='hf'
(specdec_fast/runners/hf.py, module docstring) builds the window into its mask (transformers'
per-layer-type dict), with holes and compaction; before that, every such call raised a shape error
(the sliding cache layer had dropped slots the mask listed). runner='paged' (the default since
2026-11-30) passes each layer's window to the paged attention kernels. Control: a window two
tokens wider gives other tokens."""
import pytest
import torch
import transformers as tf

import specdec_fast
from specdec_fast.runners import hf as hf_runner

from .models import left_padded_prompts, make_draft

COMMON = dict(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
CONFIGS = {
    "mistral": lambda: tf.MistralConfig(sliding_window=4, **COMMON),
    "qwen2": lambda: tf.Qwen2Config(use_sliding_window=True, sliding_window=5, max_window_layers=1, **COMMON),
    "gemma2": lambda: tf.Gemma2Config(sliding_window=4, head_dim=12, query_pre_attn_scalar=12, **COMMON),
    "gemma3": lambda: tf.Gemma3TextConfig(sliding_window=4, head_dim=12, query_pre_attn_scalar=12,
                                          sliding_window_pattern=2, **COMMON),
    "phi3": lambda: tf.Phi3Config(sliding_window=5, **COMMON),  # every layer, no layer_types (Phi-3-mini-4k's kind)
    "qwen3": lambda: tf.Qwen3Config(use_sliding_window=True, sliding_window=5, max_window_layers=1, head_dim=12,
                                    **COMMON),
    "ministral": lambda: tf.MinistralConfig(sliding_window=4, head_dim=12, **COMMON),  # its window by layer_types
}
CASES = [("mistral", "sdpa"), ("mistral", "eager"), ("qwen2", "sdpa"), ("gemma2", "eager"), ("gemma3", "sdpa"),
         ("phi3", "sdpa"), ("qwen3", "sdpa"), ("ministral", "sdpa")]
_MODELS = {}


def _pair(kind: str, attn: str):
    if (kind, attn) not in _MODELS:
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(CONFIGS[kind](), attn_implementation=attn).eval()
        model.generation_config.eos_token_id = None
        _MODELS[kind, attn] = (model, make_draft(model, noise=0.3))
    return _MODELS[kind, attn]


@pytest.mark.parametrize("runner", ["hf", "paged"])
@pytest.mark.parametrize("drafting", ["draft", "lookup", "plain"])
@pytest.mark.parametrize("kind, attn", CASES, ids=[f"{k}-{a}" for k, a in CASES])
def test_greedy_tokens_equal_generate_past_the_window(kind, attn, drafting, runner):
    model, draft = _pair(kind, attn)
    ids, mask = left_padded_prompts([6, 9, 4], seed=21)
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0, eos_token_id=3)
    extra = {"draft": dict(assistant_model=draft), "lookup": dict(prompt_lookup_num_tokens=3), "plain": {}}[drafting]
    out, stats = specdec_fast.generate(model, ids, mask, return_stats=True, runner=runner, **kw, **extra)
    specdec_fast.release_engines(model)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, **kw))
    if drafting == "draft":
        assert stats.accepted_hist[0] > 0, "some drafts were rejected (holes in the runner's cache)"


def test_control_a_wider_window_gives_other_tokens(monkeypatch):
    layout = hf_runner.sliding_layout
    monkeypatch.setattr(hf_runner, "sliding_layout", lambda config, *model_class: (layout(config, *model_class)[0] + 2, layout(config, *model_class)[1]))
    model, draft = _pair("mistral", "sdpa")
    ids, mask = left_padded_prompts([6, 9, 4], seed=21)
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
    specdec_fast.release_engines()  # runners built under the patched layout
    try:
        out = specdec_fast.generate(model, ids, mask, assistant_model=draft, runner="hf", **kw)
    finally:
        specdec_fast.release_engines()
    assert not torch.equal(out, model.generate(ids, attention_mask=mask, **kw))


def test_layouts_and_the_implementations_that_build_their_own_window():
    assert hf_runner.sliding_layout(CONFIGS["mistral"]()) == (4, False)
    assert hf_runner.sliding_layout(CONFIGS["qwen2"]()) == (5, True)
    assert hf_runner.sliding_layout(tf.Qwen2Config(**COMMON)) == (None, False)  # use_sliding_window off
    assert hf_runner.sliding_layout(tf.LlamaConfig(**COMMON)) == (None, False)
    # transformers 4.x kept Qwen2's sliding_window with use_sliding_window False and no layer_types
    old_qwen2 = type("Config", (), dict(sliding_window=4096, use_sliding_window=False, layer_types=None))()
    assert hf_runner.sliding_layout(old_qwen2) == (None, False)
    # Layers that are not attention keep what a rejected draft fed them: refused, saying so
    for kinds in (["full_attention", "linear_attention"], ["chunked_attention", "full_attention"]):
        mixed = type("Config", (), dict(sliding_window=None, layer_types=kinds))()
        with pytest.raises(ValueError, match="only attention layers can skip"):
            hf_runner.sliding_layout(mixed)
    model, _ = _pair("mistral", "sdpa")
    config = model.config
    saved = config._attn_implementation
    config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="sliding-window model with attn_implementation='flash_attention_2'"):
            hf_runner.HFRunner(model)
    finally:
        config._attn_implementation = saved


@pytest.mark.parametrize("kind, attn", [("mistral", "sdpa"), ("gemma3", "sdpa")])
def test_compaction_keeps_the_window(kind, attn):
    """compact() right-aligns the slots (holes out): their positions move with them, so the window
    still reads the row's positions. A slack of 2 compacts at almost every poll."""
    model, draft = _pair(kind, attn)
    engine = specdec_fast.SpeculativeEngine(model, draft, runner="hf")
    for runner in (engine.target_runner, engine.draft_runner):
        runner.compact_slack = 2
    ids, mask = left_padded_prompts([6, 9, 4], seed=22)
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0, num_assistant_tokens=4)
    out, stats = engine.generate(ids, mask, return_stats=True, **kw)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0))
    appended = ids.shape[1] + stats.iterations * 5  # every score call appends K + 1 slots
    assert engine.target_runner.cache_len < appended - 8, "compaction ran"


def _linear_attention_model():
    """A tiny Qwen3-Next: a linear-attention (recurrent) layer, then a full-attention one."""
    config = tf.Qwen3NextConfig(
        vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=12,
        linear_value_head_dim=12, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"], max_position_embeddings=256)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    return model


LOOPING = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6]])  # prompt lookup drafts (and misses) on it


def test_a_model_with_linear_attention_is_refused_and_a_patch_falls_back(monkeypatch):
    """The hf runner refuses a model whose layers keep what a rejected draft fed them; a bound
    patch hands its calls to transformers' generate with a warning, as it does an unsupported option.
    Two rules say so for Qwen3-Next: transformers' stateful flag (runners/hf_support.py), and its
    layer types (for the layers that keep state without the flag: conv, chunked attention). By default
    the call takes Qwen3-Next's paged runner instead, which rolls its recurrent states back
    (runners/paged_qwen3_next.py): model.generate's tokens, no refusal."""
    model = _linear_attention_model()
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    with pytest.raises(hf_runner.UnsupportedModelError, match="keeps a recurrent state"):
        specdec_fast.generate(model, LOOPING, prompt_lookup_num_tokens=3, runner="hf", **kw)
    expected = model.generate(LOOPING, **kw)
    with specdec_fast.patch_generate(model, prompt_lookup_num_tokens=3, runner="hf") as patched:
        with pytest.warns(UserWarning, match="keeps a recurrent state"):
            out = patched.generate(LOOPING, **kw)
    assert torch.equal(out, expected)
    assert torch.equal(specdec_fast.generate(model, LOOPING, prompt_lookup_num_tokens=3, **kw), expected)  # paged
    monkeypatch.setattr(hf_runner, "hf_unsupported_reason", lambda model: None)  # the layer-type rule alone
    with pytest.raises(hf_runner.UnsupportedModelError, match="only attention layers can skip"):
        specdec_fast.generate(model, LOOPING, prompt_lookup_num_tokens=3, runner="hf", **kw)


def test_control_without_the_refusal_the_tokens_differ(monkeypatch):
    """Why the refusal: the same call with the check taken out decodes other tokens than
    model.generate (the rejected drafts stayed in the recurrent layer's state). Two prompts: in
    transformers 5.4-5.14 a forward of several tokens over Qwen3-Next's cache restarts the
    recurrent state instead (initial_state=None; 5.15 continues it), a smaller error on this tiny
    model, under which LOOPING's greedy tokens stay generate's; the second prompt's differ on 5.4,
    5.17 and 5.24 (LOOPING's on 5.17 and 5.24)."""
    monkeypatch.setattr(hf_runner, "sliding_layout", lambda config, *model_class: (None, False))
    monkeypatch.setattr(hf_runner, "hf_unsupported_reason", lambda model: None)
    model = _linear_attention_model()
    # the cache its forward builds for it (the runner's own, config-less, has no recurrent state):
    # DynamicCache(config=...) from transformers 5.5, Qwen3NextDynamicCache(config) in 5.4
    with torch.no_grad():
        cache_class = type(hf_runner.output_cache(model(LOOPING[:, :1], use_cache=True)))
    monkeypatch.setattr(hf_runner, "_dynamic_cache_class", lambda: lambda: cache_class(config=model.config))
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    prompts = (LOOPING, torch.tensor([[40, 41, 42, 43, 44, 40, 41, 42, 43, 44, 40]]))
    assert any(not torch.equal(specdec_fast.generate(model, ids, prompt_lookup_num_tokens=3, runner="hf", **kw),
                               model.generate(ids, **kw)) for ids in prompts)


@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_step_attentions_of_sliding_layers_equal_generate(kind):
    """output_attentions: a sliding layer's step s attends the last min(window, P + s) keys in
    transformers' cache (it keeps window - 1); ours come from one forward over the steps and are
    cut the same way. Prompts past the window, left padded (found by the options fuzzing round:
    [.., P + s] keys here against transformers' [.., min(window, P + s)])."""
    model, _ = _pair(kind, "eager")
    ids, mask = left_padded_prompts([6, 9, 4], seed=25)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_attentions=True,
              output_hidden_states=True)
    ours = specdec_fast.generate(model, ids, mask, prompt_lookup_num_tokens=3, **kw)
    theirs = model.generate(ids, attention_mask=mask, **kw)
    assert torch.equal(ours.sequences, theirs.sequences)
    for field in ("attentions", "hidden_states"):
        for step_ours, step_theirs in zip(getattr(ours, field), getattr(theirs, field), strict=True):
            for a, b in zip(step_ours, step_theirs, strict=True):
                assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5), (field, a.shape, b.shape)


@pytest.mark.parametrize("tree", ["branching", "default"])
def test_token_trees_past_a_window_equal_generate(tree):
    """Tree drafting on the paged runner past a window: the kernels place each node at prefix +
    its depth (its ancestor bits), which must be the runner's own positions (the target's one-pass
    scoring, and the draft's level calls, whose trees start below the root), greedy equal to
    model.generate; a window below a tree's node count is refused by name."""
    from specdec_fast.drafters.token_tree import TokenTree

    config = tf.MistralConfig(**dict(COMMON, num_hidden_layers=2), sliding_window=24)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    model.generation_config.eos_token_id = None
    draft = make_draft(model, noise=0.3)
    shape = TokenTree.from_branching([2, 2]) if tree == "branching" else TokenTree.default(16)
    ids, mask = left_padded_prompts([6, 9, 4], seed=21)
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
    out, stats = specdec_fast.generate(model, ids, mask, assistant_model=draft, tree=shape, runner="paged",
                                       return_stats=True, **kw)
    specdec_fast.release_engines(model)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, **kw))
    assert stats.accepted_hist[0] > 0 and sum(stats.accepted_hist[2:]) > 0, "rejections and accepted chains both"
    narrow = tf.AutoModelForCausalLM.from_config(tf.MistralConfig(**COMMON, sliding_window=4)).eval()
    with pytest.raises(ValueError, match="tree scoring of 7 tokens with a sliding window of 4"):
        specdec_fast.generate(narrow, ids, mask, assistant_model=make_draft(narrow), runner="paged",
                              tree=TokenTree.from_branching([2, 2]), **kw)
    specdec_fast.release_engines(narrow)


def test_control_tree_nodes_placed_by_index_give_other_tokens(monkeypatch):
    """The test above catches a kernel that slides a tree node's window from prefix + its index
    (a chain's rule) instead of prefix + its depth: the torch reference, so patched, decodes other
    tokens."""
    from specdec_fast.drafters.token_tree import TokenTree
    from specdec_fast.kernels.attention import reference

    monkeypatch.setattr(reference, "tree_depths", lambda bits: torch.arange(bits.shape[-1]).expand_as(bits))
    config = tf.MistralConfig(**dict(COMMON, num_hidden_layers=2), sliding_window=24)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    model.generation_config.eos_token_id = None
    ids, mask = left_padded_prompts([6, 9, 4], seed=21)
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
    out = specdec_fast.generate(model, ids, mask, assistant_model=make_draft(model, noise=0.3), runner="paged",
                                backend="torch", tree=TokenTree.default(16), **kw)
    specdec_fast.release_engines(model)
    assert not torch.equal(out, model.generate(ids, attention_mask=mask, **kw))
