"""The command line on a tiny saved model pair with a word-level tokenizer (no hub)."""
import os
import subprocess
import sys

import pytest

from specdec_fast import cli

from .models import make_draft, make_model


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("pair")
    target = make_model("llama")
    target.generation_config.eos_token_id = None
    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, 128)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    target.save_pretrained(root / "target")
    make_draft(target, noise=0.1).save_pretrained(root / "draft")
    fast.save_pretrained(root / "tokenizer")
    return root


def test_generate_command(pair_dirs, capsys, device):
    """On the test device (on a GPU machine: CUDA, where this head_dim-12 model needs the Triton
    attention to take a non-power-of-2 head_dim, or the runner choice to avoid it)."""
    code = cli.main(["generate", "--target", str(pair_dirs / "target"), "--draft", str(pair_dirs / "draft"),
                     "--prompt", "w5 w9 w17 w5", "--max-new-tokens", "12", "--k", "3", "--plain", "--device", device])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("w5 w9 w17 w5 ")
    for word in ("tokens/s", "alpha", "predicted speedup", "measured speedup", "K = 3"):
        assert word in out


def test_python_dash_m_prompt_lookup(pair_dirs):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "specdec_fast", "generate", "--target", str(pair_dirs / "target"),
                          "--prompt-lookup", "3", "--prompt", "w5 w9 w5 w9", "--max-new-tokens", "8",
                          "--temperature", "0.8", "--top-k", "20", "--device", "cpu"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "generated tokens     8" in run.stdout


def test_demo_missing_gives_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "specdec_fast.demo", None)
    assert cli.main(["demo"]) == 2
    assert "demo is not available" in capsys.readouterr().err
