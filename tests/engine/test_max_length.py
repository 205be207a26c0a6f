"""max_length as transformers 5.24 defines it (specdec_fast/options/max_length.py), side by side with
model.generate: the same sequences (greedy), the same warnings, the same errors."""
import logging
import warnings

import pytest
import torch
from transformers import GenerationConfig

import specdec_fast.api as api

from .conftest import model_pair
from .models import left_padded_prompts

IDS, MASK = left_padded_prompts([4, 6], seed=5)  # width 6: max_length counts the left padding too


@pytest.fixture(scope="module")
def pair():
    return model_pair("llama")


def _both(target, draft, ids, mask, **kwargs):
    """(ours, transformers'): each the output tensor or the ValueError's message, with the warnings each gave."""
    results = []
    for call in (lambda: api.generate(target, ids, mask, assistant_model=draft, do_sample=False, **kwargs),
                 lambda: target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = call()
            except ValueError as exc:
                out = str(exc)
        results.append((out, sorted(str(w.message) for w in caught if w.category is UserWarning)))
    return results


CASES = [  # (keyword arguments, expected width of the output or the error's start)
    (dict(), 6 + 20),                                   # neither: 20 NEW tokens (transformers' default)
    (dict(max_length=10), 10),                          # the prompt's width counts, padding included
    (dict(max_length=7), 7),
    (dict(max_length=6), "Input length of input_ids is 6, but `max_length` is set to 6."),
    (dict(max_length=3), "Input length of input_ids is 6, but `max_length` is set to 3."),
    (dict(max_length=10, max_new_tokens=3), 9),         # max_new_tokens wins
    (dict(generation_config=GenerationConfig(max_length=9)), 9),
    (dict(generation_config=GenerationConfig(max_length=12), max_new_tokens=2), 8),
]


@pytest.mark.parametrize("kwargs, expected", CASES, ids=[repr(k) for k, _ in CASES])
def test_lengths_as_model_generate(pair, kwargs, expected):
    target, draft = pair
    (ours, our_warnings), (theirs, their_warnings) = _both(target, draft, IDS, MASK, **kwargs)
    if isinstance(expected, int):
        assert ours.shape == theirs.shape == (2, expected)
        assert torch.equal(ours, theirs)
    else:
        assert isinstance(ours, str) and ours == theirs and ours.startswith(expected)
    assert our_warnings == their_warnings  # the default-length UserWarning, or none


def test_the_default_length_warns_as_transformers_does(pair):
    target, draft = pair
    with pytest.warns(UserWarning, match=r"model-agnostic default `max_length` \(=26\)"):
        out = api.generate(target, IDS, MASK, assistant_model=draft)
    assert out.shape == (2, 26)


def test_max_length_in_the_model_generation_config(pair):
    target, draft = pair
    target.generation_config.max_length = 8
    try:
        for kwargs, width in ((dict(), 8), (dict(max_new_tokens=3), 9)):
            (ours, _), (theirs, _) = _both(target, draft, IDS, MASK, **kwargs)
            assert ours.shape == theirs.shape == (2, width) and torch.equal(ours, theirs)
    finally:
        target.generation_config.max_length = None


def test_both_given_logs_that_max_new_tokens_wins(pair, caplog):
    target, draft = pair
    with caplog.at_level(logging.WARNING, logger="specdec_fast"):
        out = api.generate(target, IDS, MASK, assistant_model=draft, max_length=30, max_new_tokens=2)
    assert out.shape == (2, 8)
    assert "Both `max_new_tokens` (=2) and `max_length`(=30) seem to have been set" in caplog.text


def test_the_default_length_stops_at_max_position_embeddings(pair):
    """Near the end of the positions (256 here) the default of 20 new tokens is cut to what fits, and
    a prompt that fills them raises, as in transformers; an explicit max_new_tokens is not cut."""
    target, draft = pair
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 128, (1, 250), generator=gen)
    (ours, _), (theirs, _) = _both(target, draft, ids, torch.ones_like(ids))
    assert ours.shape == theirs.shape == (1, 256) and torch.equal(ours, theirs)
    full = torch.randint(3, 128, (1, 256), generator=gen)
    (ours, _), (theirs, _) = _both(target, draft, full, torch.ones_like(full))
    assert ours == theirs == ("Input length of input_ids is 256, but `max_length` is set to 256. This can lead to "
                              "unexpected behavior. You should consider increasing `max_length` or, better yet, "
                              "setting `max_new_tokens`.")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        api.generate(target, ids, assistant_model=draft, max_new_tokens=10)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1, got 0"),
    (dict(max_length=0), "max_length must be an int >= 1, got 0"),
    (dict(max_length=2.5), "max_length must be an int >= 1, got 2.5"),
])
def test_bad_lengths(pair, kwargs, message):
    target, draft = pair
    with pytest.raises(ValueError, match=f"^{message}$"):
        api.generate(target, IDS, MASK, assistant_model=draft, **kwargs)
