"""bench/bench_mla.py --smoke: the GPU mode's code on the CPU (tiny shapes; the MLA kernel interpreted),
so the device run is not broken on arrival: every row's output equals SDPA's over the dense latents."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_mla  # noqa: E402


def test_smoke_rows(tmp_path):
    out = tmp_path / "mla_smoke.json"
    assert bench_mla.main(["--smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["device"] == "cpu (smoke)" and report["not_run"] == []
    assert len(rows) == len(bench_mla.SMOKE["batches"]) * len(bench_mla.SMOKE["lengths"]) * len(bench_mla.SMOKE["queries"])
    for row in rows:
        assert row["max_abs_diff"] < 1e-4 and row["us"] > 0 and row["sdpa_dense_us"] > 0 and row["latent_GBps"] > 0
        if row["backend"] == "triton":  # each tile of the sweep timed and checked (interpreted here)
            assert list(row["tiles"]) == ["x".join(map(str, t)) for t in bench_mla.SMOKE["tiles"]]


def test_smoke_needs_an_out_path():
    with pytest.raises(SystemExit, match="--smoke needs --out"):
        bench_mla.main(["--smoke"])
