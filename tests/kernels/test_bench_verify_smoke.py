"""bench/bench_verify.py --smoke: the GPU table's code (every sampling mode, every column we can
run without a GPU) on tiny shapes under the Triton interpreter, so that the script the next GPU
session runs unattended (bench/run_gpu.sh) is not broken on arrival."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.cpu_only  # the GPU mode's code on CPU tensors through the Triton interpreter; on a GPU machine
# (compiled Triton, no CPU tensors) bench/run_gpu.sh runs the real mode
@pytest.mark.slow
def test_bench_verify_smoke_writes_the_table(tmp_path):
    out = tmp_path / "verify_smoke.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = str(ROOT / "bench" / "bench_verify.py")  # with the suite's interpreter speedup: tests/run_interpreted.py
    done = subprocess.run([sys.executable, "-m", "tests.run_interpreted", script, "--smoke", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu")
    rows = report["results"]
    assert {row["mode"] for row in rows} == {"greedy", "T=1", "top_k=50", "top_k=1000", "top_p=0.9", "min_p=0.1",
                                             "top_k=50+top_p=0.9"}
    assert any(row["plan"]["large_vocab_path"] for row in rows) or any(row["V"] == 600 for row in rows)
    for row in rows:
        assert row["tokens_equal_reference"] and row["sample_equal_reference"] and row["workspace_tokens_equal"], row
        assert row["launches"]["verify"] == row["launches"]["verify_zero_fill"] - 1  # the workspace: no fill
        unknown = {"triton_modes_unknown"} if row["mode"] in ("greedy", "T=1") else set()  # launches left out
        # greedy: also the engine's call without draft logits (5 of 9 distributions at K = 4)
        engine = {"triton_no_draft_logits"} if row["mode"] == "greedy" else set()
        assert row.get("no_draft_logits_tokens_equal_reference", True) is True, row
        assert ("no_draft_logits_tokens_equal_reference" in row) == bool(engine)
        for table in ("verify", "sample"):
            assert set(row[table]) == {"triton", "triton_zero_fill", "reference", "torch"} | unknown | (
                engine if table == "verify" else set())
            assert all(entry["median_us"] > 0 for entry in row[table].values()), row[table]
    assert any(row["threshold_routes"] for row in rows if row["V"] == 600)


def test_bench_verify_penalties_runs_on_tiny_shapes():
    """bench_verify.py --penalties' code (C++ with and without penalties) on one tiny shape."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_verify import run_penalties
    from tests.kernels.backends import cpp_tested

    if not cpp_tested():
        pytest.skip("the C++ backend is not tested here")
    report = run_penalties(None, shapes=[(2, 2, 300)], budget_s=0.01)
    assert len(report["results"]) == 3 and report["gpu"].startswith("not measured")
    for row in report["results"]:
        assert row["verify+penalties"]["median_ms"] > 0 and row["sample_penalties_over_plain"] > 0
