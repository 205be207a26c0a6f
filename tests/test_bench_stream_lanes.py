"""bench/bench_stream_lanes.py --quick (run_gpu.sh `limits`: issue 25's B = 64 roofline rows, every
streaming variant) on CPU under the interpreter (--smoke): the script runs, every variant gives the
reference's tokens, and bench/issue25_report.py reads the JSON it writes."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_stream_lanes  # noqa: E402
import issue25_report  # noqa: E402


@pytest.mark.cpu_only  # the GPU mode's code on CPU tensors through the Triton interpreter; on a GPU machine
# (compiled Triton, no CPU tensors) bench/run_gpu.sh runs the real mode
def test_quick_smoke_rows_feed_the_report(tmp_path):
    out = tmp_path / "stream_lanes_smoke.json"
    bench_stream_lanes.main(["--smoke", "--quick", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu (smoke") and report["not_run"] == []
    rows = report["rows"]
    assert [r["mode"] for r in rows] == list(bench_stream_lanes.QUICK_MODES)
    for row in rows:
        for name in bench_stream_lanes.VARIANTS:
            if row["mode"] not in bench_stream_lanes.ONLY_MODES.get(name, (row["mode"],)):
                assert f"verify_{name}" not in row, (row["mode"], name)  # the sums pinned on / off: greedy rows only
                continue
            assert row[f"tokens_equal_reference_{name}"] is True, (row["mode"], name)
            assert row[f"verify_{name}"]["median_us"] > 0 and row[f"sample_{name}"]["median_us"] > 0
    assert "verify_lanes_argmax_only" in rows[0] and "verify_block_sums" in rows[0] and rows[0]["mode"] == "greedy"
    lever = issue25_report.argmax_lever(report)  # the smoke's times are no measurement: the ratios' keys only
    assert set(lever["ratios"]) == {f"B=2 V=600 greedy {loop} {call}" for loop in ("lanes", "block_loop")
                                    for call in ("verify", "sample")}
    # the plan's blocks a step for the "lanes" variant, recorded on greedy rows (the smoke's shape: one lane of
    # one 1024-value block under the interpreter's tiles, one block a step)
    assert (rows[0]["planned_unroll_verify"], rows[0]["planned_unroll_sample"]) == (1, 1)
    assert "planned_unroll_verify" not in rows[1]
    variants = issue25_report.stream_variants(report)
    assert [v["row"] for v in variants] == [f"B=2 V=600 {mode}" for mode in bench_stream_lanes.QUICK_MODES]
    assert all(v["best"] in bench_stream_lanes.VARIANTS for v in variants)


@pytest.mark.cpu_only
def test_greedy_batches_time_greedy_rows_alone(tmp_path):
    """--greedy-batches (run_gpu.sh's stream_lanes_greedy: the argmax-only stream's blocks a step at more lane
    lengths): greedy rows only, each recording the plan's blocks a step; the report's rule lever reads them."""
    out = tmp_path / "stream_lanes_greedy_smoke.json"
    bench_stream_lanes.main(["--smoke", "--greedy-batches", "16", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["greedy"] and "planned_unroll_sample" in rows[0]
    assert rows[0]["tokens_equal_reference_lanes_argmax_only_unroll4"] is True
    assert issue25_report.argmax_unroll_rule_lever({"rows": rows})["advice"] == "unmeasured"  # one block a step here
