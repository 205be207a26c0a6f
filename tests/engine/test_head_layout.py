"""Draft heads in their published layouts (heads/layout.py): EAGLE-3 checkpoints written as the
EAGLE repo names them (safetensors and a torch .bin; SGLang / vLLM's name variants), loaded to
the same head; clear errors for what does not fit; generate(draft_head=DIR) and the CLI's
--draft-head."""
import json

import pytest
import torch
import torch.nn.functional as F

import specdec_fast
from specdec_fast import cli, load_draft_head, save_draft_head

from .heads import random_head
from .models import left_padded_prompts, make_model

PUBLISHED = {  # the EAGLE repo's names (and shapes, for a head of width H, feature width 3 H_t, Vd)
    "fc.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
}


@pytest.fixture(scope="module")
def target():
    model = make_model("llama", layers=3)
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def head(target):
    return random_head(target, 24, ids=(1, 2, 3), std=0.2)


def _outputs(head, target):
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 128, (1, 6), generator=gen)
    feats = torch.randn(1, 6, head.fc.weight.shape[1], generator=gen)
    with torch.no_grad():
        return head(F.embedding(tokens, target.get_input_embeddings().weight), head.fc(feats))[0]


def test_save_writes_the_published_layout_and_loads_back(head, target, tmp_path):
    from safetensors.torch import load_file

    save_draft_head(head, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 24
    assert config["num_hidden_layers"] == 1 and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert set(weights) == PUBLISHED
    assert weights["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * 48  # (embedding ; feature)
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    loaded = load_draft_head(tmp_path)
    torch.testing.assert_close(_outputs(loaded, target), _outputs(head, target), atol=0, rtol=0)
    assert torch.equal(loaded.draft_to_target, head.draft_to_target) and torch.equal(loaded.t2d, head.t2d)


def test_a_torch_bin_with_sglang_vllm_names_loads(head, target, tmp_path):
    """pytorch_model.bin, 'model.' prefixes, 'layers.0.' for 'midlayer.', no t2d (derived from d2t),
    float16 storage (loaded in the dtype asked for)."""
    state = {}
    for name, tensor in head.state_dict().items():
        if name == "t2d":
            continue
        name = name.replace("midlayer.", "layers.0.")
        state["model." + name if name.startswith("layers.") else name] = tensor.half() if tensor.is_floating_point() else tensor
    torch.save(state, tmp_path / "pytorch_model.bin")
    config = head.config.to_dict()
    config.update(architectures=["LlamaForCausalLMEagle3"], torch_dtype="float16")
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert next(load_draft_head(tmp_path).parameters()).dtype == torch.float16
    loaded = load_draft_head(tmp_path, dtype=torch.float32)
    torch.testing.assert_close(_outputs(loaded, target), _outputs(head, target), atol=2e-2, rtol=2e-2)
    assert torch.equal(loaded.t2d, head.t2d)


def test_errors_name_what_does_not_fit(head, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_draft_head(tmp_path)
    save_draft_head(head, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match="name no draft head"):
        load_draft_head(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "draft_vocab_size": 30}))
    with pytest.raises(ValueError, match=r"shape \(24,?.*the config says \(30,?"):
        load_draft_head(tmp_path)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(tmp_path / "model.safetensors"))
    del weights["fc.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"missing \['fc.weight'\]"):
        load_draft_head(tmp_path)


def test_generate_and_cli_take_a_head_directory(head, target, tmp_path, capsys):
    save_draft_head(head, tmp_path / "head")
    ids, mask = left_padded_prompts([4, 2], seed=3)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0)
    out = specdec_fast.generate(target, ids, mask, draft_head=str(tmp_path / "head"), do_sample=False, max_new_tokens=6,
                                pad_token_id=0)
    assert torch.equal(out, expected)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, 128)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    target.save_pretrained(tmp_path / "target")
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>").save_pretrained(tmp_path / "target")
    code = cli.main(["generate", "--target", str(tmp_path / "target"), "--draft-head", str(tmp_path / "head"),
                     "--prompt", "w5 w9 w17", "--max-new-tokens", "8", "--k", "3", "--device", "cpu"])
    assert code == 0 and "K = 3" in capsys.readouterr().out
    code = cli.main(["generate", "--target", str(tmp_path / "target"), "--draft-head", str(tmp_path / "head"),
                     "--prompt", "w5 w9 w17", "--max-new-tokens", "8", "--k", "adaptive", "--device", "cpu"])
    assert code == 0 and "K schedule           adaptive: chosen" in capsys.readouterr().out  # an EAGLE-3 head's schedule
    code = cli.main(["generate", "--target", str(tmp_path / "target"), "--draft-head", str(tmp_path / "target"),
                     "--prompt", "w5", "--device", "cpu"])
    assert code == 2 and "--draft-head" in capsys.readouterr().err
