"""generate(..., cache=c) / past_key_values=c (specdec_fast/engine/user_cache.py): a transformers
Cache the call continues. The tokens equal model.generate's with the same cache, and the cache is
left as model.generate leaves it (its length and its KV within fp32 rounding), so a chat loop's
next turn (ours or transformers') builds on it; return_dict_in_generate returns it, and step 0 of
its hidden states covers the tokens past the cache. Refusals name the problem; a patched model
hands the form we do not take to transformers."""
import copy

import pytest
import torch
from transformers import DynamicCache, StaticCache

import specdec_fast
import specdec_fast.api as api
from specdec_fast.engine import engine as engine_module
from specdec_fast.engine.inputs import UnsupportedInputError
from specdec_fast.options.rules import option_class
from specdec_fast.runners.hf import cache_keyword, output_cache

from .conftest import model_pair
from .models import left_padded_prompts

NEW = 8
DRAFTING = {"draft": lambda draft: dict(assistant_model=draft), "lookup": lambda draft: dict(prompt_lookup_num_tokens=3),
            "plain": lambda draft: {}}


def _hf(model, cache) -> dict:
    """The cache as transformers' own generate and forward take it: ``cache=`` from 5.24,
    ``past_key_values=`` before (5.17's forward swallows ``cache=`` in its kwargs, its generate
    refuses it). Our generate takes both names on every version (the tests of api.generate pass
    either)."""
    return {cache_keyword(model): cache}


def _prefix_cache(model, ids, mask, length: int, kind: str = "dynamic"):
    """A cache holding the KV of ids[:, :length], positions from the mask as generate makes them."""
    cache = (DynamicCache(config=model.config) if kind == "dynamic"
             else StaticCache(config=model.config, max_cache_len=ids.shape[1] + 4 * NEW))
    if length:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            model(input_ids=ids[:, :length], attention_mask=mask[:, :length], position_ids=positions[:, :length],
                  **_hf(model, cache))
    return cache


def _same_cache(ours, theirs, atol=1e-4) -> bool:
    """Same length, and every layer's keys and values equal within atol."""
    if int(ours.get_seq_length()) != int(theirs.get_seq_length()):
        return False
    length = int(theirs.get_seq_length())
    return all(torch.allclose(mine.keys[:, :, :length], hf.keys[:, :, :length], atol=atol)
               and torch.allclose(mine.values[:, :, :length], hf.values[:, :, :length], atol=atol)
               for mine, hf in zip(ours.layers, theirs.layers))


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("drafting", list(DRAFTING))
@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_tokens_and_the_cache_left_equal_generate(kind, drafting, cache_kind):
    target, draft = model_pair(kind)
    ids, mask = left_padded_prompts([6, 9, 4], seed=11)
    prefix = _prefix_cache(target, ids, mask, 5, cache_kind)
    theirs_cache, ours_cache = copy.deepcopy(prefix), copy.deepcopy(prefix)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=3)
    theirs = target.generate(ids, attention_mask=mask, **_hf(target, theirs_cache), **kw)
    ours, stats = api.generate(target, ids, mask, cache=ours_cache, return_stats=True, **kw,
                               **DRAFTING[drafting](draft))
    assert torch.equal(ours, theirs)
    assert int(theirs_cache.get_seq_length()) == ours.shape[1] - 1
    assert _same_cache(ours_cache, theirs_cache)
    if drafting != "plain":
        assert stats.k > 0  # it speculated


def test_a_chat_loop_over_one_cache_equals_generate_turn_by_turn():
    """transformers' docs' multi-turn loop: one DynamicCache for every turn (empty at the first),
    input_ids the whole conversation so far; each turn's tokens and the cache after it equal
    model.generate's. The last turn runs on transformers' generate over the cache our turns left."""
    target, draft = model_pair("llama")
    theirs_cache, ours_cache = DynamicCache(config=target.config), DynamicCache(config=target.config)
    generator = torch.Generator().manual_seed(5)
    conversation = torch.randint(4, 120, (1, 7), generator=generator)
    for turn in range(3):
        kw = dict(max_new_tokens=NEW + turn, do_sample=False, pad_token_id=0)
        mask = torch.ones_like(conversation)  # the tokenizer's (the replies may hold the pad id)
        theirs = target.generate(conversation, attention_mask=mask, **_hf(target, theirs_cache), **kw)
        ours = specdec_fast.generate(target, conversation, mask, cache=ours_cache, assistant_model=draft, **kw)
        assert torch.equal(ours, theirs), f"turn {turn}"
        assert _same_cache(ours_cache, theirs_cache), f"turn {turn}"
        conversation = torch.cat([theirs, torch.randint(4, 120, (1, 5), generator=generator)], 1)
    kw = dict(attention_mask=torch.ones_like(conversation), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    assert torch.equal(target.generate(conversation, **_hf(target, ours_cache), **kw),
                       target.generate(conversation, **_hf(target, theirs_cache), **kw))


def test_control_a_cache_left_as_it_came_is_caught(monkeypatch):
    """Control: without extend_user_cache the tokens still match (they never read the cache), and
    the cache check above fails: it is what proves the cache is left right."""
    monkeypatch.setattr(engine_module, "extend_user_cache", lambda *args, **kwargs: None)
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9], seed=12)
    theirs_cache, ours_cache = _prefix_cache(target, ids, mask, 4), _prefix_cache(target, ids, mask, 4)
    theirs = target.generate(ids, attention_mask=mask, **_hf(target, theirs_cache), max_new_tokens=NEW,
                             do_sample=False, pad_token_id=0)
    ours = api.generate(target, ids, mask, cache=ours_cache, assistant_model=draft, max_new_tokens=NEW,
                        do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)
    assert not _same_cache(ours_cache, theirs_cache)


def test_output_dict_returns_the_cache_and_hidden_states_past_it():
    """return_dict_in_generate: the output's cache is the caller's object; output_hidden_states'
    step 0 covers only the prompt tokens past the cache (generate's prefill), equal within fp32
    rounding; the scores are unchanged by the cache."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9, 4], seed=13)
    prefix = _prefix_cache(target, ids, mask, 5)
    theirs_cache, ours_cache = copy.deepcopy(prefix), copy.deepcopy(prefix)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
              output_hidden_states=True, output_scores=True)
    theirs = target.generate(ids, attention_mask=mask, **_hf(target, theirs_cache), **kw)
    ours = api.generate(target, ids, mask, past_key_values=ours_cache, assistant_model=draft, **kw)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert output_cache(ours) is ours_cache and output_cache(theirs) is theirs_cache
    assert ours.hidden_states[0][0].shape == theirs.hidden_states[0][0].shape == (3, 4, target.config.hidden_size)
    for mine, hf in zip(ours.hidden_states, theirs.hidden_states):
        for a, b in zip(mine, hf):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for mine, hf in zip(ours.scores, theirs.scores):
        torch.testing.assert_close(mine, hf, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_a_patched_chat_harness_speculates_and_the_unsupported_form_falls_back(name):
    """Through patch_generate bound to a draft: a call with the cache under either name speculates
    (stats) and equals model.generate; input_ids holding only the tokens past the cache (the mask
    as wide as cache + input) is not ours to take: the bound patch hands it to transformers with a
    warning, the cache under the name the installed generate takes (before 5.24 it raises on
    ``cache=``, a name our generate takes on every version)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([7], seed=14)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, **_hf(target, _prefix_cache(target, ids, mask, 3)), **kw)
    new_only = target.generate(ids[:, 3:], attention_mask=mask, **_hf(target, _prefix_cache(target, ids, mask, 3)),
                               **kw)
    with specdec_fast.patch_generate(target, assistant_model=draft) as model:
        out = model.generate(ids, attention_mask=mask, **{name: _prefix_cache(target, ids, mask, 3)}, **kw)
        assert torch.equal(out, expected) and model.specdec_last_stats.k > 0
        with pytest.warns(UserWarning, match="only the 4 tokens past the cache"):
            fallback = model.generate(ids[:, 3:], attention_mask=mask, **{name: _prefix_cache(target, ids, mask, 3)},
                                      **kw)
    assert torch.equal(fallback, new_only)


@pytest.mark.parametrize("case", ["tuple", "two_caches", "whole_prompt", "return_sequences", "rows", "new_only"])
def test_calls_we_refuse_name_the_problem(case):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9], seed=15)
    kw = dict(max_new_tokens=NEW, pad_token_id=0, assistant_model=draft)
    prefix = _prefix_cache(target, ids, mask, 4)
    calls = {
        "tuple": (ValueError, "tuple", dict(cache=((torch.zeros(1),),))),
        "two_caches": (ValueError, "pass the cache once", dict(cache=prefix, past_key_values=copy.deepcopy(prefix))),
        "whole_prompt": (ValueError, "at least one token", dict(cache=_prefix_cache(target, ids, mask, 9))),
        "return_sequences": (ValueError, "num_return_sequences=2", dict(cache=prefix, do_sample=True,
                                                                        num_return_sequences=2)),
        "rows": (ValueError, "holds 1 rows and input_ids 2", dict(cache=_prefix_cache(target, ids[:1], mask[:1], 4))),
        "new_only": (UnsupportedInputError, "past the cache", dict(cache=prefix, input_ids=ids[:, 4:])),
    }
    error, words, options = calls[case]
    call_ids = options.pop("input_ids", ids)
    before = int(prefix.get_seq_length())
    with pytest.raises(error, match=words):
        api.generate(target, call_ids, mask, **kw, **options)
    assert int(prefix.get_seq_length()) == before  # a refused call leaves the cache alone


def test_the_options_rule_takes_both_names_and_an_empty_cache_is_filled():
    assert option_class("cache") == option_class("past_key_values") == "handled"
    target, _ = model_pair("llama")
    ids, mask = left_padded_prompts([5], seed=16)
    cache = DynamicCache(config=target.config)  # the first turn of a chat loop
    out = api.generate(target, ids, mask, cache=cache, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert int(cache.get_seq_length()) == out.shape[1] - 1


def test_a_cache_holding_other_positions_is_not_read():
    """The known difference, pinned: a padded batch prefilled without position_ids holds its keys at
    positions generate would not use. transformers' tokens follow that cache; ours never read it and
    are those of generate without a cache (the README says so)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9, 4], seed=11)
    odd = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=ids[:, :5], attention_mask=mask[:, :5], **_hf(target, odd))  # positions 0..4 in every row
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    ours = api.generate(target, ids, mask, cache=copy.deepcopy(odd), assistant_model=draft, **kw)
    assert torch.equal(ours, target.generate(ids, attention_mask=mask, **kw))
    assert not torch.equal(ours, target.generate(ids, attention_mask=mask, **_hf(target, copy.deepcopy(odd)), **kw))


@pytest.mark.parametrize("cached", [0, 1, 5])
def test_eager_attention_leaves_the_pads_kv_as_generate_does(cached):
    """Eager attention spreads a left pad's fully masked query over every key its forward holds:
    the cache is extended as generate fills it (the prompt's prefill, then the generated tokens),
    so the KV at pad positions (row 2 has 5 pads) and step 0's hidden states equal generate's too.
    Found by fuzzing: one forward over both left the pads' keys 2.8 apart."""
    from .models import make_model

    target = make_model("llama", attn="eager")
    target.generation_config.eos_token_id = None
    ids, mask = left_padded_prompts([6, 9, 4], seed=11)
    prefix = _prefix_cache(target, ids, mask, cached)
    theirs_cache, ours_cache = copy.deepcopy(prefix), copy.deepcopy(prefix)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
              output_hidden_states=True)
    theirs = target.generate(ids, attention_mask=mask, **_hf(target, theirs_cache), **kw)
    ours = api.generate(target, ids, mask, cache=ours_cache, **kw)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert _same_cache(ours_cache, theirs_cache)
    for mine, hf in zip(ours.hidden_states[0], theirs.hidden_states[0]):
        torch.testing.assert_close(mine, hf, atol=1e-4, rtol=1e-4)


def test_a_static_cache_too_short_is_refused_and_left_alone():
    """transformers fails as it writes past a StaticCache's end (IndexError); ours finds it after
    the loop and leaves the cache as it came."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9], seed=12)
    theirs_cache = StaticCache(config=target.config, max_cache_len=12)
    with pytest.raises(IndexError):
        target.generate(ids, attention_mask=mask, **_hf(target, theirs_cache), max_new_tokens=NEW, do_sample=False,
                        pad_token_id=0)
    small = StaticCache(config=target.config, max_cache_len=ids.shape[1] + 2)
    with pytest.raises(ValueError, match="holds at most 11 tokens"):
        api.generate(target, ids, mask, cache=small, assistant_model=draft, max_new_tokens=NEW, do_sample=False,
                     pad_token_id=0)
    assert int(small.get_seq_length()) == 0


@pytest.mark.parametrize("where", ["keyword", "generation_config", "model_default", "hybrid"])
def test_a_cache_with_a_cache_implementation_raises_as_generate_does(where):
    """transformers refuses a cache with a cache_implementation from any source, but "hybrid"
    (older sliding-window checkpoints' default, which it unsets): the same here, same words."""
    target, _ = model_pair("llama")
    ids, mask = left_padded_prompts([6], seed=17)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    value = "hybrid" if where == "hybrid" else "static"
    saved = target.generation_config.cache_implementation
    options = {"keyword": dict(cache_implementation=value),
               "generation_config": dict(generation_config=copy.deepcopy(target.generation_config))}.get(where, {})
    if where == "generation_config":
        options["generation_config"].cache_implementation = value
    try:
        if where in ("model_default", "hybrid"):
            target.generation_config.cache_implementation = value
        results = []
        for run, name in ((target.generate, cache_keyword(target)),
                          (lambda *a, **k: api.generate(target, *a, **k), "cache")):
            try:
                results.append(run(ids, attention_mask=mask, **{name: _prefix_cache(target, ids, mask, 3)}, **kw,
                                   **options))
            except ValueError as e:
                results.append(str(e))
    finally:
        target.generation_config.cache_implementation = saved
        specdec_fast.release_engines(target)
    theirs, ours = results
    if where == "hybrid":
        assert torch.equal(ours, theirs)
    else:
        assert isinstance(theirs, str) and "Passing both `cache_implementation`" in theirs
        assert ours == theirs


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_the_outputs_come_from_the_forwards_that_extend_the_cache(monkeypatch, cache_kind):
    """With a cache, the scores, logits and hidden states come from the two forwards that extend it
    (user_cache.extend_user_cache -> outputs.step_forwards over the caller's cache, as generate's run over
    it): one call of step_forwards, two forwards of the target after the loop (before: a forward of the
    cached tokens of its own and the outputs' two, then the extension's two), all equal model.generate's."""
    from specdec_fast.engine import outputs as outputs_module
    from specdec_fast.engine import user_cache as user_cache_module

    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9, 4], seed=13)
    prefix = _prefix_cache(target, ids, mask, 5, cache_kind)
    theirs_cache, ours_cache = copy.deepcopy(prefix), copy.deepcopy(prefix)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
              output_hidden_states=True, output_scores=True, output_logits=True)
    theirs = target.generate(ids, attention_mask=mask, **_hf(target, theirs_cache), **kw)
    calls, forwards = [], outputs_module.step_forwards
    monkeypatch.setattr(user_cache_module, "step_forwards", lambda *a, **k: calls.append(k) or forwards(*a, **k))
    monkeypatch.setattr(outputs_module, "step_forwards", lambda *a, **k: pytest.fail("a second pair of forwards"))
    after_loop = []
    extend = user_cache_module.extend_user_cache

    def counted(*args, **kwargs):
        handle = target.register_forward_hook(lambda *_: after_loop.append(1))
        try:
            return extend(*args, **kwargs)
        finally:
            handle.remove()

    monkeypatch.setattr(engine_module, "extend_user_cache", counted)
    ours = api.generate(target, ids, mask, cache=ours_cache, assistant_model=draft, **kw)
    assert len(calls) == 1 and calls[0]["cache"] is ours_cache and calls[0]["logits"] and calls[0]["hidden_states"]
    assert len(after_loop) == 2
    assert torch.equal(ours.sequences, theirs.sequences) and _same_cache(ours_cache, theirs_cache)
    for field in ("scores", "logits"):
        for mine, hf in zip(getattr(ours, field), getattr(theirs, field), strict=True):
            torch.testing.assert_close(mine, hf, atol=1e-4, rtol=1e-4)
    for mine, hf in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        for a, b in zip(mine, hf, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_attentions_past_a_cache_equal_generate(cache_kind):
    """output_attentions (eager attention) with a cache: from the forwards that extend it, equal to
    transformers' in shape and value; over a StaticCache they span the cache's whole length (max_cache_len
    keys, zero past the tokens so far), as transformers' do."""
    from .models import make_model

    target = make_model("llama", attn="eager")
    target.generation_config.eos_token_id = None
    ids, mask = left_padded_prompts([6, 9, 4], seed=11)
    prefix = _prefix_cache(target, ids, mask, 5, cache_kind)
    theirs_cache, ours_cache = copy.deepcopy(prefix), copy.deepcopy(prefix)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_attentions=True)
    theirs = target.generate(ids, attention_mask=mask, **_hf(target, theirs_cache), **kw)
    ours = api.generate(target, ids, mask, cache=ours_cache, **kw)
    assert torch.equal(ours.sequences, theirs.sequences) and _same_cache(ours_cache, theirs_cache)
    assert len(ours.attentions) == len(theirs.attentions) == NEW
    for mine, hf in zip(ours.attentions, theirs.attentions, strict=True):
        for a, b in zip(mine, hf, strict=True):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    if cache_kind == "static":
        assert ours.attentions[1][0].shape[-1] == prefix.layers[0].max_cache_len


@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_sliding_models_outputs_over_a_cache_equal_generate(kind, cache_kind):
    """Sliding-window models (Mistral: every layer; Gemma 2: sliding and full mixed), eager attention, past
    their window, with a cache: the attentions, hidden states and scores equal model.generate's, shapes
    included. A static cache's sliding layers roll their slots (transformers' StaticSlidingWindowLayer: each
    step attends its `window` slots), which one forward of the generated tokens cannot be cut into: those
    take one forward a token, as generate's (outputs.attentions_over). Before: Gemma 2's hidden states over a
    StaticCache differed from generate's (the output's own forwards, not over the caller's cache)."""
    import transformers as tf

    from .test_returned_cache import SLIDING

    config = SLIDING[kind]()
    torch.manual_seed(0)
    target = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    target.generation_config.eos_token_id = None
    ids, mask = left_padded_prompts([6, 9, 4], seed=11, vocab=128)
    prefix = (DynamicCache(config=target.config) if cache_kind == "dynamic"
              else StaticCache(config=target.config, max_cache_len=40))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        target(input_ids=ids[:, :3], attention_mask=mask[:, :3], position_ids=positions[:, :3], **_hf(target, prefix))
    theirs_cache, ours_cache = copy.deepcopy(prefix), copy.deepcopy(prefix)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_attentions=True,
              output_hidden_states=True, output_scores=True)
    theirs = target.generate(ids, attention_mask=mask, **_hf(target, theirs_cache), **kw)
    ours = api.generate(target, ids, mask, cache=ours_cache, **kw)
    assert torch.equal(ours.sequences, theirs.sequences)
    for field in ("attentions", "hidden_states"):
        for mine, hf in zip(getattr(ours, field), getattr(theirs, field), strict=True):
            for a, b in zip(mine, hf, strict=True):
                assert a.shape == b.shape, field
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for mine, hf in zip(ours.scores, theirs.scores, strict=True):
        torch.testing.assert_close(mine, hf, atol=1e-4, rtol=1e-4)
