"""bench/bench_delta_rule.py --smoke: the CPU measurement's code at tiny widths, so that it runs: both
rules give the same outputs (5 tokens: one chunk; 70: two, the last padded), and the Triton path's fused score
call gives the block's (interpreted)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_delta_rule  # noqa: E402


def test_smoke_rows(tmp_path):
    out = tmp_path / "delta_smoke.json"
    assert bench_delta_rule.main(["--smoke", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    smoke = bench_delta_rule.SMOKE
    assert [(row["call"], row["B"]) for row in rows] == [("prefill", 1)] * len(smoke["lengths"]) + [
        ("score", b) for b in smoke["batches"]]
    for row in rows:
        assert row["max_abs_diff"] < 1e-5 and row["steps_ms"] > 0
    if bench_delta_rule.triton_runs("cpu"):  # the Triton path's one launch, interpreted: the block's outputs
        assert all(row["fused_max_abs_diff"] < 1e-5 and row["fused_ms"] > 0 for row in rows if row["call"] == "score")
        # its prefill carry (kernels/chunk_scan), both precisions: the chunked torch loop's outputs
        assert all(row[f"{key}_max_abs_diff"] < 1e-5 and row[f"{key}_ms"] > 0 for row in rows if row["call"] == "prefill"
                   for key in ("fused", "fused_tf32"))


def test_smoke_needs_an_out_path():
    with pytest.raises(SystemExit, match="--smoke needs --out"):
        bench_delta_rule.main(["--smoke"])


def test_the_shared_mode_arguments(monkeypatch):
    """bench/bench_args.py, which the mode benchmarks share: --gpu without CUDA names the other modes, one mode only,
    and a device's run writes bench/results/<stem>_<device>.json."""
    import bench_args

    monkeypatch.setattr(bench_args.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"--gpu needs a CUDA device \(or --cpu or --smoke on the CPU\)"):
        bench_delta_rule.main(["--gpu"])
    with pytest.raises(SystemExit):
        bench_delta_rule.main(["--cpu", "--smoke", "--out", "x.json"])  # argparse: not allowed with
    assert bench_args.results_path(None, "mla", "NVIDIA H200 / x") == bench_args.ROOT / "bench/results/mla_NVIDIA_H200___x.json"
    assert str(bench_args.results_path("a.json", "mla", "cpu")) == "a.json"
