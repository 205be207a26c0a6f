"""The demo's own parts (argument checks, progress display, the plain-decoding baseline).
The speculative part needs specdec_fast.generate and is exercised by running the demo."""
import io

import pytest
import torch

pytest.importorskip("transformers")

from specdec_fast import demo  # noqa: E402
from specdec_fast.demo import (  # noqa: E402
    COUNT_WORDS, HEAD_METHOD, HEAD_PAYS, METHODS, ProgressCounter, comparison_table, method_labels, parse_args,
    run_demo, transformers_generate,
)
from specdec_fast.pair import eagle3_head_dir, held_out_prompts, load_demo_pair  # noqa: E402


def test_parse_args_defaults_and_overrides():
    args = parse_args([])
    assert (args.prompts, args.num_assistant_tokens, args.temperature, args.top_p) == (3, 4, 0.0, 1.0)
    args = parse_args(["--prompts", "2", "-k", "6", "--temperature", "0.8", "--top-p", "0.95", "--seed", "7"])
    assert (args.prompts, args.num_assistant_tokens, args.temperature, args.top_p, args.seed) == (2, 6, 0.8, 0.95, 7)


def test_the_head_is_shown_by_default_only_where_it_pays():
    """The fifth line (the shipped EAGLE-3 head) is on by default only when HEAD_PAYS records that
    it beats the draft model on the demo pair; --head / --no-head decide otherwise."""
    shipped = eagle3_head_dir() is not None
    assert parse_args([]).head is (HEAD_PAYS and shipped)
    assert parse_args(["--no-head"]).head is False
    if shipped:
        assert parse_args(["--head"]).head is True


def test_head_flag_without_a_shipped_head_is_an_error(monkeypatch, capsys):
    monkeypatch.setattr(demo, "eagle3_head_dir", lambda: None)
    assert parse_args([]).head is False
    with pytest.raises(SystemExit):
        parse_args(["--head"])
    assert "ships no EAGLE-3 head" in capsys.readouterr().err


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


@pytest.mark.slow  # 4 s with the C++ backend built; its first build on a 2-core box: 1-3 min
@pytest.mark.parametrize("flag", [None, "--head", "--no-head"])
def test_demo_runs_four_ways_side_by_side_with_whole_lines_only(capsys, flag):
    """The whole demo with stdout/stderr captured (not terminals): whole lines only, every timed
    phase announced at its start and end, the four methods in each table (five with the head:
    by default only where it pays, HEAD_PAYS), greedy outputs equal, no transformers loading bars."""
    if flag == "--head" and eagle3_head_dir() is None:
        pytest.skip("the pair ships no EAGLE-3 head")
    with_head = {None: HEAD_PAYS and eagle3_head_dir() is not None, "--head": True, "--no-head": False}[flag]
    threads = torch.get_num_threads()
    try:
        assert run_demo(["--prompts", "1", "--max-new-tokens", "6"] + ([flag] if flag else [])) == 0
    finally:
        torch.set_num_threads(threads)  # the demo sets 1 for this process
    captured = capsys.readouterr()
    assert "\r" not in captured.out and "\r" not in captured.err
    assert "Loading weights" not in captured.err
    labels = method_labels(4)
    for name in ("specdec_fast plain", "transformers generate", "transformers assisted"):
        assert f"  {labels[name]}: started\n" in captured.err
        assert "/6 tokens, done\n" in captured.err.split(f"  {labels[name]}: started\n", 1)[1]
    summary = captured.out.split("=== all 1 prompt(s)", 1)[1]
    methods = METHODS + ((HEAD_METHOD,) if with_head else ())  # the fifth line: the shipped EAGLE-3 head
    for name in methods:
        assert labels[name] in summary
    assert (labels[HEAD_METHOD] in captured.out) is with_head
    assert ("EAGLE-3 head, all prompts pooled" in summary) is with_head
    # where it does not pay, a line says why the head is left out and how to add it
    assert ("--head adds it" in captured.out) is (not with_head and not HEAD_PAYS and eagle3_head_dir() is not None)
    assert f"greedy output identical to transformers generate: yes, all {COUNT_WORDS[len(methods)]}" in captured.out
    assert "predicted speedup" in summary and "measured speedup" in summary


def test_comparison_table_gives_each_rate_and_the_speculative_speedup_over_it():
    tokens = dict.fromkeys(METHODS, 96)
    seconds = {"transformers generate": 0.5, "transformers assisted": 0.6, "specdec_fast plain": 0.2,
               "specdec_fast speculative": 0.25}
    lines = comparison_table(tokens, seconds, 4).splitlines()
    assert len(lines) == 5 and "tok/s" in lines[0]
    rows = dict(zip(METHODS, lines[1:]))
    assert "192.0" in rows["transformers generate"] and "2.00x as fast" in rows["transformers generate"]
    assert "2.40x as fast" in rows["transformers assisted"]
    assert "0.80x as fast" in rows["specdec_fast plain"]
    assert "384.0" in rows["specdec_fast speculative"] and "x as fast" not in rows["specdec_fast speculative"]
    with_head = comparison_table({**tokens, HEAD_METHOD: 96}, {**seconds, HEAD_METHOD: 0.125}, 4).splitlines()
    assert len(with_head) == 6 and "EAGLE-3 head (K = 4)" in with_head[5] and "0.50x as fast" in with_head[5]


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


def test_quiet_transformers_restores_the_users_settings():
    from transformers.utils import logging as hf_logging

    from specdec_fast._hf_output import quiet_transformers

    before = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    try:
        for bars in (True, False):
            hf_logging.set_verbosity_info()
            hf_logging.enable_progress_bar() if bars else hf_logging.disable_progress_bar()
            with quiet_transformers():
                assert not hf_logging.is_progress_bar_enabled()
                assert hf_logging.get_verbosity() == hf_logging.ERROR
            assert hf_logging.is_progress_bar_enabled() == bars
            assert hf_logging.get_verbosity() == hf_logging.INFO
    finally:
        hf_logging.set_verbosity(before[0])
        hf_logging.enable_progress_bar() if before[1] else hf_logging.disable_progress_bar()
