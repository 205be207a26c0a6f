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


def test_k_adaptive_runs_the_schedule(pair_dirs, capsys):
    """--k adaptive: the engine chooses K before each iteration (num_assistant_tokens_schedule="adaptive"); greedy
    tokens do not depend on K, so the completion equals a constant K's; the stats name the schedule."""
    argv = ["generate", "--target", str(pair_dirs / "target"), "--draft", str(pair_dirs / "draft"), "--prompt",
            "w5 w9 w17 w5", "--max-new-tokens", "12", "--device", "cpu"]
    assert cli.main(argv + ["--k", "adaptive"]) == 0
    adaptive = capsys.readouterr().out
    assert cli.main(argv + ["--k", "3"]) == 0
    constant = capsys.readouterr().out
    assert adaptive.split("\n")[0] == constant.split("\n")[0] and "K schedule           adaptive: chosen" in adaptive
    with pytest.raises(SystemExit):  # argparse's own error
        cli.main(argv + ["--k", "many"])
    assert "argument --k: expected an int or 'adaptive', got 'many'" in capsys.readouterr().err
    lookup = ["generate", "--target", str(pair_dirs / "target"), "--prompt-lookup", "3", "--prompt", "w5", "--k", "adaptive"]
    for extra, why in (([], "prompt lookup drafts its --prompt-lookup N tokens"),
                       (["--prompt-lookup", "0"], "without one the CLI decodes plainly, with no K")):
        assert cli.main(lookup + extra) == 2
        assert capsys.readouterr().err.strip() == ("specdec-fast: error: --k adaptive chooses the K of a draft model "
                                                   "(--draft, --early-exit), an EAGLE-3 head or a DFlash block drafter "
                                                   "(--draft-head) or an MTP layer (--mtp); " + why)


def test_tree_drafts_a_token_tree(pair_dirs, capsys):
    """--tree [N|static|dynamic]: generate(tree=...); greedy tokens do not depend on the drafting, so
    every tree's completion equals the chain's, and the stats name the tree that ran (its node count,
    dynamic or not)."""
    argv = ["generate", "--target", str(pair_dirs / "target"), "--draft", str(pair_dirs / "draft"), "--prompt",
            "w5 w9 w17 w5", "--max-new-tokens", "12", "--device", "cpu"]
    assert cli.main(argv + ["--k", "3"]) == 0
    chain = capsys.readouterr().out.split("\n")[0]
    for extra, named in (([], "(a tree of 32 nodes, dynamic, depth 8"), (["12"], "(a tree of 12 nodes, dynamic,"),
                         (["static"], "(a tree of 32 nodes, depth 8"), (["dynamic"], "(a tree of 32 nodes, dynamic,")):
        assert cli.main(argv + ["--tree", *extra]) == 0, extra
        out = capsys.readouterr().out
        assert out.split("\n")[0] == chain and named in out, (extra, out)
    for extra, line in ((["--k", "3"], "--tree sets the drafts by its shape; not with --k"),
                        (["65"], "--tree N must be in [2, 64] (nodes, the root included), got 65")):
        assert cli.main(argv + ["--tree", *extra]) == 2
        assert capsys.readouterr().err.strip() == f"specdec-fast: error: {line}"
    lookup = ["generate", "--target", str(pair_dirs / "target"), "--prompt-lookup", "3", "--prompt", "w5", "--tree"]
    assert cli.main(lookup) == 2
    assert capsys.readouterr().err.strip() == ("specdec-fast: error: --tree needs a drafter that expands the tree: "
                                               "--draft, --early-exit, an EAGLE-3 --draft-head or --mtp")
    with pytest.raises(SystemExit):  # argparse's own error
        cli.main(argv + ["--tree", "wide"])
    assert "argument --tree: expected a node count, 'static' or 'dynamic', got 'wide'" in capsys.readouterr().err


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


def test_plain_times_warm_calls(pair_dirs, capsys, monkeypatch):
    """--plain: the measured speedup is a ratio of two warm calls. Each configuration (plain, then
    speculative) is called once untimed with the same prompt before either timed call, so the
    first timed call does not pay the kernels' compilation for both (the demo's rule)."""
    import specdec_fast.api as api

    calls = []
    real = api.generate

    def spy(model, ids, *args, **kwargs):
        calls.append(("draft" if "assistant_model" in kwargs else "plain", kwargs["max_new_tokens"], ids.tolist()))
        return real(model, ids, *args, **kwargs)

    monkeypatch.setattr(api, "generate", spy)
    code = cli.main(["generate", "--target", str(pair_dirs / "target"), "--draft", str(pair_dirs / "draft"),
                     "--prompt", "w5 w9 w17 w5", "--max-new-tokens", "9", "--k", "3", "--plain", "--device", "cpu",
                     "--threads", "1"])
    assert code == 0 and "measured speedup" in capsys.readouterr().out
    assert [(kind, n) for kind, n, _ in calls] == [("plain", 2), ("draft", 2), ("plain", 9), ("draft", 9)]
    assert all(ids == calls[0][2] for _, _, ids in calls)


def test_a_reader_that_goes_away_gets_no_traceback(pair_dirs):
    """`specdec-fast generate ... | head`: the reader closes the pipe before the output comes; the
    command stops without a BrokenPipeError traceback (nor the one Python's exit flush would add)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "specdec_fast", "generate", "--target", str(pair_dirs / "target"),
                             "--prompt-lookup", "3", "--prompt", "w5 w9 w5 w9", "--max-new-tokens", "8",
                             "--device", "cpu", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    proc.stdout.close()  # before anything is written: the first print meets a closed pipe
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err and "BrokenPipeError" not in err, err


def test_early_exit_drafts_with_the_target_s_first_layers(pair_dirs, capsys):
    """--early-exit N (assistant_early_exit): the completion is the target's greedy one, as
    model.generate decodes it; --early-exit 0 is refused in one line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    code = cli.main(["generate", "--target", str(pair_dirs / "target"), "--early-exit", "1", "--prompt",
                     "w5 w9 w17 w5", "--max-new-tokens", "10", "--k", "3", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0 and "K = 3" in out
    tok = AutoTokenizer.from_pretrained(pair_dirs / "target")
    target = AutoModelForCausalLM.from_pretrained(pair_dirs / "target")
    ids = tok("w5 w9 w17 w5", return_tensors="pt").input_ids
    expected = tok.decode(target.generate(ids, do_sample=False, max_new_tokens=10, pad_token_id=0)[0],
                          skip_special_tokens=True)
    assert out.splitlines()[0] == expected
    capsys.readouterr()  # transformers' loading bars above
    assert cli.main(["generate", "--target", str(pair_dirs / "target"), "--early-exit", "0", "--prompt", "w5"]) == 2
    assert capsys.readouterr().err.strip() == "specdec-fast: error: --early-exit must be >= 1, got 0"


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
    (["--prompt-lookup", "3"], "give one of --draft, --draft-head, --prompt-lookup, --early-exit and --mtp"),
    (["--early-exit", "1"], "give one of --draft, --draft-head, --prompt-lookup, --early-exit and --mtp"),
    (["--draft", "{root}/draft_other_vocab"],
     "vocab mismatch: the target has vocab_size 128 (128 output rows), the draft (assistant_model) has 130 (130); "
     "speculative decoding needs one shared vocabulary, or pass both tokenizer= (the target's) and assistant_tokenizer= "
     "(the draft's) to draft across tokenizers"),
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


# --- data sets: --prompts FILE.jsonl --output OUT.jsonl (specdec_fast/cli_dataset.py) ---

import json  # noqa: E402


def _jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _dataset(pair_dirs, prompts, output, *extra):
    return ["generate", "--target", str(pair_dirs / "target"), "--draft", str(pair_dirs / "draft"), "--prompts",
            str(prompts), "--output", str(output), "--max-new-tokens", "6", "--k", "3", "--device", "cpu", *extra]


def _rows(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


GOOD = [json.dumps({"id": i, "prompt": p}) for i, p in enumerate(["w5 w9 w17 w5", "w3 w4", "w8 w8 w8 w8 w8", "w60", "w7 w9"])]


def test_a_data_set_in_batches(pair_dirs, tmp_path, capsys):
    prompts = _jsonl(tmp_path / "in.jsonl", GOOD[:2] + [""] + GOOD[2:])  # a blank line is no row
    out = tmp_path / "out.jsonl"
    assert cli.main(_dataset(pair_dirs, prompts, out, "--batch-size", "2", "--dtype", "float32")) == 0
    rows = _rows(out)
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4] and [r["line"] for r in rows] == [1, 2, 4, 5, 6]
    for row in rows:
        assert row["prompt"] == json.loads(GOOD[row["id"]])["prompt"]
        assert 1 <= row["new_tokens"] <= 6 and row["prompt_tokens"] == len(row["prompt"].split())
        assert row["completion"].split() and all(w.startswith("w") for w in row["completion"].split())
        assert 1 <= row["mean_accepted_length"] <= 4 and 0 <= row["acceptance"] <= 1
        assert row["time_s"] > 0 and row["tokens_per_s"] > 0 and row["batch_rows"] == (1 if row["id"] == 4 else 2)
    captured = capsys.readouterr()
    progress = [line for line in captured.err.splitlines() if line.startswith("specdec-fast: rows")]
    assert [line.split(",")[0] for line in progress] == ["specdec-fast: rows 2/5", "specdec-fast: rows 4/5",
                                                          "specdec-fast: rows 5/5"]
    assert "tokens/s, acceptance 0." in progress[-1]
    assert captured.out.startswith(f"wrote 5 row(s) to {out}; ")


def test_a_data_set_row_completes_as_the_single_prompt_does(pair_dirs, tmp_path, capsys):
    prompts = _jsonl(tmp_path / "in.jsonl", GOOD[:1])
    out = tmp_path / "out.jsonl"
    assert cli.main(_dataset(pair_dirs, prompts, out, "--batch-size", "1")) == 0
    capsys.readouterr()
    single = ["generate", "--target", str(pair_dirs / "target"), "--draft", str(pair_dirs / "draft"), "--prompt",
              "w5 w9 w17 w5", "--max-new-tokens", "6", "--k", "3", "--device", "cpu"]
    assert cli.main(single) == 0
    text = capsys.readouterr().out.splitlines()[0]
    assert text == "w5 w9 w17 w5 " + _rows(out)[0]["completion"]


BAD_LINES = ["not json", json.dumps(["w5"]), json.dumps({"text": "w5"}), json.dumps({"prompt": 5}),
             json.dumps({"prompt": ""})]
BAD_REASONS = ["not JSON (Expecting value: line 1 column 1 (char 0))", "not a JSON object (a list)", 'no "prompt" field',
               '"prompt" is not a string (a int)', '"prompt" is empty']


def test_bad_lines_fail_by_line_number_before_any_model_work(pair_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    for bad, reason in zip(BAD_LINES, BAD_REASONS):
        prompts = _jsonl(tmp_path / "in.jsonl", GOOD[:2] + [bad] + GOOD[2:])
        out = tmp_path / "out.jsonl"
        assert cli.main(_dataset(pair_dirs, prompts, out)) == 2
        captured = capsys.readouterr()
        assert captured.err.splitlines() == [f"specdec-fast: error: {prompts}:3: {reason}"]
        assert not out.exists()


def test_bad_lines_skipped_by_line_number(pair_dirs, tmp_path, capsys):
    prompts = _jsonl(tmp_path / "in.jsonl", [GOOD[0]] + BAD_LINES + [GOOD[1], "  "])
    out = tmp_path / "out.jsonl"
    assert cli.main(_dataset(pair_dirs, prompts, out, "--on-error", "skip", "--batch-size", "4")) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [f"specdec-fast: warning: {prompts}:{n}: {reason}; skipped"
                        for n, reason in zip(range(2, 7), BAD_REASONS)]
    assert [r["line"] for r in _rows(out)] == [1, 7]


def test_a_row_generate_refuses(pair_dirs, tmp_path, capsys):
    """A prompt too long for the model (256 positions): under skip the batch's rows run alone and only
    that one is dropped; under fail the run ends naming the batch's lines, the finished batch kept."""
    long = json.dumps({"prompt": " ".join(["w5"] * 260)})
    prompts = _jsonl(tmp_path / "in.jsonl", GOOD[:2] + [GOOD[2], long])
    out = tmp_path / "out.jsonl"
    assert cli.main(_dataset(pair_dirs, prompts, out, "--on-error", "skip", "--batch-size", "2")) == 0
    captured = capsys.readouterr()
    assert [r["line"] for r in _rows(out)] == [1, 2, 3]
    assert f"specdec-fast: warning: {prompts}:4: prompt (260 tokens) + max_new_tokens (6) exceeds" in captured.err
    assert "(1 refused by generate, skipped)" in captured.out
    assert cli.main(_dataset(pair_dirs, prompts, out, "--batch-size", "2")) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("specdec-fast: rows")]
    assert len(err) == 1 and err[0].startswith(f"specdec-fast: error: {prompts}:3,4: prompt (260 tokens)")
    assert [r["line"] for r in _rows(out)] == [1, 2]


def test_finished_rows_survive_a_later_batch_that_raises(pair_dirs, tmp_path, monkeypatch):
    import specdec_fast.api as api

    real, calls = api.generate, []

    def failing(*args, **kwargs):  # call 1: the set-up check, 2: batch 1, 3: batch 2
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the device fell over")
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "generate", failing)
    prompts = _jsonl(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="fell over"):
        cli.main(_dataset(pair_dirs, prompts, out, "--batch-size", "2"))
    assert [r["id"] for r in _rows(out)] == [0, 1]


def test_chat_template(pair_dirs, tmp_path, capsys):
    prompts = _jsonl(tmp_path / "in.jsonl", GOOD[:1])
    out = tmp_path / "out.jsonl"
    assert cli.main(_dataset(pair_dirs, prompts, out, "--chat")) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"specdec-fast: error: --chat: the tokenizer ({pair_dirs / 'target'}) has no chat template"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pair_dirs / "target")
    tok.chat_template = "{% for m in messages %}w3 {{ m['content'] }} w4{% endfor %}{% if add_generation_prompt %} w6{% endif %}"
    tok.save_pretrained(tmp_path / "chat_tok")
    assert cli.main(_dataset(pair_dirs, prompts, out, "--chat", "--tokenizer", str(tmp_path / "chat_tok"))) == 0
    assert _rows(out)[0]["prompt_tokens"] == 4 + 3  # w3, the prompt's four words, w4, w6


def test_set_up_errors_end_a_data_set_run_whatever_on_error_says(pair_dirs, tmp_path, capsys):
    prompts = _jsonl(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "out.jsonl"
    argv = _dataset(pair_dirs, prompts, out, "--on-error", "skip", "--draft", str(pair_dirs / "draft_other_vocab"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("specdec-fast: error: vocab mismatch")


DATASET_FLAG_ERRORS = [
    (["--output", "{tmp}/o.jsonl", "--prompt", "w5"], "--output goes with --prompts FILE"),
    (["--prompts", "{tmp}/missing.jsonl", "--output", "{tmp}/o.jsonl"], "no such file: {tmp}/missing.jsonl (--prompts)"),
    (["--prompts", "{tmp}/in.jsonl"], "--prompts needs --output FILE (the JSONL results)"),
    (["--prompts", "{tmp}/in.jsonl", "--output", "{tmp}/nodir/o.jsonl"], "no such directory: {tmp}/nodir (--output)"),
    (["--prompts", "{tmp}/in.jsonl", "--output", "{tmp}/in.jsonl"], "--output must differ from --prompts"),
    (["--prompts", "{tmp}/in.jsonl", "--output", "{tmp}/o.jsonl", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--prompts", "{tmp}/in.jsonl", "--output", "{tmp}/o.jsonl", "--plain"],
     "--plain times a single --prompt; not with --prompts"),
]


@pytest.mark.parametrize("extra, line", DATASET_FLAG_ERRORS, ids=[e for _, e in DATASET_FLAG_ERRORS])
def test_data_set_flags(pair_dirs, tmp_path, capsys, extra, line):
    _jsonl(tmp_path / "in.jsonl", GOOD)
    extra = [arg.replace("{tmp}", str(tmp_path)) for arg in extra]
    assert cli.main(["generate", "--target", str(pair_dirs / "target"), *extra]) == 2
    assert capsys.readouterr().err.splitlines() == ["specdec-fast: error: " + line.replace("{tmp}", str(tmp_path))]


def test_the_progress_bar_on_a_terminal(capsys):
    """On a terminal: a tqdm bar whose postfix gives tokens/s and the acceptance so far (alpha: 23
    accepted of 27 examined)."""
    from types import SimpleNamespace

    from specdec_fast.cli_dataset import Progress, Totals

    totals = Totals()
    totals.add(SimpleNamespace(new_tokens=40, k=3, accepted_hist=[1, 1, 2, 6]), 0.5)
    bar = Progress(5, live=True)
    bar.update(2, totals)
    bar.close()
    err = capsys.readouterr().err
    assert "2/5" in err and "80.0 tokens/s, acceptance 0.85" in err


def test_generation_option_flags(pair_dirs, capsys):
    """--repetition-penalty, --min-new-tokens and --stop decode as model.generate with those options
    (the demo pair: transformers' StopStringCriteria needs a byte-level tokenizer, not the word-level
    one of the tiny pair); --num-return-sequences prints one completion each."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import specdec_fast

    target_dir, draft_dir = specdec_fast.demo_pair()
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    prompt = "def binary_search(a, x):"
    ids = torch.tensor([tok(prompt).input_ids])
    options = dict(max_new_tokens=24, do_sample=False, repetition_penalty=1.3, min_new_tokens=2)
    free = tok.decode(model.generate(ids, **options)[0, ids.shape[1]:])
    stop = free.split()[3]  # the 4th word of the free completion: the row ends where it is complete
    expected = model.generate(ids, **options, stop_strings=[stop], tokenizer=tok)
    code = cli.main(["generate", "--target", str(target_dir), "--draft", str(draft_dir), "--prompt", prompt,
                     "--max-new-tokens", "24", "--repetition-penalty", "1.3", "--min-new-tokens", "2", "--stop", stop,
                     "--device", "cpu", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0
    completion = out[: out.index("\n--- stats")].removesuffix("\n")  # print() ends the text with a newline
    assert completion == tok.decode(expected[0], skip_special_tokens=True) and completion.endswith(stop)
    code = cli.main(["generate", "--target", str(pair_dirs / "target"), "--prompt-lookup", "2", "--prompt", "w5 w9 w17 w5",
                     "--max-new-tokens", "6", "--temperature", "0.9", "--num-return-sequences", "3", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("--- completion ") == 3


@pytest.mark.parametrize("extra, line", [
    (["--num-return-sequences", "2"], "--num-return-sequences > 1 needs sampling (--temperature > 0): greedy gives one "
                                      "completion"),
    (["--repetition-penalty", "0"], "--repetition-penalty must be > 0 (1 = off), got 0.0"),
    (["--min-new-tokens", "-1"], "--min-new-tokens must be >= 0, got -1"),
])
def test_generation_option_flag_errors(pair_dirs, capsys, extra, line):
    code = cli.main(["generate", "--target", str(pair_dirs / "target"), "--prompt", "w5", *extra])
    assert code == 2 and capsys.readouterr().err.strip() == f"specdec-fast: error: {line}"
