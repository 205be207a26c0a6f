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


def test_cpu_mode_rows(tmp_path, monkeypatch):
    """bench_moe.py --cpu on a tiny block (the real run takes Qwen3-30B-A3B's): every way agrees
    with transformers' loop and the C++ op's speedup is computed against the way the torch runner
    takes."""
    from specdec_fast.kernels._backend import cpp_op_available

    if not cpp_op_available("moe_experts"):
        pytest.skip("the C++ op did not build")
    monkeypatch.setitem(bench_moe.SHAPES, "qwen3_30b_a3b", (64, 32, 16, 2))
    monkeypatch.setattr(bench_moe, "CPU_TOKENS", (1, 24))
    out = tmp_path / "moe_cpu.json"
    assert bench_moe.main(["--cpu", "--threads", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["threads"] == 1 and report["commit"]
    assert [(row["dtype"], row["T"]) for row in report["rows"]] == [(d, t) for d in ("float32", "bfloat16") for t in (1, 24)]
    for row in report["rows"]:
        tol = 1e-5 if row["dtype"] == "float32" else 5e-2
        for form in ("cpp", "every_expert", "chosen_only"):
            assert row[f"{form}_max_abs_diff"] <= tol and row[f"{form}_ms"] > 0
        assert row["cpp_speedup_over_the_torch_runner"] > 0
