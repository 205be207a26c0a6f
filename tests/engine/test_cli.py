"""The command line on a tiny saved model pair with a word-level tokenizer (no hub): the happy
paths, and every wrong input ending in one line `specdec-fast: error: ...` with exit status 2."""
import os
import shutil
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
    make_model("llama", vocab=130).save_pretrained(root / "draft_other_vocab")
    for folder in ("target", "draft", "draft_other_vocab"):  # each model directory holds its tokenizer
        fast.save_pretrained(root / folder)
    # An older layout: a model directory without its tokenizer, the tokenizer in a folder beside it.
    shutil.copytree(root / "target", root / "legacy" / "target",
                    ignore=shutil.ignore_patterns("tokenizer*", "special_tokens*"))
    fast.save_pretrained(root / "legacy" / "tokenizer")
    (root / "empty").mkdir()
    return root


def test_generate_command(pair_dirs, capsys, device):
    """On the test device (on a GPU machine: CUDA, where this head_dim-12 model runs the Triton
    attention with its head dimension padded to 16)."""
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
                          "--temperature", "0.8", "--top-k", "20", "--device", "cpu", "--threads", "1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "generated tokens     8" in run.stdout
    assert "Loading weights" not in run.stderr and "\r" not in run.stderr  # transformers' loading bars stay quiet


def test_demo_missing_gives_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "specdec_fast.demo", None)
    assert cli.main(["demo"]) == 2
    assert "demo is not available" in capsys.readouterr().err


def test_tokenizer_from_a_folder_beside_the_target(pair_dirs, capsys):
    code = cli.main(["generate", "--target", str(pair_dirs / "legacy" / "target"), "--prompt", "w5 w9",
                     "--max-new-tokens", "2"])
    assert code == 0
    assert capsys.readouterr().out.startswith("w5 w9 ")


def _bad(pair_dirs, *extra):
    """argv of a generate call that is valid except for ``extra`` (later flags win)."""
    return ["generate", "--target", str(pair_dirs / "target"), "--draft", str(pair_dirs / "draft"), "--prompt", "w5 w9",
            "--max-new-tokens", "4", *extra]


BAD_INPUTS = [  # (extra argv, the one line expected on stderr; {root} = the pair's folder)
    (["--target", "/nonexistent/target"], "no such directory: /nonexistent/target (--target)"),
    (["--draft", "/nonexistent/draft"], "no such directory: /nonexistent/draft (--draft)"),
    (["--tokenizer", "/nonexistent/tok"], "no such directory: /nonexistent/tok (--tokenizer)"),
    (["--max-new-tokens", "-5"], "--max-new-tokens must be >= 1, got -5"),
    (["--k", "0"], "--k must be >= 1, got 0"),
    (["--temperature", "-1"], "--temperature must be >= 0 (0 = greedy), got -1.0"),
    (["--temperature", "nan"], "--temperature must be >= 0 (0 = greedy), got nan"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--min-p", "-0.1"], "--min-p must be in [0, 1], got -0.1"),
    (["--top-k", "-3"], "--top-k must be >= 0 (0 = off), got -3"),
    (["--threads", "-1"], "--threads must be >= 0 (0 = torch's default), got -1"),
    (["--prompt-lookup", "3"], "give --draft or --prompt-lookup, not both"),
    (["--draft", "{root}/draft_other_vocab"],
     "vocab mismatch: the target has vocab_size 128 (128 output rows), the draft (assistant_model) has 130 (130); "
     "speculative decoding needs one shared vocabulary"),
    (["--draft", "{root}/empty"], "could not load a model from {root}/empty (--draft): "),
    (["--target", "{root}/empty"], "no tokenizer in {root}/empty (the --target directory holds none of tokenizer.json, "
     "tokenizer_config.json, tokenizer.model, vocab.json, vocab.txt); pass --tokenizer DIR"),
    (["--tokenizer", "{root}/empty"], "no tokenizer in {root}/empty (--tokenizer holds none of tokenizer.json, "
     "tokenizer_config.json, tokenizer.model, vocab.json, vocab.txt)"),
]


@pytest.mark.parametrize("extra, line", BAD_INPUTS, ids=[" ".join(e) for e, _ in BAD_INPUTS])
def test_a_wrong_input_ends_in_one_line_and_exit_status_2(pair_dirs, capsys, extra, line):
    extra = [arg.replace("{root}", str(pair_dirs)) for arg in extra]
    code = cli.main(_bad(pair_dirs, *extra))
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    expected = "specdec-fast: error: " + line.replace("{root}", str(pair_dirs))
    if expected.endswith(": "):  # transformers' own reason follows: its wording is not ours to pin
        assert lines[0].startswith(expected) and len(lines[0]) > len(expected), lines[0]
    else:
        assert lines[0] == expected


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: 3-8 s
def test_the_process_exit_status_and_stderr_of_a_wrong_path(tmp_path):
    run = subprocess.run([sys.executable, "-m", "specdec_fast", "generate", "--target", str(tmp_path / "missing"),
                          "--prompt", "x"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines() == [f"specdec-fast: error: no such directory: {tmp_path / 'missing'} (--target)"]
