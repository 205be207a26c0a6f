"""A negative (or NaN) temperature is rejected on every path into generate(), naming the
argument, also where greedy decoding would ignore it (transformers decodes greedily then and
says nothing: the caller meant something else)."""
import math

import pytest
from transformers import GenerationConfig

import specdec_fast
import specdec_fast.api as api

from .conftest import model_pair
from .models import left_padded_prompts

IDS, MASK = left_padded_prompts([4, 6], seed=11)


@pytest.fixture(scope="module")
def pair():
    return model_pair("llama")


@pytest.mark.parametrize("temperature", [-1.0, -1e-6, math.nan])
@pytest.mark.parametrize("do_sample", [True, False, None])
@pytest.mark.parametrize("drafter", ["draft", "prompt_lookup", "plain"])
def test_generate_rejects_a_negative_temperature(pair, temperature, do_sample, drafter):
    target, draft = pair
    extra = {"draft": dict(assistant_model=draft), "prompt_lookup": dict(prompt_lookup_num_tokens=3), "plain": {}}[drafter]
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        api.generate(target, IDS, MASK, max_new_tokens=2, do_sample=do_sample, temperature=temperature, **extra)


def test_a_negative_temperature_in_a_generation_config_is_rejected(pair):
    target, draft = pair
    config = GenerationConfig(max_new_tokens=2)
    config.temperature = -0.5  # set after construction: GenerationConfig's own checks run at init
    with pytest.raises(ValueError, match="temperature"):
        api.generate(target, IDS, MASK, assistant_model=draft, generation_config=config)


def test_patch_generate_rejects_a_negative_temperature(pair):
    target, draft = pair
    with specdec_fast.patch_generate(target) as model:
        with pytest.raises(ValueError, match="temperature"):
            model.generate(IDS, attention_mask=MASK, assistant_model=draft, max_new_tokens=2, temperature=-1.0)


def test_zero_temperature_greedy_still_runs(pair):
    target, draft = pair
    out = api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=2, temperature=0.0)
    assert out.shape == (2, IDS.shape[1] + 2)
