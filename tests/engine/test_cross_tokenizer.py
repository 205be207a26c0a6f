"""A draft with another tokenizer (drafters/cross_tokenizer.py) through generate() and the engine:
the output is the target's alone (greedy token for token, batch 1 and 3 with left padding, paged
and hf runners; sampled tokens follow the target's distribution by chi-square), on tiny random
models over tokenizers whose tokens split each other's (cross_pair.py) and on the shipped pair
(demo target + the cross draft). Errors: one line each."""
import pytest
import torch

import specdec_fast
import specdec_fast.api as api
from specdec_fast.engine.cached import cached_engines
from specdec_fast.kernels import standardise
from specdec_fast.kernels.sampling_params import make_sampling_tensors

from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from .cross_pair import DRAFT_TOKENS, TARGET_TOKENS, fit_draft, tiny_tokenizers
from .models import left_padded_prompts, make_model

V = len(TARGET_TOKENS)


@pytest.fixture(scope="module")
def tiny():
    target = make_model("llama", vocab=V, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    tok, atok = tiny_tokenizers()
    draft = fit_draft(target, make_model("llama", vocab=len(DRAFT_TOKENS), seed=8), tok, atok)
    yield target, draft, tok, atok
    specdec_fast.release_engines(target)


@pytest.mark.parametrize("lengths, runner", [([5], None), ([3, 7, 5], None), ([3, 7, 5], "hf")])
def test_greedy_equals_the_target_alone(tiny, lengths, runner):
    target, draft, tok, atok = tiny
    ids, mask = left_padded_prompts(lengths, vocab=V, seed=3)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    out, stats = api.generate(target, ids, mask, assistant_model=draft, tokenizer=tok, assistant_tokenizer=atok,
                              max_new_tokens=24, num_assistant_tokens=3, runner=runner, return_stats=True)
    assert torch.equal(out, ref)
    assert sum(stats.accepted_hist[1:]) > 0, stats.accepted_hist  # some drafts were accepted
    assert stats.graph_mode == "eager"


def target_probs(model, prefixes: torch.Tensor, settings: dict) -> torch.Tensor:
    """Standardised next-token distribution [N, V] after each prefix [N, T]."""
    with torch.no_grad():
        logits = model(prefixes).logits[:, -1:, :].float()
    params = make_sampling_tensors(prefixes.shape[0], "cpu", **settings)
    return torch.softmax(standardise(logits, params)[:, 0], -1).double()


@pytest.mark.parametrize("sample_drafts", [False, True])
def test_sampled_tokens_follow_the_target(tiny, sample_drafts):
    """3000 rows of one prompt: tokens 2 and 3 come from the first speculative block (K = 2),
    drafted from the row's first token; the draft's argmax or (sample_drafts) its samples."""
    target, draft, tok, atok = tiny
    prompt = torch.tensor([[6, 3, 8, 9]])  # "ab é" + "abc": the draft splits abc
    settings = dict(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0)
    engine = specdec_fast.SpeculativeEngine(target, draft, tokenizer=tok, assistant_tokenizer=atok, max_batch_size=3000,
                                            max_seq_len=16, num_assistant_tokens=2)
    engine._chain_drafter().sample_drafts = sample_drafts
    out, stats = engine.generate(prompt.expand(3000, -1), do_sample=True, temperature=0.8, max_new_tokens=3, seed=11,
                                 return_stats=True)
    assert 0.05 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    new = out[:, prompt.shape[1]:]
    vocab = torch.arange(V)
    p1 = target_probs(target, prompt, settings)[0]
    p2 = target_probs(target, torch.cat([prompt.expand(V, -1), vocab[:, None]], 1), settings)
    joint = (p1[:, None] * p2).reshape(-1)
    assert chi_square_pvalue(new[:, 0] * V + new[:, 1], joint) > P_VALUE_THRESHOLD
    grid = torch.cartesian_prod(vocab, vocab)
    p3 = (joint[:, None] * target_probs(target, torch.cat([prompt.expand(grid.shape[0], -1), grid], 1), settings)).sum(0)
    assert chi_square_pvalue(new[:, 2], p3) > P_VALUE_THRESHOLD


def test_the_shipped_pair_is_exact_and_drafts(demo):
    """The demo target with the draft of another tokenizer (2048 byte-level BPE tokens, digits
    split): greedy equals the target alone, and the trained draft's tokens get accepted."""
    tok, target, atok, draft = demo
    tok.padding_side = "left"
    enc = tok(specdec_fast.pair.held_out_prompts(3), return_tensors="pt", padding=True)
    ref = target.generate(**enc, max_new_tokens=32, do_sample=False, pad_token_id=tok.pad_token_id)
    out, stats = api.generate(target, enc.input_ids, enc.attention_mask, assistant_model=draft, tokenizer=tok,
                              assistant_tokenizer=atok, max_new_tokens=32, return_stats=True)
    assert torch.equal(out, ref)
    assert stats.mean_accepted_length > 1.5, stats.accepted_hist


@pytest.fixture(scope="module")
def demo():
    from specdec_fast.pair import load_cross_draft, load_demo_pair

    tok, target, _ = load_demo_pair()
    target.generation_config.eos_token_id = None
    atok, draft = load_cross_draft()
    yield tok, target, atok, draft
    specdec_fast.release_engines(target)


def test_engines_keyed_apart(tiny):
    """The same draft with one shared vocabulary (tokenizers given or not) keeps one engine; a
    draft with another vocabulary gets its own, found again with a reloaded tokenizer."""
    target, draft, tok, atok = tiny
    ids, mask = left_padded_prompts([4], vocab=V, seed=1)
    specdec_fast.release_engines(target)
    api.generate(target, ids, mask, assistant_model=draft, tokenizer=tok, assistant_tokenizer=atok, max_new_tokens=4)
    tok2, atok2 = tiny_tokenizers()
    api.generate(target, ids, mask, assistant_model=draft, tokenizer=tok2, assistant_tokenizer=atok2, max_new_tokens=4)
    same_vocab = make_model("llama", vocab=V, seed=9)
    api.generate(target, ids, mask, assistant_model=same_vocab, max_new_tokens=4)
    api.generate(target, ids, mask, assistant_model=same_vocab, tokenizer=tok, assistant_tokenizer=tok2, max_new_tokens=4)
    engines = cached_engines(target)
    assert len(engines) == 2
    assert sorted(e.cross_tokenizers is not None for e in engines) == [False, True]
    assert "its own tokenizer" in next(e for e in engines if e.cross_tokenizers).describe()


def test_errors(tiny):
    target, draft, tok, atok = tiny
    ids, mask = left_padded_prompts([4], vocab=V, seed=1)
    with pytest.raises(ValueError, match="vocab mismatch: .*pass both tokenizer="):
        api.generate(target, ids, mask, assistant_model=draft, assistant_tokenizer=atok, max_new_tokens=4)
    with pytest.raises(ValueError, match="tree=... with a draft of another tokenizer"):
        api.generate(target, ids, mask, assistant_model=draft, tokenizer=tok, assistant_tokenizer=atok, tree=4,
                     max_new_tokens=4)
    with pytest.raises(ValueError, match="tree=... with a draft of another tokenizer"):
        specdec_fast.SpeculativeEngine(target, draft, tokenizer=tok, assistant_tokenizer=atok, tree=4)
    with pytest.raises(ValueError, match="re-tokenises on the host"):
        specdec_fast.SpeculativeEngine(target, draft, tokenizer=tok, assistant_tokenizer=atok, cuda_graphs="static")
    same_vocab = make_model("llama", vocab=V, seed=9)
    engine = specdec_fast.SpeculativeEngine(target, same_vocab)
    with pytest.raises(ValueError, match="this engine drafts in one shared vocabulary"):
        engine.generate(ids, mask, tokenizer=tok, assistant_tokenizer=atok, max_new_tokens=4)
    cross = specdec_fast.SpeculativeEngine(target, draft, tokenizer=tok, assistant_tokenizer=atok)
    with pytest.raises(ValueError, match="another assistant_tokenizer"):
        cross.generate(ids, mask, assistant_tokenizer=tok, max_new_tokens=4)
