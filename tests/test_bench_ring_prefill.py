"""bench/bench_ring_prefill.py --smoke: the GPU mode's code on the CPU (a tiny windowed model), so
the device run is not broken on arrival: every ring row gives the rings-off row's logits and holds
less KV."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_ring_prefill  # noqa: E402


def test_smoke_rows(tmp_path):
    out = tmp_path / "ring_smoke.json"
    assert bench_ring_prefill.main(["--smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["device"] == "cpu (smoke)" and report["not_run"] == []
    assert [row["ring_chunk"] for row in rows] == [None, *bench_ring_prefill.SMOKE["chunks"]]
    assert rows[0]["ring_layers"] == 0 and rows[0]["prefill_ms"] > 0
    for row in rows[1:]:
        assert row["ring_layers"] == 2 and row["max_abs_diff"] < 1e-4 and 0 < row["kv_vs_whole"] < 1


def test_smoke_needs_an_out_path():
    with pytest.raises(SystemExit, match="--smoke needs --out"):
        bench_ring_prefill.main(["--smoke"])
