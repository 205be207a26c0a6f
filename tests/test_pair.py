"""The shipped demo pair: loads with transformers' Auto classes, is a GQA Llama pair of the
promised sizes, and has actually learned held-out Python (losses, draft/target agreement).

The floors below come from the shipped pair, with a margin: on the 256-token held-out snippet
the target's loss measured 4.12 nats/token, the draft's 4.69, greedy agreement 0.465
(bench/results/pair_training.json over 16k held-out tokens: 4.15, 4.93, alpha_greedy 0.40).
"""
import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specdec_fast.pair import demo_pair, held_out_modules, held_out_prompts, held_out_snippet, tokenizer_dir  # noqa: E402

VOCAB = 4096
SNIPPET_TOKENS = 256


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir())


@pytest.fixture(scope="module")
def models():
    target_dir, draft_dir = demo_pair()
    load = transformers.AutoModelForCausalLM.from_pretrained
    return load(target_dir).eval(), load(draft_dir).eval()


@pytest.fixture(scope="module")
def snippet_logits(tokenizer, models):
    """(ids [1, N], target logits [1, N, V], draft logits [1, N, V]) on held-out text."""
    ids = tokenizer(held_out_snippet(), return_tensors="pt").input_ids[:, :SNIPPET_TOKENS]
    with torch.no_grad():
        return ids, models[0](input_ids=ids).logits.float(), models[1](input_ids=ids).logits.float()


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()


def test_demo_pair_paths_are_directories_in_the_package():
    target_dir, draft_dir = demo_pair()
    assert isinstance(target_dir, str) and isinstance(draft_dir, str)
    package = Path(__file__).resolve().parent.parent / "specdec_fast"
    for folder in (target_dir, draft_dir, tokenizer_dir()):
        assert Path(folder).is_dir()
        assert "specdec_fast" in Path(folder).parts
    assert Path(target_dir).parent == Path(draft_dir).parent
    assert package.exists()


def test_each_model_directory_holds_the_shared_tokenizer(tokenizer):
    """Hugging Face's convention: AutoTokenizer.from_pretrained(model_dir) works on both (it
    failed with a misleading "You need to have sentencepiece or tiktoken installed")."""
    code = "def f(x):\n    return x\n"
    for folder in demo_pair():
        own = transformers.AutoTokenizer.from_pretrained(folder)
        assert own.get_vocab() == tokenizer.get_vocab()
        assert own.eos_token_id == own.pad_token_id == tokenizer.eos_token_id
        assert own(code).input_ids == tokenizer(code).input_ids


def test_tokenizer_loads_and_round_trips_code(tokenizer):
    assert len(tokenizer) == VOCAB
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    code = "def f(x):\n    return {'a': x ** 2}  # ünïcode, tabs\t and  spaces\n"
    ids = tokenizer(code, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == code
    assert len(ids) < len(code.encode()) / 2, "BPE should merge common code fragments"


def test_models_are_gqa_llamas_sharing_the_tokenizer(models, tokenizer):
    for model in models:
        config = model.config
        assert config.model_type == "llama"
        assert config.num_key_value_heads < config.num_attention_heads
        assert config.num_attention_heads % config.num_key_value_heads == 0
        assert config.vocab_size == VOCAB == len(tokenizer)
        assert config.eos_token_id == tokenizer.eos_token_id
        assert next(model.parameters()).dtype == torch.float32


def test_draft_is_about_ten_times_smaller(models):
    def non_embedding(model):
        total = sum(p.numel() for p in model.parameters())
        return total - model.get_input_embeddings().weight.numel()

    target, draft = models
    ratio = non_embedding(target) / non_embedding(draft)
    assert 5 <= ratio <= 20, ratio


def test_shipped_pair_fits_in_40_mb():
    root = Path(demo_pair()[0]).parent
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert size < 40 * 2**20, size


def test_target_beats_draft_on_held_out_code(snippet_logits):
    ids, target_logits, draft_logits = snippet_logits
    target_loss, draft_loss = _loss(target_logits, ids), _loss(draft_logits, ids)
    # The draft is distilled from the target: close behind it (4.24 vs 4.15 nats on all held-out text).
    assert target_loss < draft_loss, (target_loss, draft_loss)
    assert target_loss < 0.55 * math.log(VOCAB), target_loss  # uniform guessing = log(4096) = 8.3 nats


def test_draft_and_target_greedy_choices_agree_often(snippet_logits):
    _, target_logits, draft_logits = snippet_logits
    agreement = (target_logits.argmax(-1) == draft_logits.argmax(-1)).float().mean().item()
    assert agreement > 0.6, agreement  # alpha (greedy) = 0.72 on all held-out text


def test_held_out_prompts():
    prompts = held_out_prompts(3)
    assert len(prompts) == 3 and all(isinstance(p, str) and p.strip() for p in prompts)
    assert held_out_prompts(3) == held_out_prompts()[:3]
    assert len(held_out_prompts()) == len(held_out_modules()) >= 10
    assert held_out_prompts(0) == []
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n must be"):
            held_out_prompts(bad)


def test_prompts_come_from_the_held_out_modules_of_this_interpreter():
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    checked = 0
    for module, prompt in zip(held_out_modules(), held_out_prompts()):
        source = stdlib / module
        if source.is_file() and prompt in source.read_text(encoding="utf-8"):
            checked += 1
    if checked == 0:
        pytest.skip("this interpreter's stdlib differs from the one the pair was built from")
    assert checked >= len(held_out_modules()) // 2
