"""Greedy speculative decoding equals model.generate(do_sample=False) token for token."""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.drafters import ModelDrafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.runners import HFRunner

from .conftest import model_pair
from .models import eos_inside_a_block, left_padded_prompts

KINDS = ["llama", "qwen2", "gpt2"]
PROMPTS = {1: [7], 3: [5, 11, 2]}
MAX_NEW = 24
_REFERENCE = {}


def reference(kind, batch):
    if (kind, batch) not in _REFERENCE:
        target, _ = model_pair(kind)
        ids, mask = left_padded_prompts(PROMPTS[batch], seed=batch)
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
        _REFERENCE[(kind, batch)] = (ids, mask, out)
    return _REFERENCE[(kind, batch)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_draft_model_greedy_equals_generate(kind, batch, k):
    target, draft = model_pair(kind)
    ids, mask, expected = reference(kind, batch)
    out, stats = api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=k, do_sample=False,
                              max_new_tokens=MAX_NEW, pad_token_id=0, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.alpha > 0.2, "the aligned draft should be accepted often (else the test proves little)"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", [1, 3])
def test_prompt_lookup_and_plain_greedy_equal_generate(kind, batch):
    target, _ = model_pair(kind)
    ids, mask, expected = reference(kind, batch)
    for k in (2, 5):
        out = api.generate(target, ids, mask, prompt_lookup_num_tokens=k, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
        assert torch.equal(out, expected), k
    out = api.generate(target, ids, mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
    assert torch.equal(out, expected)


def test_prompt_lookup_repetitive_prompt_accepts_long_blocks():
    target, _ = model_pair("llama")
    # Greedy decoding of a random model falls into loops: prompt lookup then copies whole blocks.
    ids, mask = left_padded_prompts([6], seed=3)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=60, pad_token_id=0)
    out, stats = api.generate(target, ids, mask, prompt_lookup_num_tokens=4, do_sample=False, max_new_tokens=60,
                              pad_token_id=0, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.iterations < 59


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_eos_inside_an_accepted_block(kind):
    """Draft = target: every draft is accepted, so EOS lands inside a K=6 block; rows end exactly there."""
    target, _ = model_pair(kind)
    ids, mask, plain = reference(kind, 3)
    width = ids.shape[1]
    end, eos = eos_inside_a_block(plain, width, block=7)  # K = 6
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0, eos_token_id=eos)
    out, stats = api.generate(target, ids, mask, assistant_model=target, num_assistant_tokens=6, do_sample=False,
                              max_new_tokens=MAX_NEW, pad_token_id=0, eos_token_id=eos, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.alpha == 1.0
    assert (out[1, width + end + 1 :] == 0).all() and int(out[1, width + end]) == eos


def test_model_eos_from_generation_config():
    target, draft = model_pair("qwen2")
    ids, mask, plain = reference("qwen2", 3)
    eos = int(plain[0, ids.shape[1] + 2])
    target.generation_config.eos_token_id = eos
    try:
        expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
        out = api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=3, max_new_tokens=MAX_NEW, pad_token_id=0)
    finally:
        target.generation_config.eos_token_id = None
    assert torch.equal(out, expected)


@pytest.mark.parametrize("attn", ["eager", "2d"])
def test_mask_kinds_and_compaction(attn):
    """Eager (additive 4-D mask) and transformers' own 2-D mask path; compaction after every poll."""
    from .models import make_model

    kind = "llama"
    target = make_model(kind, attn="eager" if attn == "eager" else "sdpa")
    draft = model_pair(kind)[1]
    ids, mask = left_padded_prompts([5, 11, 2], seed=3)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0, eos_token_id=None)
    runners = [HFRunner(target, compact_slack=0), HFRunner(draft, compact_slack=0)]
    if attn == "2d":
        for r in runners:
            r.mask_kind = "2d"
    params = make_sampling_tensors(3, "cpu", temperature=0.0, seed=0)
    decoder = SpeculativeDecoder(runners[0], ModelDrafter(runners[1]), k=4, params=params, max_new_tokens=40, pad_token_id=0)
    out = decoder.generate(ids, mask)
    assert torch.equal(out, expected)
    generated = ids.shape[1] + 40 + 1
    # K+1 = 5 slots per iteration since the last compaction, which used a poll at most R - 1 iterations old.
    assert runners[0].cache_len <= generated + 5 * decoder.run_ahead, "compaction keeps the cache near the real length"


def test_the_hf_runner_names_the_cache_as_the_forward_does():
    """transformers 5.24 renamed the forward's past_key_values to cache (the old name warns on every
    call and goes in 5.40): HFRunner passes the name the model's forward takes, so a call through
    it raises no FutureWarning, and an older forward still gets past_key_values."""
    import warnings

    from specdec_fast.runners.hf import cache_keyword, output_cache

    class Older:
        def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None):
            pass

    class Newer:
        def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=None):
            pass

    assert (cache_keyword(Older()), cache_keyword(Newer())) == ("past_key_values", "cache")
    target, draft = model_pair("llama")
    ids, mask, expected = reference("llama", 3)
    runners = [HFRunner(target), HFRunner(draft)]
    params = make_sampling_tensors(3, "cpu", temperature=0.0, seed=0)
    decoder = SpeculativeDecoder(runners[0], ModelDrafter(runners[1]), k=3, params=params, max_new_tokens=MAX_NEW,
                                 pad_token_id=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = output_cache(target(input_ids=torch.tensor([[3, 4, 5]]), use_cache=True))  # the cache a forward returns
        out = decoder.generate(ids, mask)
    assert returned is not None and returned.get_seq_length() == 3
    assert torch.equal(out, expected)
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]
