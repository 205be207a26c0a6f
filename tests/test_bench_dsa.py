"""bench/bench_dsa.py --smoke: the GPU mode's code on the CPU (tiny shapes, index_topk >= L: every key chosen),
so the device run is not broken on arrival: the sparse step's output equals the dense attention's."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_dsa  # noqa: E402


def test_smoke_rows(tmp_path):
    out = tmp_path / "dsa_smoke.json"
    assert bench_dsa.main(["--smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["device"] == "cpu (smoke)" and report["not_run"] == []
    smoke = bench_dsa.SMOKE
    assert len(rows) == len(smoke["batches"]) * len(smoke["lengths"]) * len(smoke["queries"])
    for row in rows:
        assert row["max_abs_diff"] < 1e-5 and min(row["sparse_us"], row["choose_us"], row["dense_us"]) > 0
