"""bench/bench_attention.py --gpu's targets from the rows measured: --quick (B 1 / 8 x 1k / 8k) or a
run its budget cut has no 32k rows; its report must still be written, with those targets left out.
And --gpu --smoke: that code on CPU under the interpreter (run_gpu.sh `limits` runs --gpu --quick
unattended), its rows feeding issue25_report's MERGE_IN_KERNEL lever."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_attention  # noqa: E402
import issue25_report  # noqa: E402
from bench_attention import attention_targets  # noqa: E402


def row(batch, context, ours=(10.0, 12.0), in_kernel=(9.0, 12.0), sdpa=(8.0, 10.0)):
    r = {"B": batch, "context": context, "ratio_N5_vs_N1": ours[1] / ours[0], "triton_N1_roofline": 0.5,
         "triton_N5_roofline": 0.6}
    for n, a, b, c in zip((1, 5), ours, in_kernel, sdpa):
        r[f"triton_N{n}_us"], r[f"in_kernel_N{n}_us"], r[f"ratio_vs_sdpa_N{n}"] = a, b, a / c
    return r


def test_quick_rows_give_the_short_targets_and_the_merge_ratios():
    targets = attention_targets([row(1, 1024), row(8, 1024, ours=(20.0, 30.0), sdpa=(10.0, 30.0)), row(1, 8192)])
    assert targets["short_ratio_vs_sdpa_max"] == 2.0
    assert "ratio_N5_vs_N1_at_32k_max" not in targets and "roofline_N1_B8_32k" not in targets
    assert targets["in_kernel_vs_launch"] == {"B1_1024_N1": 0.9, "B1_1024_N5": 1.0, "B8_1024_N1": 0.45,
                                              "B8_1024_N5": 0.4, "B1_8192_N1": 0.9, "B1_8192_N5": 1.0}


def test_full_rows_give_every_target():
    targets = attention_targets([row(1, 1024), row(8, 32768, ours=(100.0, 120.0))])
    assert targets["ratio_N5_vs_N1_at_32k_max"] == 1.2 and targets["roofline_N5_B8_32k"] == 0.6


def test_no_rows():
    assert attention_targets([])["in_kernel_vs_launch"] == {}


@pytest.mark.cpu_only  # the GPU mode's code on CPU tensors through the Triton interpreter; on a GPU machine
# (compiled Triton, no CPU tensors) bench/run_gpu.sh runs the real mode
def test_gpu_mode_smoke_rows_feed_the_report(tmp_path):
    out = tmp_path / "attention_smoke.json"
    bench_attention.main(["--gpu", "--smoke", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu (smoke") and report["selection"] == "smoke" and report["not_run"] == []
    (row,) = report["results"]
    for n in (1, 5):
        for form in ("triton", "in_kernel"):
            assert row[f"{form}_N{n}_us"] > 0 and row[f"plan{'_in_kernel' if form == 'in_kernel' else ''}_N{n}"]
        assert set(row[f"sweep_N{n}_us"]) == set(row[f"sweep_in_kernel_N{n}_us"]) == {"1", "2"}
        # fp32 on CPU: the merges and split counts agree to rounding
        assert row[f"in_kernel_max_abs_diff_N{n}"] < 1e-5 and row[f"sweep_max_abs_diff_N{n}"] < 1e-5, row
        assert row[f"short_row_max_abs_diff_N{n}"] < 1e-5 and set(row[f"short_row_N{n}_us"]) == {"auto", "1"}, row
        assert row[f"sdpa_flash_N{n}_us"] > 0, row.get("sdpa_error")
        assert row[f"window_N{n}_us"] > 0 and row[f"chunk_N{n}_us"] > 0  # the window's and Llama 4's chunk's rows
        assert row[f"d512_N{n}_us"] > 0 and row[f"d512_N{n}_GBps"] > 0  # Gemma 4's 512-wide heads
    assert set(report["targets"]["in_kernel_vs_launch"]) == {"B1_520_N1", "B1_520_N5"}
    lever = issue25_report.merge_lever(report)
    assert lever["advice"] != "unmeasured" and set(lever["ratios"]) == {"B=1 520 N=1", "B=1 520 N=5"}
    assert not [why for why in lever["why"] if "differ" in why]
