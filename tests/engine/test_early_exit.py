"""generate(assistant_early_exit=N) (drafters/early_exit.py): the draft is the target's first N
layers with its final norm and LM head, sharing the target's modules; its logits are transformers'
own early exit bit for bit; greedy output equals model.generate (batches, both runners, the
patch); sampled tokens follow the target's distribution (chi-square); bad values raise naming the
option."""
import gc

import pytest
import torch

import specdec_fast
import specdec_fast.api as api
from specdec_fast.drafters import early_exit
from specdec_fast.drafters.early_exit import early_exit_model
from specdec_fast.runners import PagedLlamaRunner

from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from .conftest import assert_handed_to_transformers
from .models import left_padded_prompts, make_model

NEW = 12


@pytest.fixture(scope="module")
def target():
    model = make_model("llama", layers=3, seed=21)
    model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_draft_is_transformers_early_exit_on_the_target_s_own_modules(kind):
    """The draft's logits equal the target's forward with config.num_hidden_layers = N (what
    transformers' EarlyExitCandidateGenerator runs) and differ from the full target's; every
    tensor of the draft is one of the target's (no copy); one draft per (target, N)."""
    model = make_model(kind, layers=3, seed=22)
    ids = torch.tensor([[3, 9, 27, 81, 5, 15]])
    with torch.no_grad():
        full = model(ids).logits
        for n in (1, 2):
            draft = early_exit_model(model, n)
            assert draft is early_exit_model(model, n) and draft.config.num_hidden_layers == n
            model.model.config.num_hidden_layers = n
            try:
                theirs = model(ids).logits
            finally:
                model.model.config.num_hidden_layers = 3
            ours = draft(ids).logits
            assert torch.equal(ours, theirs) and not torch.allclose(ours, full)
            target_tensors = {t.data_ptr() for t in (*model.parameters(), *model.buffers())}
            assert all(t.data_ptr() in target_tensors for t in (*draft.parameters(), *draft.buffers()))
    assert early_exit_model(model, 1) is not early_exit_model(model, 2)


def test_a_paged_runner_of_the_draft_reads_the_target_s_fused_weights(target):
    """Fused q/k/v and gate/up (the CUDA default): the draft's runner takes views of the storage
    the target's runner fused, so the early-exit draft costs no weight memory."""
    model = make_model("llama", layers=3, seed=23)
    target_runner = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=2, fuse_projections=True)
    draft_runner = PagedLlamaRunner(early_exit_model(model, 2), max_new_tokens=4, num_draft_tokens=2,
                                    fuse_projections=True)
    assert len(draft_runner.layers) == 2
    for mine, theirs in zip(draft_runner.layers, target_runner.layers):
        assert mine.w_qkv.data_ptr() == theirs.w_qkv.data_ptr()
        assert mine.w_gate_up.data_ptr() == theirs.w_gate_up.data_ptr()
    assert draft_runner.lm_head.data_ptr() == target_runner.lm_head.data_ptr()


@pytest.mark.parametrize("runner", ["paged", "hf"])
@pytest.mark.parametrize("lengths", [[6], [5, 9, 3]])
def test_greedy_equals_generate(target, runner, lengths):
    ids, mask = left_padded_prompts(lengths, seed=len(lengths))
    kw = dict(do_sample=False, max_new_tokens=NEW, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, **kw)
    for n in (1, 2):
        out, stats = api.generate(target, ids, mask, assistant_early_exit=n, runner=runner, return_stats=True, **kw)
        assert torch.equal(out, expected), n
        assert stats.k == 4 and stats.iterations < NEW  # it drafted (the default K), and some drafts were taken


def test_transformers_own_early_exit_gives_the_same_tokens(target):
    """transformers' assisted generation with assistant_early_exit (batch 1 only there)."""
    ids, mask = left_padded_prompts([7], seed=3)
    kw = dict(do_sample=False, max_new_tokens=NEW, pad_token_id=0, assistant_early_exit=2)
    assert torch.equal(api.generate(target, ids, mask, **kw), target.generate(ids, attention_mask=mask, **kw))


def test_the_patch_routes_an_early_exit_call(target):
    """patch_generate(model) without a bound drafter routes a call that names assistant_early_exit
    (a drafter), as one with assistant_model."""
    model = make_model("llama", layers=3, seed=21)
    model.generation_config.eos_token_id = None
    ids, mask = left_padded_prompts([5, 9, 3], seed=4)
    kw = dict(do_sample=False, max_new_tokens=NEW, pad_token_id=0)
    expected = model.generate(ids, attention_mask=mask, **kw)
    specdec_fast.patch_generate(model)
    assert torch.equal(model.generate(ids, attention_mask=mask, assistant_early_exit=1, **kw), expected)
    assert model.specdec_last_stats.k == 4


def test_sampled_tokens_follow_the_target(target):
    """Two sampled tokens after one prompt, 3000 rows: their joint distribution is the target's
    (the early-exit draft is only a proposal); the draft's own tokens fail the same test."""
    vocab = 12
    model = make_model("llama", vocab=vocab, layers=3, seed=24, init_std=0.5)
    model.generation_config.eos_token_id = None
    prompt = torch.tensor([[3, 7, 3, 9]])
    out, stats = api.generate(model, prompt.expand(3000, -1), assistant_early_exit=1, num_assistant_tokens=2,
                              do_sample=True, temperature=1.0, top_k=0, max_new_tokens=2, seed=5, return_stats=True)
    assert 0.05 < stats.alpha < 0.95, stats.alpha
    with torch.no_grad():
        p1 = model(prompt).logits[0, -1].softmax(-1).double()
        following = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)
        p2 = model(following).logits[:, -1].softmax(-1).double()
    joint = (p1[:, None] * p2).reshape(-1)
    new = out[:, prompt.shape[1]:]
    assert chi_square_pvalue(new[:, 0] * vocab + new[:, 1], joint) > P_VALUE_THRESHOLD
    # Control: tokens from the draft's own distribution (a verify that took every draft) fail it.
    drafted = api.generate(early_exit_model(model, 1), prompt.expand(3000, -1), do_sample=True, temperature=1.0,
                           top_k=0, max_new_tokens=2, seed=5)[:, prompt.shape[1]:]
    assert chi_square_pvalue(drafted[:, 0] * vocab + drafted[:, 1], joint) < 1e-6


@pytest.mark.parametrize("value, message", [(0, "must be an int >= 1"), (True, "must be an int >= 1"),
                                            (1.5, "must be an int >= 1"), (3, "keeps every layer")])
def test_bad_values_raise_naming_the_option(target, value, message):
    ids, mask = left_padded_prompts([4], seed=1)
    with pytest.raises(ValueError, match=f"assistant_early_exit.*{message}|{message}.*assistant_early_exit"):
        api.generate(target, ids, mask, assistant_early_exit=value, max_new_tokens=2)


def test_one_drafter_at_a_time(target):
    ids, mask = left_padded_prompts([4], seed=1)
    with pytest.raises(ValueError, match="give one drafter .* got assistant_model and assistant_early_exit"):
        api.generate(target, ids, mask, assistant_model=make_model("llama"), assistant_early_exit=1, max_new_tokens=2)
    with pytest.raises(ValueError, match="got prompt_lookup_num_tokens and assistant_early_exit"):
        api.generate(target, ids, mask, prompt_lookup_num_tokens=2, assistant_early_exit=1, max_new_tokens=2)


def test_the_draft_goes_with_the_target():
    model = make_model("llama", layers=3, seed=25)
    early_exit_model(model, 1)
    before = len(early_exit._DRAFTS)
    del model
    gc.collect()
    assert len(early_exit._DRAFTS) == before - 1


def test_a_decoder_of_another_layout_goes_to_transformers_through_the_patch():
    """GPT-2 keeps its blocks at transformer.h: generate refuses assistant_early_exit with an
    UnsupportedModelError (a ValueError), which a bound patch hands to transformers' generate
    with one warning (whose GPT-2 forward ignores num_hidden_layers: its draft is the whole model,
    the tokens greedy decoding's)."""
    from specdec_fast.runners.hf import UnsupportedModelError

    model = make_model("gpt2", layers=2, seed=4)
    model.generation_config.eos_token_id = None
    ids, mask = left_padded_prompts([5], seed=6)
    assert_handed_to_transformers(model, UnsupportedModelError,
                                  "assistant_early_exit needs a decoder whose layers are a ModuleList",
                                  dict(assistant_early_exit=1), ids, attention_mask=mask, do_sample=False,
                                  max_new_tokens=6, pad_token_id=0)
