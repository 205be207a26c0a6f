"""The demo's own parts (argument checks, progress display, the plain-decoding baseline).
The speculative part needs specdec_fast.generate and is exercised by running the demo."""
import io

import pytest
import torch

pytest.importorskip("transformers")

from specdec_fast.demo import ProgressCounter, parse_args, run_demo, transformers_generate  # noqa: E402
from specdec_fast.pair import held_out_prompts, load_demo_pair  # noqa: E402


def test_parse_args_defaults_and_overrides():
    args = parse_args([])
    assert (args.prompts, args.num_assistant_tokens, args.temperature, args.top_p) == (3, 4, 0.0, 1.0)
    args = parse_args(["--prompts", "2", "-k", "6", "--temperature", "0.8", "--top-p", "0.95", "--seed", "7"])
    assert (args.prompts, args.num_assistant_tokens, args.temperature, args.top_p, args.seed) == (2, 6, 0.8, 0.95, 7)


@pytest.mark.parametrize("argv", [["--prompts", "0"], ["-k", "0"], ["--max-new-tokens", "0"],
                                  ["--temperature", "-1"], ["--top-p", "0"], ["--top-p", "1.5"], ["--top-k", "-2"], ["--threads", "-1"]])
def test_parse_args_rejects_bad_values(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_progress_counter_skips_the_prompt_and_counts_new_tokens():
    out = io.StringIO()
    counter = ProgressCounter("plain", 5, stream=out)
    counter.put(torch.tensor([[1, 2, 3]]))  # the prompt
    counter.put(torch.tensor([4]))
    counter.put(torch.tensor([5]))
    counter.end()
    assert counter.count == 2
    assert "plain: 2/5 tokens" in out.getvalue()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _run_phase(counter, new_tokens=3):
    counter.put(torch.tensor([[1, 2, 3]]))  # the prompt
    for token in range(new_tokens):
        counter.put(torch.tensor([token]))
    counter.end()


def test_progress_counter_on_a_terminal_rewrites_one_line():
    out = _Terminal()
    _run_phase(ProgressCounter("plain", 3, stream=out))
    text = out.getvalue()
    assert [f"plain: {n}/3 tokens" in text for n in (1, 2, 3)] == [True] * 3
    assert text.count("\r") >= 4 and "\n" not in text  # updates in place, the line cleared at the end


def test_progress_counter_off_a_terminal_writes_a_start_and_an_end_line():
    out = io.StringIO()  # like a CI log or a pipe: isatty() is False
    counter = ProgressCounter("plain", 3, stream=out)
    assert not counter.live
    _run_phase(counter)
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines() == ["  plain: started", "  plain: 3/3 tokens, done"]


def test_progress_counter_live_can_be_forced():
    out = io.StringIO()
    _run_phase(ProgressCounter("plain", 3, stream=out, live=True))
    assert "\r" in out.getvalue()


@pytest.mark.slow  # 2 s with the C++ backend built; its first build in a process: 25-40 s on a 2-core box
def test_demo_output_has_no_carriage_returns_off_a_terminal(capsys):
    """The whole demo with stdout/stderr captured (not terminals): whole lines only, every timed
    phase announced at its start and end."""
    threads = torch.get_num_threads()
    try:
        assert run_demo(["--prompts", "1", "--max-new-tokens", "6"]) == 0
    finally:
        torch.set_num_threads(threads)  # the demo sets 1 for this process
    captured = capsys.readouterr()
    assert "\r" not in captured.out and "\r" not in captured.err
    for label in ("plain decoding (target only)", "transformers generate (target only)"):
        assert f"  {label}: started\n" in captured.err
        assert f"/6 tokens, done\n" in captured.err.split(f"  {label}: started\n", 1)[1]
    assert "speculative vs plain" in captured.out


def test_transformers_generate_greedy_extends_the_prompt_deterministically():
    tokenizer, target, _ = load_demo_pair("cpu")
    args = parse_args(["--max-new-tokens", "8"])
    ids = tokenizer(held_out_prompts(1)[0], return_tensors="pt").input_ids
    out, seconds = transformers_generate(target, ids, args, tokenizer)
    again, _ = transformers_generate(target, ids, args, tokenizer)
    assert seconds > 0
    assert out.shape[0] == 1 and ids.shape[1] < out.shape[1] <= ids.shape[1] + 8
    assert torch.equal(out[:, : ids.shape[1]], ids)
    assert torch.equal(out, again)
    # greedy: each new token is the target's argmax given everything before it
    with torch.no_grad():
        logits = target(input_ids=out).logits
    assert torch.equal(logits[0, ids.shape[1] - 1 : -1].argmax(-1), out[0, ids.shape[1] :])
