"""bench/bench_verify_latency.py on CPU under the interpreter (--smoke): the script runs every way on
a shape with several chunks a row, each gives the reference's tokens, and the JSON holds the
timings and their ratios to the defaults'."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_verify_latency  # noqa: E402


@pytest.mark.cpu_only  # the GPU mode's code on CPU tensors through the Triton interpreter
def test_smoke_rows_give_the_reference_tokens_every_way(tmp_path, monkeypatch):
    out = tmp_path / "verify_latency_smoke.json"
    ways = dict(bench_verify_latency.WAYS)
    # a way that fails (on a device: a compile error) is recorded and the others are measured
    monkeypatch.setitem(bench_verify_latency.WAYS, "broken", dict(no_such_override=1))
    bench_verify_latency.main(["--smoke", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu (smoke") and report["not_run"] == []
    assert [r["mode"] for r in report["rows"]] == list(bench_verify_latency.SMOKE_MODES)
    for row in report["rows"]:
        assert row["error_broken"].startswith("TypeError") and row["tokens_equal_reference_broken"] is False
        assert "verify_broken_us" not in row and "verify_broken_over_now" not in row
        for name in ways:
            assert row[f"tokens_equal_reference_{name}"] is True, (row["mode"], name)
            assert row[f"verify_{name}_us"] > 0 and row[f"sample_{name}_us"] > 0
        assert row["verify_search_tile1024_over_now"] == row["verify_search_tile1024_us"] / row["verify_now_us"]
