"""return_dict_in_generate without a cache passed (engine/user_cache.py generation_cache): the output
carries the cache transformers' generate builds and returns -- its class, its layers' classes, the KV
of every token but the last within fp32 rounding -- so code that reads it or passes it to the next
turn works as with model.generate. use_cache=False returns none, as generate does."""
import warnings

import pytest
import torch
import transformers as tf

import specdec_fast
import specdec_fast.api as api
from specdec_fast.engine import outputs as outputs_module
from specdec_fast.engine import user_cache as user_cache_module
from specdec_fast.runners.hf import cache_keyword

from .conftest import model_pair
from .models import left_padded_prompts, make_draft

KW = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=3, return_dict_in_generate=True)


def returned_cache(out):
    """The output's cache under the installed transformers' field name (``cache`` from 5.24)."""
    return out.cache if hasattr(out, "cache") else out.past_key_values


def same_cache(ours, theirs, atol=1e-5) -> list:
    """What differs between two caches (empty: the same): the cache's and each layer's class, and
    each layer's keys and values (shapes, then values within atol)."""
    diffs = [] if type(ours) is type(theirs) else [f"cache {type(ours).__name__} != {type(theirs).__name__}"]
    if len(ours.layers) != len(theirs.layers):
        return diffs + [f"{len(ours.layers)} layers != {len(theirs.layers)}"]
    for i, (mine, hf) in enumerate(zip(ours.layers, theirs.layers)):
        if type(mine) is not type(hf):
            diffs.append(f"layer {i}: {type(mine).__name__} != {type(hf).__name__}")
            continue
        for name in ("keys", "values"):
            a, b = getattr(mine, name), getattr(hf, name)
            if a.shape != b.shape or not torch.allclose(a, b, atol=atol):
                diffs.append(f"layer {i} {name}: {tuple(a.shape)} vs {tuple(b.shape)}")
    return diffs


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("states", [False, True], ids=["plain", "hidden_states"])
def test_the_cache_generate_builds_is_returned(kind, states):
    """With output_hidden_states the cache is the one those forwards filled (no forward more)."""
    target, draft = model_pair(kind)
    ids, mask = left_padded_prompts([6, 9, 4], seed=11)
    extra = dict(output_hidden_states=True) if states else {}
    theirs = target.generate(ids, attention_mask=mask, **KW, **extra)
    ours, stats = api.generate(target, ids, mask, assistant_model=draft, return_stats=True, **KW, **extra)
    assert torch.equal(ours.sequences, theirs.sequences) and stats.k > 0
    assert int(returned_cache(theirs).get_seq_length()) == ours.sequences.shape[1] - 1
    assert same_cache(returned_cache(ours), returned_cache(theirs)) == []


SLIDING = {
    "mistral": lambda: tf.MistralConfig(sliding_window=4, vocab_size=128, hidden_size=48, intermediate_size=96,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "gemma2": lambda: tf.Gemma2Config(sliding_window=4, head_dim=12, query_pre_attn_scalar=12, vocab_size=128,
                                      hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0),
}


@pytest.mark.parametrize("kind", list(SLIDING))
def test_sliding_layers_keep_what_generate_keeps(kind):
    """Prompts and generations past the window: transformers' sliding cache layers keep their last
    window - 1 keys; ours were fed the prompt and then the generated tokens in one forward each, and
    keep the same keys (Gemma 2: full and sliding layers mixed)."""
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(SLIDING[kind](), attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None
    ids, mask = left_padded_prompts([6, 9, 4], seed=25)
    theirs = model.generate(ids, attention_mask=mask, **KW)
    ours = specdec_fast.generate(model, ids, mask, assistant_model=make_draft(model, noise=0.3), **KW)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert any("Sliding" in type(layer).__name__ for layer in returned_cache(theirs).layers)
    assert same_cache(returned_cache(ours), returned_cache(theirs)) == []


def test_the_next_turn_builds_on_the_returned_cache():
    """A chat loop that passes the output's cache to the next call (transformers' generate, then ours)
    gets the tokens it gets from transformers' own cache."""
    target, draft = model_pair("llama")
    ids = torch.randint(4, 120, (1, 7), generator=torch.Generator().manual_seed(5))
    kw = dict(KW, eos_token_id=None)
    theirs = target.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    ours = specdec_fast.generate(target, ids, torch.ones_like(ids), assistant_model=draft, **kw)
    follow = torch.cat([ours.sequences, torch.tensor([[9, 10, 11]])], 1)
    after = dict(attention_mask=torch.ones_like(follow), max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = target.generate(follow, **{cache_keyword(target): returned_cache(theirs)}, **after)
    assert torch.equal(target.generate(follow, **{cache_keyword(target): returned_cache(ours)}, **after), expected)


def test_use_cache_false_returns_none_and_other_implementations_are_not_built():
    """use_cache=False: no cache, as generate. A cache_implementation that builds another class
    (static, ...) is not built here: the field stays None (README, "Outputs")."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9, 4], seed=11)
    assert returned_cache(target.generate(ids, attention_mask=mask, use_cache=False, **KW)) is None
    assert returned_cache(specdec_fast.generate(target, ids, mask, assistant_model=draft, use_cache=False, **KW)) is None
    ours = specdec_fast.generate(target, ids, mask, assistant_model=draft, cache_implementation="static", **KW)
    assert returned_cache(ours) is None


def test_rows_added_by_num_return_sequences_are_in_the_cache():
    """Sampling two sequences a prompt: the cache holds every returned row, each row's KV that of its
    own sequence (the same as a cache built by transformers' forward over the returned rows)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9], seed=11)
    kw = dict(KW, do_sample=True, num_return_sequences=2)
    ours = specdec_fast.generate(target, ids, mask, assistant_model=draft, seed=3, **kw)
    cache = returned_cache(ours)
    assert cache.layers[0].keys.shape[0] == 4 and int(cache.get_seq_length()) == ours.sequences.shape[1] - 1
    rebuilt = user_cache_module.generation_cache(target, ours.sequences, mask.repeat_interleave(2, 0))
    assert same_cache(cache, rebuilt, atol=0) == []


def test_control_a_cache_fed_every_token_is_caught(monkeypatch):
    """Control: a cache holding the last token too (one forward over every token) is not what
    generate returns, and the comparison says so."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9, 4], seed=11)
    theirs = target.generate(ids, attention_mask=mask, **KW)

    def every_token(model, sequences, prompt_mask):
        fed = torch.cat([sequences, sequences[:, -1:]], 1)
        return outputs_module.step_forwards(model, fed, prompt_mask, fed.shape[1] - prompt_mask.shape[1])[3]

    monkeypatch.setattr(user_cache_module, "generation_cache", every_token)
    ours = specdec_fast.generate(target, ids, mask, assistant_model=draft, **KW)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert same_cache(returned_cache(ours), returned_cache(theirs)) != []


@pytest.mark.parametrize("asked", ["output_scores", "output_logits", "output_hidden_states"])
def test_the_forwards_of_the_outputs_fill_the_cache(monkeypatch, asked):
    """scores / logits / hidden states come from generate's two forwards after the loop, and the cache
    those fill is the one returned: no forward of generation_cache's own (which raises here)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9, 4], seed=11)
    theirs = target.generate(ids, attention_mask=mask, **KW, **{asked: True})

    def not_called(*args):
        raise AssertionError("generation_cache ran its own forwards")

    monkeypatch.setattr(user_cache_module, "generation_cache", not_called)
    ours = specdec_fast.generate(target, ids, mask, assistant_model=draft, **KW, **{asked: True})
    assert torch.equal(ours.sequences, theirs.sequences)
    assert same_cache(returned_cache(ours), returned_cache(theirs)) == []


def test_a_patched_chat_loop_reusing_the_output_cache_equals_transformers():
    """A chat loop that knows nothing of speculation: each turn passes the previous output's cache back
    (transformers' name for it) with the whole conversation. Under patch_generate every turn speculates
    and gives transformers' sequences and cache."""
    target, draft = model_pair("llama")

    def chat(generate):
        generator = torch.Generator().manual_seed(3)
        conversation, cache, outputs = torch.randint(4, 120, (1, 7), generator=generator), None, []
        for _ in range(3):
            given = {} if cache is None else {cache_keyword(target): cache}
            out = generate(conversation, attention_mask=torch.ones_like(conversation), **given, **dict(KW, eos_token_id=None))
            outputs.append(out)
            cache = returned_cache(out)
            conversation = torch.cat([out.sequences, torch.randint(4, 120, (1, 4), generator=generator)], 1)
        return outputs

    theirs = chat(target.generate)
    with specdec_fast.patch_generate(target, assistant_model=draft) as patched, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ours = chat(patched.generate)
    assert not [w for w in seen if "runs on transformers' generate" in str(w.message)], "a turn fell back"
    for turn, (mine, hf) in enumerate(zip(ours, theirs)):
        assert torch.equal(mine.sequences, hf.sequences), turn
        assert same_cache(returned_cache(mine), returned_cache(hf)) == [], turn


def test_scores_hidden_states_and_the_cache_come_from_one_pair_of_forwards(monkeypatch):
    """Asked for scores, logits and hidden states at once, the output runs generate's two forwards
    once (outputs.step_forwards, one call) and all of them, and the cache, equal model.generate's."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9, 4], seed=11)
    asked = dict(output_scores=True, output_logits=True, output_hidden_states=True)
    theirs = target.generate(ids, attention_mask=mask, **KW, **asked)
    calls = []
    forwards = outputs_module.step_forwards
    monkeypatch.setattr(outputs_module, "step_forwards", lambda *a, **k: calls.append(k) or forwards(*a, **k))
    ours = specdec_fast.generate(target, ids, mask, assistant_model=draft, **KW, **asked)
    assert len(calls) == 1 and calls[0]["logits"] and calls[0]["hidden_states"]
    assert torch.equal(ours.sequences, theirs.sequences)
    for field in ("scores", "logits"):
        for mine, hf in zip(getattr(ours, field), getattr(theirs, field), strict=True):
            assert torch.allclose(mine, hf, atol=1e-5), field
    for mine, hf in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(mine, hf, strict=True))
    assert same_cache(returned_cache(ours), returned_cache(theirs)) == []
