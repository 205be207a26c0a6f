"""bench/bench_mla_prefill.py --smoke: the CPU measurement's code at tiny widths, so that it runs: the
expanded and the absorbed prefill give the same logits."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_mla_prefill  # noqa: E402


def test_smoke_rows(tmp_path):
    out = tmp_path / "mla_prefill_smoke.json"
    assert bench_mla_prefill.main(["--smoke", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [row["tokens"] for row in rows] == list(bench_mla_prefill.SMOKE["lengths"])
    for row in rows:
        assert row["max_abs_diff"] < 1e-4 * max(1.0, row["logits_scale"]) and row["absorbed_ms"] > 0


def test_smoke_needs_an_out_path():
    with pytest.raises(SystemExit, match="--smoke needs --out"):
        bench_mla_prefill.main(["--smoke"])
