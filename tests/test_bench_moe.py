"""bench/bench_moe.py --smoke: the GPU mode's code on CPU under the interpreter (tiny shapes), so
the device run is not broken on arrival; its four forms agree with the torch gathered one."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_moe  # noqa: E402


@pytest.mark.cpu_only  # the GPU mode's code on CPU tensors through the Triton interpreter (the GPU runs it for real)
def test_smoke_rows(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "moe_smoke.json"
    assert bench_moe.main(["--smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu (smoke") and report["not_run"] == []
    assert [row["T"] for row in report["rows"]] == list(bench_moe.SMOKE_TOKENS)
    for row in report["rows"]:
        for form in ("triton_pairs", "triton_expert", "torch_gathered", "every_expert"):
            assert row[f"{form}_max_abs_diff"] < 1e-4 and row[f"{form}_us"] > 0
        assert 1 <= row["distinct_experts"] <= row["pairs"]


def test_smoke_needs_an_out_path():
    with pytest.raises(SystemExit, match="--smoke needs --out"):
        bench_moe.main(["--smoke"])
