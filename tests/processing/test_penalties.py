"""Penalties per position: repetition_penalty equals transformers' processor as generate() builds
it (left pads ignored through the attention mask) and as the class does alone (pads counted);
frequency / presence equal vLLM's formula over the generated tokens + the drafts seen."""
import pytest
import torch
from transformers.generation import logits_process as lp

from specdec_fast.processing import Prefixes, apply_penalties_, token_counts

from .cases import assert_same, oracle, random_case


def penalised(case, start="case", **kw):
    logits = case.logits.clone()
    prefixes = Prefixes(case.seq, case.end, case.drafts, case.n, start=None)
    apply_penalties_(logits, prefixes, prompt_width=case.prompt_width, start=case.start if start == "case" else start, **kw)
    return logits


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_ignores_left_pads_like_generate(seed, penalty):
    case = random_case(seed, alphabet=20)
    make = lambda b: lp.LogitsProcessorList([lp.RepetitionPenaltyLogitsProcessor(  # noqa: E731
        penalty, prompt_ignore_length=int(case.start[b]))])
    expected, valid = oracle(make, case)
    assert_same(penalised(case, repetition_penalty=penalty), expected, valid)


def test_repetition_penalty_counts_pads_without_start():
    case = random_case(1, alphabet=20)
    expected, valid = oracle(lambda b: lp.LogitsProcessorList([lp.RepetitionPenaltyLogitsProcessor(1.5)]), case)
    assert_same(penalised(case, start=None, repetition_penalty=1.5), expected, valid)
    assert not torch.equal(penalised(case, repetition_penalty=1.5)[..., 0], expected[..., 0])  # pad id 0 differs


def vllm_frequency_presence(case, frequency, presence):
    """vLLM's apply_penalties with only the output tokens: logits -= f * count; logits -= p * (count > 0)."""
    expected = case.logits.clone()
    vocab = case.logits.shape[-1]
    for b in range(case.logits.shape[0]):
        for i in range(case.n):
            ids = case.prefix(b, i)
            if ids is None:
                continue
            counts = torch.bincount(ids[0, case.prompt_width:], minlength=vocab).float()
            row = expected[b, i] - frequency * counts
            expected[b, i] = row - presence * (counts > 0).float()
    return expected


@pytest.mark.parametrize("seed", range(3))
def test_frequency_and_presence_penalties_over_generated_tokens(seed):
    case = random_case(seed, alphabet=10)
    expected = vllm_frequency_presence(case, 0.4, 0.9)
    _, valid = oracle(lambda b: (lambda ids, s: s), case)
    assert_same(penalised(case, frequency_penalty=0.4, presence_penalty=0.9), expected, valid)


def test_token_counts_per_position():
    case = random_case(2, alphabet=6)
    prefixes = Prefixes(case.seq, case.end, case.drafts, case.n)
    counts = token_counts(prefixes, case.start, case.logits.shape[-1])
    for b in range(3):
        for i in range(case.n):
            ids = case.prefix(b, i)
            if ids is not None:
                want = torch.bincount(ids[0, int(case.start[b]):], minlength=case.logits.shape[-1])
                assert torch.equal(counts[b, i].long(), want)


@pytest.mark.parametrize("name,value", [("repetition_penalty", 0.0), ("repetition_penalty", float("nan")),
                                        ("frequency_penalty", 2.5), ("presence_penalty", "1"),
                                        ("repetition_penalty", True)])
def test_bad_penalty_values_raise_naming_the_option(name, value):
    case = random_case(0)
    with pytest.raises(ValueError, match=name):
        penalised(case, **{name: value})
