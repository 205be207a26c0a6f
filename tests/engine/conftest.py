"""Engine tests: tiny random models on CPU. One intra-op thread: these tensors are tiny and the
CI box has 2 shared cores; with the default thread count a 48-wide linear took ~6 ms instead
of ~50 us here (oversubscription)."""
import functools
import itertools

import pytest
import torch

from specdec_fast.engine.schedule import AdaptiveK

from .models import make_draft, make_model


def assert_handed_to_transformers(model, error, match: str, bound: dict, input_ids, **kwargs) -> None:
    """specdec_fast.generate refuses the call with ``error`` (matching ``match``); a patch_generate
    bound to ``bound`` (its drafting) hands the same call to transformers' generate with one warning
    naming the refusal, and returns model.generate's tokens."""
    import specdec_fast

    with pytest.raises(error, match=match):
        specdec_fast.generate(model, input_ids, **bound, **kwargs)
    expected = model.generate(input_ids, **kwargs)
    with specdec_fast.patch_generate(model, **bound) as patched:
        with pytest.warns(UserWarning, match=f"{match}.*runs on transformers' generate"):
            assert torch.equal(patched.generate(input_ids, **kwargs), expected)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_CACHE = {}


def model_pair(kind: str):
    """(target, draft) for a model family, built once per session; target has no default EOS."""
    if kind not in _CACHE:
        target = make_model(kind)
        target.generation_config.eos_token_id = None
        _CACHE[kind] = (target, make_draft(target, noise=0.1))
    return _CACHE[kind]


@functools.lru_cache(maxsize=1)
def _generate_converts_a_watermark_dict() -> bool:
    """Whether the installed GenerationConfig.update turns a watermarking_config dict into a
    WatermarkingConfig (transformers 5.16+); before, it set the dict and validate() raised."""
    from transformers import GenerationConfig

    config = GenerationConfig()
    try:
        config.update(watermarking_config={"bias": 2.0})
    except AttributeError:  # 'dict' object has no attribute 'validate'
        return False
    return not isinstance(config.watermarking_config, dict)


def as_generate_takes(options: dict) -> dict:
    """``options`` for transformers' own model.generate. A watermarking_config dict, which ours
    takes on every transformers (as GenerationConfig(watermarking_config=dict) converts it), goes
    as the WatermarkingConfig it stands for where the installed generate does not convert it
    (before 5.16: AttributeError: 'dict' object has no attribute 'validate')."""
    value = options.get("watermarking_config")
    if not isinstance(value, dict) or _generate_converts_a_watermark_dict():
        return options
    from transformers.generation import WatermarkingConfig

    return {**options, "watermarking_config": WatermarkingConfig.from_dict(value)}


@pytest.fixture
def chaos(monkeypatch):
    """Replaces the adaptive schedule's choice (engine/schedule.py AdaptiveK) by a fixed cycle of Ks,
    whatever was measured: chaos(sequence) installs it and returns the list of Ks it chose. Chen et
    al.'s Theorem 1 holds for any K fixed before the drafts are made, so every sequence must keep
    the output exact (test_adaptive_k.py, test_block_drafters.py, test_dflash*.py)."""
    chosen = []

    def install(sequence):
        cycle = itertools.cycle(sequence)

        def choose(self, remaining=None):
            k = self.pinned if self.pinned is not None else next(cycle)
            self.k = k
            self.chosen[k] += 1
            self.drafted_steps += k
            chosen.append(k)
            return k
        monkeypatch.setattr(AdaptiveK, "choose", choose)
        return chosen
    return install
