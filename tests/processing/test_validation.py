"""Bad option values raise one ValueError naming the option and the value, at construction."""
import pytest

from specdec_fast.processing import LogitsProcessing

BAD = [
    ("sequence_bias", []), ("sequence_bias", [[[1, 2], "x"]]), ("sequence_bias", [[[], 1.0]]),
    ("sequence_bias", [[[1, 50], 1.0]]), ("sequence_bias", {(1,): float("nan")}), ("sequence_bias", 3),
    ("no_repeat_ngram_size", -1), ("no_repeat_ngram_size", 2.5), ("no_repeat_ngram_size", True),
    ("bad_words_ids", []), ("bad_words_ids", [[1], []]), ("bad_words_ids", [[1, -3]]), ("bad_words_ids", [[60]]),
    ("min_length", -2), ("min_new_tokens", 1.5), ("suppress_tokens", 5), ("suppress_tokens", [1.0]),
    ("begin_suppress_tokens", "ab"), ("repetition_penalty", 0), ("repetition_penalty", -1.0),
    ("frequency_penalty", 3.0), ("presence_penalty", float("inf")), ("typical_p", 0.0), ("epsilon_cutoff", 1.0),
    ("encoder_repetition_penalty", 2), ("encoder_repetition_penalty", 0.0), ("encoder_no_repeat_ngram_size", -1),
    ("encoder_no_repeat_ngram_size", 1.5),
    ("eta_cutoff", -0.5), ("forced_eos_token_id", -1), ("forced_eos_token_id", [2, 50]), ("forced_eos_token_id", "x"),
    ("forced_eos_token_id", []), ("forced_bos_token_id", 50), ("forced_bos_token_id", True),
    ("exponential_decay_length_penalty", (-1, 1.5)), ("exponential_decay_length_penalty", 1.5),
    ("exponential_decay_length_penalty", (2, "x")), ("exponential_decay_length_penalty", (2.0, 1.5)),
    ("remove_invalid_values", 1),
]


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_bad_value_names_the_option(name, value):
    with pytest.raises(ValueError, match=name) as info:
        LogitsProcessing(vocab_size=50, prompt_width=4, device="cpu", eos_token_id=2, **{name: value})
    assert "got" in str(info.value)  # the offending value (or entry) is quoted


def test_length_options_need_what_they_read():
    """forced_eos_token_id forces the call's last position: it needs max_new_tokens;
    exponential_decay_length_penalty raises EOS: it needs an eos_token_id."""
    with pytest.raises(ValueError, match="forced_eos_token_id needs the call's max_new_tokens"):
        LogitsProcessing(vocab_size=50, prompt_width=4, device="cpu", forced_eos_token_id=2)
    with pytest.raises(ValueError, match="exponential_decay_length_penalty needs an eos_token_id"):
        LogitsProcessing(vocab_size=50, prompt_width=4, device="cpu", exponential_decay_length_penalty=(2, 1.5))


def test_unknown_option_and_sizes():
    with pytest.raises(ValueError, match="unknown logits processing option"):
        LogitsProcessing(vocab_size=50, prompt_width=4, device="cpu", diversity_penalty=0.5)
    with pytest.raises(ValueError, match="vocab_size"):
        LogitsProcessing(vocab_size=0, prompt_width=4, device="cpu")
    processing = LogitsProcessing(vocab_size=50, prompt_width=4, device="cpu", suppress_tokens=[1])
    import torch

    with pytest.raises(ValueError, match="V=50"):
        processing.apply_(torch.zeros(1, 2, 49), torch.zeros(1, 8, dtype=torch.long), torch.tensor([4]),
                          torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="drafts"):
        processing.apply_(torch.zeros(1, 3, 50), torch.zeros(1, 8, dtype=torch.long), torch.tensor([4]),
                          torch.zeros(1, 1, dtype=torch.long))


def test_with_vocab_and_from_options():
    from transformers import GenerationConfig

    config = GenerationConfig(min_new_tokens=3, min_length=50, eos_token_id=2, no_repeat_ngram_size=2)
    processing = LogitsProcessing.from_options(config, vocab_size=50, prompt_width=4, device="cpu")
    # like generate: min_new_tokens takes precedence and sets min_length = P + min_new_tokens
    thresholds = sorted(s.threshold for s in processing.stages if hasattr(s, "threshold"))
    assert thresholds == [7, 7]
    draft = processing.with_vocab(60)
    assert draft.vocab_size == 60 and len(draft.stages) == len(processing.stages)
    with pytest.raises(ValueError, match="sequence_bias"):
        LogitsProcessing(vocab_size=60, prompt_width=4, device="cpu", sequence_bias=[[[55], 1.0]]).with_vocab(50)


@pytest.mark.parametrize("forced", ["forced_bos_token_id", "forced_eos_token_id"])
def test_a_forced_token_that_is_also_suppressed_raises_as_transformers_does(forced):
    """GenerationConfig.validate raises when every forced token is suppressed (no token is left at
    the forced step); the same ValueError here. A forced list with one token left passes."""
    with pytest.raises(ValueError, match=f"Every token in `{forced}` \\(\\[10\\]\\) is also in `suppress_tokens`"):
        LogitsProcessing(vocab_size=50, prompt_width=4, device="cpu", max_new_tokens=5, suppress_tokens=[3, 10],
                         **{forced: 10})
    if forced == "forced_eos_token_id":
        LogitsProcessing(vocab_size=50, prompt_width=4, device="cpu", max_new_tokens=5, suppress_tokens=[10],
                         forced_eos_token_id=[10, 11])
