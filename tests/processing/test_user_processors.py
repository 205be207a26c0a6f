"""A user's logits_processor list: applied eagerly per row and position on the exact input_ids,
after the built-in processors (transformers' merge), replacing a built-in of the same class in
its slot; not graph safe, and the caller gets a reason for the stats."""
from dataclasses import replace

import pytest
import torch
from transformers.generation import logits_process as lp

from specdec_fast.processing import LogitsProcessing

from .cases import assert_same, oracle, random_case


class LastTokenBoost(lp.LogitsProcessor):
    """Not a transformers class: adds len(input_ids) / 10 to the logit of the last token, and
    records the input_ids it saw."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores):
        self.seen.append(input_ids.clone())
        scores = scores.clone()
        scores[torch.arange(scores.shape[0]), input_ids[:, -1]] += input_ids.shape[-1] / 10
        return scores


def build(case, users, **options):
    return LogitsProcessing(vocab_size=case.logits.shape[-1], prompt_width=case.prompt_width, device="cpu",
                            logits_processor=users, fused_penalties=True, **options)


@pytest.mark.parametrize("seed", range(3))
def test_user_processor_after_the_builtins(seed):
    case = random_case(seed)
    options = dict(repetition_penalty=1.4, no_repeat_ngram_size=2, suppress_tokens=[5])
    user = LastTokenBoost()
    processing = build(case, [user], **options)
    assert not processing.graph_safe and "logits_processor" in processing.graph_note
    assert processing.penalties_here and processing.kernel_penalties["repetition_penalty"] == 1.0
    ours = processing.apply_(case.logits.clone(), case.seq, case.end, case.drafts, start=case.start)
    assert all(ids.shape[0] == 1 for ids in user.seen)

    def make(b):
        return lp.LogitsProcessorList([
            lp.RepetitionPenaltyLogitsProcessor(1.4, prompt_ignore_length=int(case.start[b])),
            lp.NoRepeatNGramLogitsProcessor(2), lp.SuppressTokensLogitsProcessor([5]), LastTokenBoost()])

    expected, valid = oracle(make, case)
    assert_same(ours, expected, valid)
    assert len(user.seen) == int(valid.sum())  # called once per real position, padded drafts skipped


def test_user_processor_of_a_builtin_class_takes_its_slot():
    """transformers: the user's NoRepeatNGramLogitsProcessor(3) replaces the one built from
    no_repeat_ngram_size=2, in the built-in's slot (before bad_words / suppress), with the
    user's processors that match no built-in after them."""
    case = random_case(4, alphabet=5)
    user_ngram, boost = lp.NoRepeatNGramLogitsProcessor(3), LastTokenBoost()
    options = dict(sequence_bias=[[[1, 2], 1.0]], no_repeat_ngram_size=2, suppress_tokens=[4])
    processing = build(case, [boost, user_ngram], **options)
    ours = processing.apply_(case.logits.clone(), case.seq, case.end, case.drafts, start=case.start)
    make = lambda b: lp.LogitsProcessorList([lp.SequenceBiasLogitsProcessor([[[1, 2], 1.0]]), user_ngram,  # noqa: E731
                                             lp.SuppressTokensLogitsProcessor([4]), LastTokenBoost()])
    expected, valid = oracle(make, case)
    assert_same(ours, expected, valid)


def test_without_user_processors_the_kernel_takes_the_penalties():
    case = random_case(0)
    processing = build(case, None, repetition_penalty=1.2, suppress_tokens=[3])
    assert processing.graph_safe and processing.graph_note is None and not processing.penalties_here
    assert processing.kernel_penalties == dict(repetition_penalty=1.2, frequency_penalty=0.0, presence_penalty=0.0)
    unfused = LogitsProcessing(vocab_size=50, prompt_width=case.prompt_width, device="cpu", repetition_penalty=1.2)
    assert unfused.penalties_here and unfused.kernel_penalties["repetition_penalty"] == 1.0  # the default
    sampled = build(case, None, repetition_penalty=1.2, do_sample=True, typical_p=0.9)
    assert sampled.warpers_here and sampled.penalties_here  # the kernel's penalty would follow the warpers
    assert not build(case, None, repetition_penalty=1.2, typical_p=0.9).warpers_here  # greedy: no warpers


@pytest.mark.parametrize("options", [dict(exponential_decay_length_penalty=(1, 2.5), eos_token_id=[3, 9]),
                                     dict(forced_eos_token_id=[3, 9], max_new_tokens=4)])
def test_values_after_the_penalty_slot_keep_the_penalties_here(options):
    """The kernel applies its penalties after every stage; forced tokens and the decay write values,
    so the penalties run in their slot instead (transformers' order). Control: the decay then the
    repetition penalty (the kernel's order) is not transformers' decay after the penalty."""
    case = random_case(2, max_gen=12)
    assert build(case, None, repetition_penalty=1.5, **options).penalties_here
    make = lambda b: lp.LogitsProcessorList([  # noqa: E731
        lp.RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=int(case.start[b])),
        lp.ExponentialDecayLengthPenalty((1, 2.5), [3, 9], case.prompt_width)])
    expected, valid = oracle(make, case)
    decayed = build(case, None, exponential_decay_length_penalty=(1, 2.5), eos_token_id=[3, 9]).apply_(
        case.logits.clone(), case.seq, case.end, case.drafts, start=case.start)
    kernel_order, _ = oracle(lambda b: lp.LogitsProcessorList([
        lp.RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=int(case.start[b]))]), replace(case, logits=decayed))
    assert not torch.allclose(kernel_order[valid], expected[valid])


def test_nothing_active():
    case = random_case(0)
    processing = build(case, None)
    assert not processing.active and processing.graph_safe
    logits = case.logits.clone()
    assert processing.apply_(logits, case.seq, case.end, case.drafts) is logits and torch.equal(logits, case.logits)


def test_a_processor_that_needs_more_arguments_raises_like_transformers():
    class NeedsBeams(lp.LogitsProcessor):
        def __call__(self, input_ids, scores, beam_scores):
            return scores

    case = random_case(0)
    with pytest.raises(ValueError, match="beam_scores"):
        build(case, [NeedsBeams()])
    with pytest.raises(ValueError):  # transformers' own list raises on the call generate makes
        lp.LogitsProcessorList([NeedsBeams()])(case.seq[:1], case.logits[0, :1])
