"""Each built-in processor, batched per position on the device, equals transformers' own class
called per row and per position on that position's exact input_ids (cases.py)."""
import pytest
import torch
from transformers.generation import logits_process as lp

from specdec_fast.processing import LogitsProcessing
from specdec_fast.processing.penalties import generate_skips_prompt_pads

from .cases import assert_same, oracle, random_case

EOS = 3
SEEDS = range(4)


def run(case, **options):
    processing = LogitsProcessing(vocab_size=case.logits.shape[-1], prompt_width=case.prompt_width, device="cpu",
                                  fused_penalties=False, **options)
    assert processing.active and processing.graph_safe
    return processing.apply_(case.logits.clone(), case.seq, case.end, case.drafts, start=case.start)


def check(case, make, **options):
    expected, valid = oracle(make, case)
    assert_same(run(case, **options), expected, valid)


def hf(*processors):
    return lp.LogitsProcessorList(processors)


class _FixedDecay(lp.ExponentialDecayLengthPenalty):
    """transformers' ExponentialDecayLengthPenalty with 5.24's fix, which ours follows: a non-finite
    EOS logit is left as it is (``penalty.masked_fill(~torch.isfinite(scores[:, eos]), 0.0)``).
    Before 5.24 it adds |s| * (factor^i - 1) to it too: -inf + inf (factor > 1) or inf - inf
    (factor < 1) gives NaN, which transformers' sampling then refuses."""

    def __call__(self, input_ids, scores):
        out = super().__call__(input_ids, scores)
        kept = torch.zeros_like(scores, dtype=torch.bool)
        kept[:, self.eos_token_id] = ~torch.isfinite(scores[:, self.eos_token_id])
        return torch.where(kept, scores, out)


def _decay_is_fixed() -> bool:
    """Whether the installed transformers leaves a -inf EOS logit -inf (5.24+) or makes it NaN."""
    decayed = lp.ExponentialDecayLengthPenalty((0, 2.0), 0, 0)(torch.zeros(1, 1, dtype=torch.long),
                                                               torch.tensor([[float("-inf"), 0.0]]))
    return not torch.isnan(decayed).any()


# transformers' own class where it has the fix; elsewhere the same class with the fix added
ExponentialDecayLengthPenalty = lp.ExponentialDecayLengthPenalty if _decay_is_fixed() else _FixedDecay


@pytest.mark.parametrize("seed", SEEDS)
def test_sequence_bias(seed):
    case = random_case(seed)
    bias = [[[1], 2.5], [[4], -1.0], [[2, 5], 3.0], [[1, 2], -0.5], [[1, 2, 3], 1.25], [[6, 6, 6, 5], 4.0],
            [[3, 5], 0.75], [[7, 7, 1], -2.0]]  # two sequences end in 5, one prefix longer than short prompts
    check(case, lambda b: hf(lp.SequenceBiasLogitsProcessor(sequence_bias=bias)), sequence_bias=bias)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_no_repeat_ngram(seed, size):
    case = random_case(seed, alphabet=5 if size > 2 else 8)
    check(case, lambda b: hf(lp.NoRepeatNGramLogitsProcessor(size)), no_repeat_ngram_size=size)


@pytest.mark.parametrize("seed", SEEDS)
def test_bad_words(seed):
    case = random_case(seed)
    bad = [[5], [EOS], [2, 4], [1, 1, 6], [7, EOS], [0, 1]]  # [EOS] alone is dropped; 0 is the pad id: pads match
    check(case, lambda b: hf(lp.NoBadWordsLogitsProcessor(bad, eos_token_id=EOS)), bad_words_ids=bad, eos_token_id=EOS)


@pytest.mark.parametrize("seed", SEEDS)
def test_min_length_and_min_new_tokens(seed):
    case = random_case(seed)
    P = case.prompt_width
    make = lambda b: hf(lp.MinLengthLogitsProcessor(P + 5, [EOS, 9]),  # noqa: E731
                        lp.MinNewTokensLengthLogitsProcessor(P, 4, [EOS, 9]))
    check(case, make, min_length=P + 5, min_new_tokens=4, eos_token_id=[EOS, 9])


@pytest.mark.parametrize("seed", SEEDS)
def test_min_length_counts_the_prompt(seed):
    case = random_case(seed)
    check(case, lambda b: hf(lp.MinLengthLogitsProcessor(case.prompt_width + 3, EOS)),
          min_length=case.prompt_width + 3, eos_token_id=EOS)


@pytest.mark.parametrize("seed", SEEDS)
def test_suppress_and_begin_suppress(seed):
    case = random_case(seed, n=3, gen_lens=[0, 0, 2])  # the first generated position at i = 0 (rows 0, 1)
    P = case.prompt_width
    make = lambda b: hf(lp.SuppressTokensLogitsProcessor([4, 7, 70]),  # noqa: E731
                        lp.SuppressTokensAtBeginLogitsProcessor([2, 5, -1], P))
    check(case, make, suppress_tokens=[4, 7, 70], begin_suppress_tokens=[2, 5, -1])


def test_begin_suppress_hits_only_the_first_generated_position():
    case = random_case(0, n=4, gen_lens=[0, 1, 3])
    out = run(case, begin_suppress_tokens=[5])
    assert torch.isneginf(out[..., 5]).tolist() == [[True, False, False, False]] * 1 + [[False] * 4] * 2


def check_exact(case, make, **options) -> torch.Tensor:
    """Bit for bit transformers' values at every valid position (NaN nowhere here), and the
    processor changed something there (the case reaches the lengths it acts at)."""
    expected, valid = oracle(make, case)
    ours = run(case, **options)
    assert torch.equal(ours[valid], expected[valid])
    assert not torch.equal(ours[valid], case.logits[valid]), "the case never reaches the processor's lengths"
    return ours


@pytest.mark.parametrize("seed", SEEDS)
def test_forced_eos_at_the_last_position(seed):
    """max_length = P + max_new_tokens: at L = P + 4 (row 0 position 0, row 1 position 2, row 2
    position 3) only EOS and 9 are left, at logit 0."""
    case = random_case(seed, gen_lens=[4, 2, 1])
    P = case.prompt_width
    out = check_exact(case, lambda b: hf(lp.ForcedEOSTokenLogitsProcessor(P + 5, [EOS, 9])),
                      forced_eos_token_id=[EOS, 9], max_new_tokens=5)
    assert torch.isfinite(out[0, 0]).sum() == 2 and out[0, 0, EOS] == 0 and out[0, 0, 9] == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_forced_bos_after_a_one_token_prompt(seed):
    case = random_case(seed, prompt_lengths=(1, 1, 1), gen_lens=[0, 0, 1])
    check_exact(case, lambda b: hf(lp.ForcedBOSTokenLogitsProcessor(4)), forced_bos_token_id=4)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("decay", [(2, 1.7), (0, 0.6), (5, 1.05)])
def test_exponential_decay_length_penalty(seed, decay):
    """Positive, negative, -inf and +inf EOS logits; the factor grows with the length."""
    case = random_case(seed, max_gen=12)
    case.logits[0, :, EOS] = float("-inf")
    case.logits[1, 1, 9] = float("inf")
    P = case.prompt_width
    check_exact(case, lambda b: hf(ExponentialDecayLengthPenalty(decay, [EOS, 9], P)),
                exponential_decay_length_penalty=decay, eos_token_id=[EOS, 9])


@pytest.mark.parametrize("seed", SEEDS)
def test_remove_invalid_values(seed):
    """NaN, +inf and -inf (some from a mask before it, some given) to 0 / float32's max / its lowest;
    suppress_tokens after it writes -inf again."""
    case = random_case(seed)
    case.logits[0, 1, :5] = torch.tensor([float("nan"), float("inf"), float("-inf"), float("nan"), 2.0])
    case.logits[2, :, 11] = float("inf")
    P = case.prompt_width
    make = lambda b: hf(lp.MinNewTokensLengthLogitsProcessor(P, 3, EOS), lp.InfNanRemoveLogitsProcessor(),  # noqa: E731
                        lp.SuppressTokensLogitsProcessor([7]))
    expected, valid = oracle(make, case)
    ours = run(case, min_new_tokens=3, eos_token_id=EOS, remove_invalid_values=True, suppress_tokens=[7])
    assert torch.equal(ours[valid], expected[valid])
    assert not torch.isnan(ours[valid]).any() and torch.isneginf(ours[valid][:, 7]).all()
    assert (ours[valid] == torch.finfo(torch.float32).min).any() and (ours[valid] == torch.finfo(torch.float32).max).any()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("vocab", [50, 300])
def test_all_builtins_in_order(seed, vocab):
    """Every built-in together (sequence_bias before the penalty, suppress_tokens after the forced
    EOS that it suppresses again: the order matters there)."""
    case = random_case(seed, vocab=vocab)
    P = case.prompt_width
    bias = [[[2], 1.5], [[1, 2], -0.5], [[4, 4, 1], 2.0]]
    bad = [[6], [5, 1]]

    def make(b):
        return hf(lp.SequenceBiasLogitsProcessor(bias),
                  lp.RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=int(case.start[b])),
                  lp.NoRepeatNGramLogitsProcessor(3), lp.NoBadWordsLogitsProcessor(bad, EOS),
                  lp.MinLengthLogitsProcessor(P + 6, EOS), lp.MinNewTokensLengthLogitsProcessor(P, 6, EOS),
                  lp.ForcedEOSTokenLogitsProcessor(P + 9, [EOS, 7]),
                  ExponentialDecayLengthPenalty((2, 1.4), EOS, P),
                  lp.SuppressTokensLogitsProcessor([7]), lp.SuppressTokensAtBeginLogitsProcessor([1], P))

    check(case, make, sequence_bias=bias, repetition_penalty=1.3, no_repeat_ngram_size=3, bad_words_ids=bad,
          min_length=P + 6, min_new_tokens=6, eos_token_id=EOS, suppress_tokens=[7], begin_suppress_tokens=[1],
          forced_eos_token_id=[EOS, 7], max_new_tokens=9, exponential_decay_length_penalty=(2, 1.4))


@pytest.mark.parametrize("seed", range(3))
def test_draft_call_sees_every_draft_so_far(seed):
    """The draft model's call: N = 1 position after D drafts (prefix = seq ++ drafts[:, :D])."""
    case = random_case(seed, n=1, extra_drafts=3)
    assert case.drafts.shape[1] == 3
    bias = [[[1, 2], 2.0], [[3], 1.0]]
    make = lambda b: hf(lp.SequenceBiasLogitsProcessor(bias), lp.NoRepeatNGramLogitsProcessor(2))  # noqa: E731
    check(case, make, sequence_bias=bias, no_repeat_ngram_size=2)


def test_get_logits_processor_of_a_generation_config():
    """transformers' own list (model._get_logits_processor, as generate builds it: one list per
    row here, its attention mask giving the repetition penalty's ignored pads)."""
    from transformers import GenerationConfig

    from ..engine.models import make_model

    model = make_model("llama", vocab=64)
    case = random_case(5, vocab=64)
    P = case.prompt_width
    options = dict(repetition_penalty=1.2, no_repeat_ngram_size=2, min_new_tokens=3, suppress_tokens=[4, 9],
                   sequence_bias=[[[2, 5], 1.0]], bad_words_ids=[[6, 2]], begin_suppress_tokens=[5])
    config = GenerationConfig(eos_token_id=EOS, **options)
    config._eos_token_tensor = torch.tensor([EOS])
    config.min_length = P + 3  # what _prepare_generated_length makes of min_new_tokens
    mask = (torch.arange(P)[None, :] >= case.start[:, None]).long()

    def make(b):
        return model._get_logits_processor(generation_config=config, input_ids_seq_length=P, device="cpu",
                                           model_kwargs={"attention_mask": mask[b : b + 1]})

    assert len(make(0)) == 8
    processing = LogitsProcessing.from_options(dict(options, eos_token_id=EOS), vocab_size=64, prompt_width=P,
                                               device="cpu", fused_penalties=False)
    expected, valid = oracle(make, case)
    start = case.start if generate_skips_prompt_pads() else None  # as the installed generate (up to 5.22 it counts pads)
    assert_same(processing.apply_(case.logits.clone(), case.seq, case.end, case.drafts, start=start),
                expected, valid)


def test_one_processing_serves_calls_of_any_prompt_width():
    """An engine keeps one LogitsProcessing across calls (its stages are what a CUDA graph
    captured): set_prompt_width(P) makes it give what one built at P gives, for every stage that
    depends on P (min_new_tokens, min_length from min_new_tokens, begin_suppress, the penalties'
    generated-token start, the exponential decay's start), and set_max_new_tokens the same for
    forced_eos_token_id's position."""
    options = dict(min_new_tokens=4, eos_token_id=[EOS, 9], begin_suppress_tokens=[1, 2], frequency_penalty=0.5,
                   presence_penalty=0.25, repetition_penalty=1.2, suppress_tokens=[7], forced_eos_token_id=9,
                   exponential_decay_length_penalty=(2, 1.3))
    reused = LogitsProcessing.from_options(options, vocab_size=50, prompt_width=11, device="cpu", max_new_tokens=20)
    for prompt_lengths, max_new in [((6, 3, 1), 4), ((2, 2, 2), 7), ((9, 1, 4), 3)]:
        case = random_case(5, prompt_lengths=prompt_lengths)
        fresh = LogitsProcessing.from_options(options, vocab_size=50, prompt_width=case.prompt_width, device="cpu",
                                              max_new_tokens=max_new)
        reused.set_prompt_width(case.prompt_width)
        reused.set_max_new_tokens(max_new)
        args = (case.seq, case.end, case.drafts)
        assert torch.equal(reused.apply_(case.logits.clone(), *args, start=case.start),
                           fresh.apply_(case.logits.clone(), *args, start=case.start))
        assert not torch.equal(fresh.apply_(case.logits.clone(), *args, start=case.start), case.logits)
