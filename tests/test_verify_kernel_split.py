"""bench/verify_kernel_split.py (run_gpu.sh `limits`: the verify's device time per kernel) on CPU under the
interpreter (--smoke: the calls and their tokens; no CUDA kernel to profile), and its census and the report's
table from a profiler's answer of the form gpu_timing.profile_kernels gives."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import issue25_report  # noqa: E402
import verify_kernel_split  # noqa: E402


@pytest.mark.cpu_only  # the GPU mode's calls on CPU tensors through the Triton interpreter
def test_smoke_rows_give_the_reference_tokens(tmp_path):
    out = tmp_path / "verify_kernels_smoke.json"
    verify_kernel_split.main(["--smoke", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu (smoke") and report["not_run"] == []
    assert [(r["B"], r["mode"]) for r in report["rows"]] == [(2, "greedy"), (2, "top_p=0.9")]
    assert all(r["tokens_equal_reference"] is True and "verify" not in r for r in report["rows"])


def test_census_names_the_triton_kernels_and_keeps_an_error():
    answer = {"kernels_per_call": 3.0, "gpu_busy_ms": 0.0874, "wall_ms": 0.2,
              "families_count_us": [["other: select_finish_kernel", 1.0, 40.1], ["other: select_stream_kernel", 1.0,
                                                                                 22.0], ["memset", 1.0, 1.2]]}
    got = verify_kernel_split.census(lambda: None, lambda fn: dict(answer))
    assert got["families_count_us"][0] == ["select_finish_kernel", 1.0, 40.1] and got["families_count_us"][2][0] == "memset"

    def broken(fn):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    assert verify_kernel_split.census(lambda: None, broken) == {"error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}
    rows = [{"B": 64, "mode": "top_p=0.9", "tokens_equal_reference": True,
             "verify": verify_kernel_split.census(lambda: None, lambda fn: dict(answer))},
            {"B": 1, "mode": "T=1", "tokens_equal_reference": True, "verify": {"error": "RuntimeError: x"}}]
    split = issue25_report.verify_kernel_split({"rows": rows}, top=2)
    assert split[0] == {"row": "B=64 top_p=0.9", "busy_us": 87.4, "kernels": [["select_finish_kernel", 1.0, 40.1],
                                                                              ["select_stream_kernel", 1.0, 22.0]],
                        "error": None, "tokens_equal_reference": True}
    assert split[1]["busy_us"] is None and split[1]["error"] == "RuntimeError: x"
    text = issue25_report.markdown({"device": "d", "targets": [], "levers": {}, "stream_variants": [],
                                    "tree_kernels": [], "verify_kernels": split, "suite": None})
    assert "| B=64 top_p=0.9 | 87.4 | select_finish_kernel x1 40.1; select_stream_kernel x1 22.0 | yes |" in text
    assert "| B=1 T=1 | - | RuntimeError: x | yes |" in text
