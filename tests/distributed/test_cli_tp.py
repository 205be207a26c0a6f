"""`generate --tp N` (specdec_fast/cli_tp.py): a wrong --tp is one line before anything loads; under
torchrun (slow: two ranks' imports), rank 0 prints the completion a single process prints and
the other rank prints nothing."""
import argparse
import os
import subprocess
import sys

import pytest

from specdec_fast import cli
from specdec_fast.cli_errors import CliError
from specdec_fast.cli_tp import add_tp_flags, check_tp_args
from specdec_fast.pair import demo_pair


def _args(*flags):
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft")
    ap.add_argument("--prompt-lookup", type=int)
    add_tp_flags(ap)
    return ap.parse_args(list(flags))


@pytest.mark.parametrize("flags, environ, line", [
    (["--tp", "2"], {}, "--tp 2 runs one process per rank under torchrun: torchrun --nproc-per-node 2"),
    (["--tp", "4"], {"WORLD_SIZE": "2"}, "mismatched world sizes: --tp 4 but torchrun started 2 processes"),
    (["--tp", "0"], {"WORLD_SIZE": "1"}, "--tp must be >= 1, got 0"),
    (["--tp-draft", "sharded"], {}, "--tp-draft goes with --tp N"),
    (["--tp", "2", "--tp-draft", "sharded"], {"WORLD_SIZE": "2"}, "--tp-draft sharded needs --draft"),
    (["--tp", "2", "--tp-draft", "sharded", "--prompt-lookup", "3"], {"WORLD_SIZE": "2"}, "--tp-draft sharded needs --draft"),
    (["--tp", "2", "--tp-timeout", "0"], {"WORLD_SIZE": "2"}, "--tp-timeout must be > 0 seconds"),
])
def test_a_wrong_tp_is_one_line(flags, environ, line):
    with pytest.raises(CliError, match=line.replace("+", r"\+")):
        check_tp_args(_args(*flags), environ)
    check_tp_args(_args("--tp", "2", "--draft", "d"), {"WORLD_SIZE": "2"})  # the right one passes


def test_the_cli_refuses_tp_without_torchrun(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    target, draft = demo_pair()
    code = cli.main(["generate", "--target", target, "--draft", draft, "--tp", "2", "--prompt", "x"])
    assert code == 2
    assert capsys.readouterr().err.strip().startswith("specdec-fast: error: --tp 2 runs one process per rank under torchrun")


def test_more_ranks_than_gpus_is_one_line(capsys, monkeypatch):
    """torchrun --nproc-per-node 2 on a machine with one GPU: one line naming the fix (before: rank 1
    died in torch.cuda.set_device with "invalid device ordinal" and torchrun's report of it)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("set_device reached"))
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    target, draft = demo_pair()
    code = cli.main(["generate", "--target", target, "--draft", draft, "--tp", "2", "--prompt", "x"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "specdec-fast: error: --tp 2: 2 ranks on this machine need a GPU each, and it has 1; start at most 1 per "
        "machine, or run the ranks on the CPU with --device cpu")


@pytest.mark.slow  # ~15 s on the 2-core box: torchrun and two ranks' imports, then the call in this process
@pytest.mark.parametrize("drafter", ["draft", "head"])
def test_torchrun_two_ranks_print_what_one_process_prints(drafter, capsys):
    """With a draft model, and with the demo pair's EAGLE-3 head (each rank runs it whole on the
    hidden states its sharded target captures; the embedding it reads gathered from the ranks).
    The single process is this one (cli.main: one process's imports fewer than a subprocess)."""
    import torch

    from importlib.resources import files

    target, draft = demo_pair()
    drafting = ["--draft", draft] if drafter == "draft" else ["--draft-head", str(files("specdec_fast") / "assets/pair/eagle3")]
    common = ["generate", "--target", target, *drafting, "--prompt", "def binary_search(a, x):",
              "--max-new-tokens", "24", "--temperature", "0.8", "--seed", "3", "--threads", "1", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "-m", "specdec_fast"]
    run = subprocess.run(torchrun + common + ["--tp", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    threads = torch.get_num_threads()
    capsys.readouterr()
    try:
        assert cli.main(common) == 0  # --threads 1, as each rank
    finally:
        torch.set_num_threads(threads)
    completion = capsys.readouterr().out.split("\n--- stats")[0]
    assert completion.strip(), "the single process printed no completion"
    assert run.stdout.count(completion) == 1, "rank 0 prints the single process's completion, rank 1 nothing"
    assert f"tensor parallel over 2 ranks, {drafter} replicated" in run.stdout


@pytest.mark.slow  # ~15 s on the 2-core box: torchrun and two ranks' imports, then the call in this process
def test_torchrun_two_ranks_draft_with_the_mtp_layer_in_slices(tmp_path, capsys, monkeypatch):
    """--mtp --tp 2 on a GLM-4.5 checkpoint with its MTP layer: each rank reads its slices of the layer
    (heads/mtp.MtpLayerSlices) and rank 0 prints the completion one process prints (sampled, seeded)."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.engine.models import VOCAB
    from tests.engine.mtp_models import LAYERS, glm_with_mtp

    path = tmp_path / "glm"
    glm_with_mtp(path)
    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, VOCAB)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>").save_pretrained(path)
    common = ["generate", "--target", str(path), "--mtp", "--k", "2", "--prompt", "w5 w9 w5 w9", "--max-new-tokens", "16",
              "--temperature", "0.8", "--seed", "3", "--threads", "1", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "specdec_fast"]
    run = subprocess.run(torchrun + common + ["--tp", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    # the single process reads the whole layer through transformers' MtpModel, which finds it by the
    # class's patterns (GLM-4.5's layers 46 / 92): this checkpoint's layer
    monkeypatch.setattr(tf.Glm4MoeForCausalLM, "_keys_to_ignore_on_load_unexpected", [rf"model\.layers\.{LAYERS}\..*"])
    threads = torch.get_num_threads()
    capsys.readouterr()
    try:
        assert cli.main(common) == 0
    finally:
        torch.set_num_threads(threads)
    completion = capsys.readouterr().out.split("\n--- stats")[0]
    assert completion.strip(), "the single process printed no completion"
    assert run.stdout.count(completion) == 1, (run.stdout, completion)
    assert "tensor parallel over 2 ranks, mtp layer in slices" in run.stdout
