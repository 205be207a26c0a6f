"""Paged runners built from a checkpoint directory (config.json + safetensors): the family's
class is chosen, the weights are the loaded model's own, and the logits equal that model's."""
import pytest
import torch

from specdec_fast.runners import PagedGPT2Runner, PagedLlamaRunner
from specdec_fast.runners import paged_runner_from_pretrained
from specdec_fast.runners.paged_base import PagedRunnerBase

from .models import make_model
from .test_paged_gpt2 import tiny_gpt2


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_from_pretrained_matches_model_forward(tmp_path, kind):
    model = tiny_gpt2() if kind == "gpt2" else make_model("llama")
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert (tmp_path / "model.safetensors").exists()
    runner = paged_runner_from_pretrained(tmp_path, max_new_tokens=4, num_draft_tokens=2, dtype=torch.float32)
    assert type(runner) is (PagedGPT2Runner if kind == "gpt2" else PagedLlamaRunner)
    head = runner.model.get_output_embeddings().weight
    assert runner.lm_head.data_ptr() == head.data_ptr()  # the loaded model's tensor, not a copy
    tokens = torch.randint(3, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=tokens).logits[0]
    last = runner.prefill(tokens[:, :6], None)
    more = runner.score(tokens[:, 6:])
    torch.testing.assert_close(last[0], expected[5], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(more[0], expected[6:], atol=1e-4, rtol=1e-4)


def test_from_pretrained_wrong_family_is_refused(tmp_path):
    tiny_gpt2().save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(ValueError, match="PagedLlamaRunner cannot run this model: model_type 'gpt2'"):
        PagedLlamaRunner.from_pretrained(tmp_path, max_new_tokens=4, num_draft_tokens=1)


def test_family_choice_lives_in_the_registry(tmp_path):
    """The base knows no family: from_pretrained on it says where the family is chosen; a
    model_type with no paged runner is refused by name."""
    tiny_gpt2().save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(TypeError, match="paged_runner_from_pretrained"):
        PagedRunnerBase.from_pretrained(tmp_path, max_new_tokens=4, num_draft_tokens=1)
    config = tmp_path / "config.json"
    config.write_text(config.read_text().replace('"model_type": "gpt2"', '"model_type": "gpt_neo"'))
    with pytest.raises(ValueError, match="model_type 'gpt_neo' is not one of"):
        paged_runner_from_pretrained(tmp_path, max_new_tokens=4, num_draft_tokens=1)
