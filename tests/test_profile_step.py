"""bench/profile_step.py --tiny: the step profiler's CPU mode runs end to end (the GPU mode shares
its step, launch counting and GEMM sweep code) and reports the Triton path's launches per layer."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_mode_writes_the_report(tmp_path):
    pytest.importorskip("triton")
    sys.path.insert(0, str(ROOT / "bench"))
    import profile_step

    out = tmp_path / "profile.json"
    profile_step.main(["--tiny", "--iters", "2", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["weight_bytes_per_step"] > 0 and report["steps"].keys() == {"N=1", "N=5"}
    for n in ("N=1", "N=5"):
        step = report["steps"][n]
        assert step["eager_ms"] > 0 and step["launches"]["launches_per_step"] > 0
        triton_path = report["triton_path_launches_per_layer"][n]
        assert triton_path["per_layer"] == 9, triton_path["per_layer_by_name"]
    if "llama_8b_triton_path_launches" in report:  # 32 layers x 9 + what a step does outside them
        assert report["llama_8b_triton_path_launches"]["N=1"]["launches_per_step"] <= 32 * 9 + 20
        # the GEMV layer: 6 a layer (the cuBLAS layer's split-K reduces, not counted here, gone too)
        gemv = report["llama_8b_triton_path_launches"]["N=1 gemv_layer"]
        assert gemv["launches_per_step"] <= 32 * 6 + 20 and gemv["by_name"]["triton:_skinny_linear_kernel"] == 32 * 4 + 1
    assert set(report["host_python_us_per_layer"]) == {"ours_triton_path", "ours_cpu_path", "transformers"}
    gemms = {(g["gemm"], g["rows"]) for g in report["gemm"]}
    assert ("qkv", 1) in gemms and ("lm_head", 5) in gemms
    assert all(g["GBps"] > 0 and g["bytes"] > 0 for g in report["gemm"])


def test_kernel_families():
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_timing import kernel_family

    assert kernel_family("_rope_append_kv_kernel") == "triton:_rope_append_kv_kernel"
    assert kernel_family("void cublasLt::splitKreduce_kernel<32, 16, int, float>") == "cublas split-K reduce"
    assert kernel_family("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT") == "gemm/gemv"
    assert kernel_family("void at::native::vectorized_elementwise_kernel<8, at::native") == "torch elementwise"
