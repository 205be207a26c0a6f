"""A few seeded cases of each mode of the generate() fuzzer (tests/fuzz_generate.py; run it longer
by hand: python -m tests.fuzz_generate --mode greedy --iterations 300): random combinations of
options, drafters, backends, runners and graph modes, each against its oracle. The modes' cases
are different calls at every seed, so the suite's few widen what the targeted tests cover."""
import pytest

from tests import fuzz_generate


@pytest.mark.parametrize("mode, seed, iterations", [("greedy", 11, 4), ("sampled", 11, 2), ("families", 11, 8), ("chat", 11, 2)])
def test_fuzzed_calls_agree_with_their_oracle(mode, seed, iterations):
    cases = list(fuzz_generate.MODES[mode](seed, iterations))
    failures = [f"case {it}: {description}\n {failure}" for it, description, failure in cases if failure]
    assert not failures, "\n".join(failures)
    assert not all(fuzz_generate.was_refused(description) for _, description, _ in cases), "every call was refused"


def test_control_a_token_changed_is_a_failure():
    """The comparison the modes rely on sees one token changed, a refusal on one side only, and a
    score off by more than its tolerance."""
    import torch
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    tokens = torch.tensor([[5, 6, 7]])
    assert fuzz_generate._compare(tokens, tokens.clone()) is None
    assert fuzz_generate._compare(tokens, torch.tensor([[5, 6, 8]])) is not None
    assert fuzz_generate._compare(tokens, ValueError("refused")) is not None
    assert fuzz_generate._compare(ValueError("a"), ValueError("b")) is None
    assert fuzz_generate._compare(GenerateDecoderOnlyOutput(sequences=tokens), tokens) is not None
    scores = (torch.tensor([[0.0, float("-inf"), 1.0]]),)
    out = GenerateDecoderOnlyOutput(sequences=tokens, scores=scores)
    assert fuzz_generate._compare(out, GenerateDecoderOnlyOutput(sequences=tokens, scores=scores)) is None
    off = (torch.tensor([[0.0, float("-inf"), 1.01]]),)
    assert fuzz_generate._compare(out, GenerateDecoderOnlyOutput(sequences=tokens, scores=off)) == "scores of step 0"
