"""bench/bench_options.py --sets (run_gpu.sh `options` runs it on a GPU with --device cuda): the
chosen option sets and "none" are timed in both modes (here with the tree, on CPU), and a name it
does not know is refused naming the ones it does."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_options  # noqa: E402


@pytest.mark.slow  # four generate calls a set on the demo pair, plus transformers' (~5 s)
def test_the_chosen_sets_are_timed_beside_none(tmp_path):
    out = tmp_path / "options_tree.json"
    bench_options.main(["--tree", "--sets", "repetition_penalty=1.05", "--rounds", "1", "--new-tokens", "4",
                        "--prompts", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["tree"] is True and report["k"] is None and "CPU" in report["models"]
    rows = {(row["mode"], row["options"]): row for row in report["rows"]}
    assert set(rows) == {(mode, name) for mode in ("greedy", "sampling") for name in ("none", "repetition_penalty=1.05")}
    assert all(row["tokens_per_s"] > 0 for row in rows.values())
    assert all(rows[(mode, "none")]["ratio_to_none"] == 1 for mode in ("greedy", "sampling"))
    assert [row["options"] for row in report["transformers_greedy"]] == ["none"]


def test_an_unknown_set_is_refused_with_the_known_ones(capsys):
    with pytest.raises(SystemExit) as stop:
        bench_options.main(["--tree", "--sets", "repetition_penalty=1.05,guidance_scale=1.5", "--out", "/nonexistent"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "unknown ['guidance_scale=1.5']" in err and "with --tree" in err and "'repetition_penalty=1.05'" in err
