"""bench/bench_gemv.py --tiny: the GEMV benchmark's CPU mode (the interpreter, tiny shapes) runs
end to end and reports every product x rows x method it times on a GPU (the GPU mode shares
the loop; only the timer and the tile sweep differ), none of them failing its output check."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.cpu_only  # the GPU mode's code on CPU tensors through the Triton interpreter; on a GPU machine
# (compiled Triton, no CPU tensors) bench/run_gpu.sh runs the real mode
def test_tiny_mode_reports_every_row(tmp_path):
    pytest.importorskip("triton")
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_gemv

    result = bench_gemv.main(["--tiny", "--rows", "1,5", "--out", str(tmp_path / "gemv.json")])
    assert (tmp_path / "gemv.json").exists()
    assert not [r for r in result["rows"] if "error" in r], "a Triton row failed its check against cuBLAS"
    got = {(r["product"], r["rows"], r["method"]) for r in result["rows"]}
    for product, (_, _, prologue, _) in bench_gemv.products(bench_gemv.TINY).items():
        for m in (1, 5):
            assert {(product, m, "cublas"), (product, m, "triton")} <= got
            if prologue != "none":
                assert {(product, m, f"cublas + separate {prologue}"), (product, m, f"triton fused {prologue}")} <= got
    assert all(r["us"] > 0 and r["GBps"] > 0 for r in result["rows"])
