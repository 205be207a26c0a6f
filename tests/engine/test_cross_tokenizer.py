"""A draft with another tokenizer (drafters/cross_tokenizer.py) through generate() and the engine:
the output is the target's alone (greedy token for token, batch 1 and 3 with left padding, paged
and hf runners, constant K and the adaptive schedule with K changing every iteration; sampled
tokens follow the target's distribution by chi-square, with a control: a verify that treats the
deterministic drafts as samples of another q fails it), on tiny random models over tokenizers
whose tokens split each other's (cross_pair.py) and on the shipped pair (demo target + the cross
draft). Errors: one line each (bad tokenizer pairs too)."""

import pytest
import torch

import specdec_fast
import specdec_fast.api as api
from specdec_fast.engine.cached import cached_engines
from specdec_fast.kernels import standardise
from specdec_fast.kernels.sampling_params import make_sampling_tensors

from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from specdec_fast.drafters.cross_tokenizer import CrossTokenizerDrafter

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


def test_greedy_adaptive_k_changing_every_iteration(tiny, monkeypatch, chaos):
    """A cross draft takes the adaptive schedule (engine/schedule.py) when the call names it (a
    call without K keeps the constant default K); with K cycling
    1, 5, 2, 8, 3 per iteration the drafter drafts for each iteration's K and the output stays the
    target's alone (batch 3, left padded)."""
    target, draft, tok, atok = tiny
    chosen = chaos([1, 5, 2, 8, 3])  # the engine tests' fixture (conftest.py): the schedule's choice cycles
    asked = []
    drafter_propose = CrossTokenizerDrafter.propose

    def propose(self, k):
        drafts, logits = drafter_propose(self, k)
        asked.append((k, drafts.shape[1], int((drafts >= 0).sum(1).max())))
        return drafts, logits
    monkeypatch.setattr(CrossTokenizerDrafter, "propose", propose)
    ids, mask = left_padded_prompts([3, 7, 5], vocab=V, seed=4)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    plain_call = dict(assistant_model=draft, tokenizer=tok, assistant_tokenizer=atok, max_new_tokens=24, return_stats=True)
    out, stats = api.generate(target, ids, mask, **plain_call)
    assert torch.equal(out, ref)
    assert stats.schedule is None and stats.k == 4 and not chosen  # no K, no schedule named: constant K = 4
    out, stats = api.generate(target, ids, mask, num_assistant_tokens_schedule="adaptive", **plain_call)
    assert torch.equal(out, ref)
    assert stats.schedule is not None and {1, 5, 2, 8} <= set(chosen), chosen
    assert all(k == width and n <= k for k, width, n in asked), asked
    assert any(n > 1 for _, _, n in asked) and sum(stats.accepted_hist[1:]) > 0, (asked, stats.accepted_hist)


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
    joint, p3 = joint_and_third(target, prompt, settings)
    assert chi_square_pvalue(new[:, 0] * V + new[:, 1], joint) > P_VALUE_THRESHOLD
    assert chi_square_pvalue(new[:, 2], p3) > P_VALUE_THRESHOLD


def joint_and_third(target, prompt, settings):
    """The target's joint of the first two new tokens [V * V] and the marginal of the third [V]."""
    vocab = torch.arange(V)
    p1 = target_probs(target, prompt, settings)[0]
    p2 = target_probs(target, torch.cat([prompt.expand(V, -1), vocab[:, None]], 1), settings)
    joint = (p1[:, None] * p2).reshape(-1)
    grid = torch.cartesian_prod(vocab, vocab)
    p3 = (joint[:, None] * target_probs(target, torch.cat([prompt.expand(grid.shape[0], -1), grid], 1), settings)).sum(0)
    return joint, p3


def test_sampling_control_a_wrong_q_fails(tiny, monkeypatch):
    """Control for test_sampled_tokens_follow_the_target: the same run with the deterministic drafts
    verified as if drawn from a uniform q (draft logits of zeros instead of None: accepted with
    min(1, V p(x)), far too often) must fail the same chi-square, so the test can tell a wrong
    acceptance rule for re-tokenised drafts from the right one."""
    target, draft, tok, atok = tiny
    prompt = torch.tensor([[6, 3, 8, 9]])
    settings = dict(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0)
    drafter_propose = CrossTokenizerDrafter.propose

    def wrong_q(self, k):
        drafts, _ = drafter_propose(self, k)
        return drafts, torch.zeros(*drafts.shape, V)
    monkeypatch.setattr(CrossTokenizerDrafter, "propose", wrong_q)
    engine = specdec_fast.SpeculativeEngine(target, draft, tokenizer=tok, assistant_tokenizer=atok, max_batch_size=3000,
                                            max_seq_len=16, num_assistant_tokens=2)
    out = engine.generate(prompt.expand(3000, -1), do_sample=True, temperature=0.8, max_new_tokens=3, seed=11)
    new = out[:, prompt.shape[1]:]
    joint, _ = joint_and_third(target, prompt, settings)
    assert chi_square_pvalue(new[:, 0] * V + new[:, 1], joint) < P_VALUE_THRESHOLD


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
    with pytest.raises(ValueError, match="a draft with another tokenizer under tensor parallelism"):
        specdec_fast.SpeculativeEngine(target, draft, tokenizer=tok, assistant_tokenizer=atok, process_group=object())
    with pytest.raises(ValueError, match="re-tokenises on the host"):
        specdec_fast.SpeculativeEngine(target, draft, tokenizer=tok, assistant_tokenizer=atok, cuda_graphs="static")
    same_vocab = make_model("llama", vocab=V, seed=9)
    engine = specdec_fast.SpeculativeEngine(target, same_vocab)
    with pytest.raises(ValueError, match="this engine drafts in one shared vocabulary"):
        engine.generate(ids, mask, tokenizer=tok, assistant_tokenizer=atok, max_new_tokens=4)
    cross = specdec_fast.SpeculativeEngine(target, draft, tokenizer=tok, assistant_tokenizer=atok)
    with pytest.raises(ValueError, match="another assistant_tokenizer"):
        cross.generate(ids, mask, assistant_tokenizer=tok, max_new_tokens=4)


def one_line_error(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_bad_tokenizer_pairs(tiny):
    """Swapped tokenizers (an id the model has no row for) and objects that are no transformers
    tokenizer: one ValueError line each, before anything runs (generate and the engine)."""
    target, draft, tok, atok = tiny
    ids, mask = left_padded_prompts([4], vocab=V, seed=1)
    swapped = one_line_error(lambda: api.generate(target, ids, mask, assistant_model=draft, tokenizer=atok,
                                                  assistant_tokenizer=tok, max_new_tokens=4))
    assert swapped.startswith("assistant_tokenizer has token ids up to 9 but the draft (assistant_model) has 9 output rows")
    assert "(swapped?)" in swapped
    assert "swapped?" in one_line_error(lambda: specdec_fast.SpeculativeEngine(target, draft, tokenizer=atok,
                                                                                  assistant_tokenizer=tok))
    # the draft's tokenizer for the target (its ids fit the target's rows) and the target's for the draft
    big_target = make_model("llama", vocab=4, seed=2)
    assert "tokenizer has token ids up to 9 but the target (model) has 4 output rows" in one_line_error(
        lambda: api.generate(big_target, ids % 4, mask, assistant_model=draft, tokenizer=tok, assistant_tokenizer=atok,
                             max_new_tokens=4))
    for bad, name in ((tok.backend_tokenizer, "tokenizers.Tokenizer"), ("gpt2", "builtins.str")):
        message = one_line_error(lambda: api.generate(target, ids, mask, assistant_model=draft, tokenizer=bad,
                                                      assistant_tokenizer=atok, max_new_tokens=4))
        assert message.startswith(f"tokenizer must be a transformers tokenizer (AutoTokenizer.from_pretrained(...)), "
                                  f"got {name}"), message
        message = one_line_error(lambda: cross_engine(tiny).generate(ids, mask, tokenizer=tok, assistant_tokenizer=bad,
                                                                     max_new_tokens=4))
        assert message.startswith("assistant_tokenizer must be a transformers tokenizer"), message


def cross_engine(tiny):
    target, draft, tok, atok = tiny
    return specdec_fast.SpeculativeEngine(target, draft, tokenizer=tok, assistant_tokenizer=atok, max_seq_len=64)
