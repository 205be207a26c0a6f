"""bench/bench_mamba2.py --smoke: the script runs and its ways agree (tiny widths): the runners' Mamba2 prefill
equals transformers' mixer forward, a score call's block equals its tokens one call each."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_mamba2  # noqa: E402


def test_smoke_rows(tmp_path):
    out = tmp_path / "mamba2_smoke.json"
    assert bench_mamba2.main(["--smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    smoke = bench_mamba2.SMOKE
    assert report["device"] == "cpu (smoke)" and report["not_run"] == []
    assert [row["call"] for row in report["rows"]] == ["prefill"] * len(smoke["lengths"]) + ["score"] * len(smoke["batches"])
    assert all(row["max_abs_diff"] < 1e-5 for row in report["rows"])
    if bench_mamba2.triton_runs("cpu"):  # the Triton path's one launch, interpreted: the block's outputs
        assert all(row["fused_max_abs_diff"] < 1e-5 for row in report["rows"])  # score calls and prefills (chunk_scan)
