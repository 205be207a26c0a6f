"""Hidden-state capture of the paged runners (runners/hidden_capture.py): at every position prefill
and score run, the chosen hidden states equal transformers' output_hidden_states of the row's
context; the score buffer keeps its address from call to call; off by default."""
import pytest
import torch

from specdec_fast.runners.registry import paged_runner_class
from specdec_fast.runners.paged_llama import PagedLlamaRunner

from ..conftest import backend_device, on_device
from .family_models import tiny_family
from .models import left_padded_prompts, make_model
from .test_paged_runner import VOCAB, tiny


def hf_hidden(model, tokens, indices) -> torch.Tensor:
    """[len, len(indices) * H]: transformers' hidden_states[j] for j in indices, concatenated."""
    with torch.no_grad():
        states = model(input_ids=torch.tensor([tokens], device=model.device), output_hidden_states=True).hidden_states
    return torch.cat([states[j][0] for j in indices], -1)


FAMILIES = ("olmo2", "gemma2", "gemma3", "starcoder2", "gpt_neox", "opt", "cohere", "cohere2", "gpt_bigcode")  # tests/engine/family_models.py


def _model(kind):
    if kind == "gpt2":
        return make_model("gpt2", vocab=VOCAB, layers=3)
    if kind in FAMILIES:
        return tiny_family(kind, layers=3)
    return tiny(kind, layers=3)


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2", "granite", "smollm3", *FAMILIES])
def test_captured_states_equal_transformers(kind, backend, device):
    if kind == "gpt2" and backend == "triton":
        pytest.skip("the GPT-2 runner's math is one path; the llama rows cover the Triton layer math")
    device = backend_device(backend, device)
    model = on_device(device, _model(kind))
    runner = paged_runner_class(model)(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    indices = (0, 2, 3, 1)  # embeddings, layer 1's output, the final norm, layer 0's: in this order
    runner.capture_hidden_states(indices)
    ids, mask = on_device(device, *left_padded_prompts([5, 2, 7], vocab=VOCAB, seed=3))
    runner.prefill(ids, mask)
    prompt = runner.take_prefill_hidden()
    contexts = [ids[b, mask[b].bool()].tolist() for b in range(3)]
    for b in range(3):
        n = len(contexts[b])
        torch.testing.assert_close(prompt[b, -n:], hf_hidden(model, contexts[b], indices), atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match="no prefill hidden states"):
        runner.take_prefill_hidden()
    gen = torch.Generator().manual_seed(4)
    buffer = None
    for num_valid, keep in (([1, 3, 2], [1, 3, 0]), (None, [4, 2, 1]), ([0, 4, 1], [0, 4, 1])):
        tokens = torch.randint(3, VOCAB, (3, 4), generator=gen).to(device)
        runner.score(tokens, None if num_valid is None else torch.tensor(num_valid, device=device))
        states = runner.hidden_states(3, 4)
        buffer = states.data_ptr() if buffer is None else buffer
        assert states.data_ptr() == buffer  # the same buffer, overwritten in place
        valid = num_valid or [4, 4, 4]
        for b in range(3):
            if not valid[b]:
                continue
            new = tokens[b, 4 - valid[b]:].tolist()
            expected = hf_hidden(model, contexts[b] + new, indices)[-valid[b]:]
            torch.testing.assert_close(states[b, 4 - valid[b]:], expected, atol=1e-4, rtol=1e-4)
        runner.commit(torch.tensor(keep, device=device))
        for b in range(3):
            contexts[b] += tokens[b, 4 - valid[b]:].tolist()[: keep[b]]


def test_capture_is_off_by_default_and_checks_indices():
    runner = PagedLlamaRunner(tiny("llama"), max_new_tokens=4, num_draft_tokens=1)
    assert runner.hidden_capture is None
    with pytest.raises(RuntimeError, match="capture_hidden_states"):
        runner.hidden_states(1, 2)
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        runner.capture_hidden_states((0, 3))
    runner.capture_hidden_states((2,))
    runner.capture_hidden_states(None)
    assert runner.hidden_capture is None
