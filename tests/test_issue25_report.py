"""bench/issue25_report.py reads what `run_gpu.sh limits` wrote and says which targets are met and
which levers the measurements support. Its inputs here are small JSONs in the layouts the
benchmarks write (the keys each script's GPU mode fills in); controls show each rule can say no."""
import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import issue25_report  # noqa: E402

DEV = "nvidia_h100_80gb_hbm3"


def verify_row(batch, mode, us, frac, equal=True, no_draft_us=None):
    verify = {"triton": {"median_us": us, "fraction_of_roofline": frac}}
    if no_draft_us is not None:
        verify["triton_no_draft_logits"] = {"median_us": no_draft_us, "fraction_of_roofline": frac}
    return {"B": batch, "K": 4, "V": 128256, "mode": mode, "tokens_equal_reference": equal, "verify": verify}


def step(graph_ms, frac, gemv=None, pdl=None):
    """A profile_step step row: frac of the ceiling at N = 1, None above (as the script writes)."""
    def fraction(ms):
        return None if frac is None else frac * graph_ms / ms

    row = {"graph_ms": graph_ms, "fraction_of_hbm_ceiling": frac}
    if gemv is not None:
        row["gemv_layer"] = {"graph_ms": gemv, "fraction_of_hbm_ceiling": fraction(gemv), "argmax_agreement": 1.0}
    if pdl is not None:
        row["gemv_layer_pdl"] = {"graph_ms": pdl, "fraction_of_hbm_ceiling": fraction(pdl), "argmax_agreement": 1.0}
    return row


FILES = {
    "verify": {"results": [verify_row(1, "greedy", 7.5, 0.1, no_draft_us=6.0), verify_row(1, "T=1", 16.0, 0.05),
                           verify_row(1, "top_k=50", 25.0, 0.03), verify_row(1, "top_p=0.9", 29.0, 0.03),
                           verify_row(64, "greedy", 100.0, 0.65), verify_row(64, "T=1", 200.0, 0.4)]},
    "profile_step": {"steps": {"N=1": step(6.0, 0.80, gemv=5.5, pdl=5.2), "N=5": step(6.5, None, gemv=6.0, pdl=5.8)}},
    "profile_step_b8": {"steps": {"N=1": step(7.0, 0.70, gemv=6.8, pdl=6.5)}},
    "tree_kernels": {"rows": [{"batch": 1, "nodes": None, "mode": "T=1", "chain_k": 8, "chain_verify_us": 50.0,
                               "tokens_equal_reference": True},
                              {"batch": 1, "nodes": 64, "mode": "T=1", "tree_verify_us": 90.0, "chain_verify_us": 1.0,
                               "tree_verify_us_walk_parallel": 60.0, "tree_verify_us_walk_scan": 90.0,
                               "walk_parallel_tokens_equal": True, "tokens_equal_reference": True,
                               "tree_verify_us_skip_identities_flipped": 75.0, "skip_identities_default": False,
                               "skip_identities_flipped_tokens_equal": True,
                               "tree_verify_us_residual_fused_flipped": 70.0, "residual_fused_default": False,
                               "residual_fused_flipped_tokens_equal": True, "residual_fused_workspace_zero": True,
                               "tree_kernels": {"families_count_us": [["other: walk_kernel", 1.0, 40.04],
                                                                      ["other: residual_mass_kernel", 5.0, 20.0]]}},
                              {"batch": 1, "nodes": 64, "mode": "greedy", "tree_verify_us": 500.0,
                               "tree_verify_us_walk_parallel": 500.0, "walk_parallel_tokens_equal": True,
                               "tree_verify_us_argmax_only_flipped": 495.0, "argmax_only_default": False,
                               "argmax_only_flipped_tokens_equal": True}]},
    "attention": {"results": [
        {"B": 1, "context": 1024, "triton_N1_us": 10.0, "in_kernel_N1_us": 8.0, "triton_N5_us": 12.0,
         "in_kernel_N5_us": 11.0, "in_kernel_max_abs_diff_N1": 0.0, "in_kernel_max_abs_diff_N5": 0.004},
        {"B": 8, "context": 8192, "triton_N1_us": 50.0, "in_kernel_N1_us": 50.5, "triton_N5_us": 60.0,
         "in_kernel_N5_us": 59.0, "in_kernel_max_abs_diff_N1": 0.0, "in_kernel_max_abs_diff_N5": 0.0}]},
    # each way is the defaults with one lever flipped; <way>_default_on: "now" has the lever on
    "verify_latency": {"not_run": [], "rows": [
        {"B": 1, "mode": "top_k=50", "verify_now_us": 60.0, "sample_now_us": 57.0,
         "search_tile_default_on": True, "verify_search_tile_us": 72.0, "sample_search_tile_us": 57.5,
         "tokens_equal_reference_search_tile": True,
         "emit_skip_identities_default_on": True, "verify_emit_skip_identities_us": 66.0,
         "sample_emit_skip_identities_us": 57.2, "tokens_equal_reference_emit_skip_identities": True,
         "emit_one_row_block_default_on": True, "verify_emit_one_row_block_us": 62.0,
         "sample_emit_one_row_block_us": 55.0, "tokens_equal_reference_emit_one_row_block": True},
        {"B": 64, "mode": "T=1", "verify_now_us": 255.0, "sample_now_us": 94.0,
         "search_tile_default_on": True, "verify_search_tile_us": 254.0, "sample_search_tile_us": 94.5,
         "tokens_equal_reference_search_tile": True,
         "emit_skip_identities_default_on": True, "verify_emit_skip_identities_us": 255.5,
         "sample_emit_skip_identities_us": 94.0, "tokens_equal_reference_emit_skip_identities": True}]},
    "stream_lanes": {"rows": [{"B": 64, "V": 128256, "mode": "T=1", "verify_lanes": {"median_us": 200.0},
                               "tokens_equal_reference_lanes": True, "verify_lanes_unroll2": {"median_us": 150.0},
                               "tokens_equal_reference_lanes_unroll2": True,
                               "verify_lanes_unroll4": {"median_us": 120.0},
                               "tokens_equal_reference_lanes_unroll4": False},
                              {"B": 64, "V": 128256, "mode": "greedy",  # without the sums: 60 us against 95
                               "verify_lanes": {"median_us": 95.0}, "sample_lanes": {"median_us": 30.0},
                               "tokens_equal_reference_lanes": True,
                               "verify_lanes_argmax_only": {"median_us": 60.0}, "sample_lanes_argmax_only": {"median_us": 29.9},
                               "tokens_equal_reference_lanes_argmax_only": True}]},
}


def build(tmp_path, files=FILES):
    for name, data in files.items():
        (tmp_path / f"{name}_{DEV}.json").write_text(json.dumps(data))
    (tmp_path / f"gpu_tests_{DEV}.log").write_text("....\n==== 2400 passed, 150 skipped in 290.1s ====\n")
    return issue25_report.build(tmp_path, DEV)


def by_what(report):
    return {r["what"]: r for r in report["targets"]}


def test_targets_read_from_every_file(tmp_path):
    report = build(tmp_path)
    rows = by_what(report)
    assert rows["verify B=1 greedy (triton) us"]["met"] is True
    assert rows["verify B=1 greedy (triton_no_draft_logits) us"]["measured"] == 6.0
    assert rows["verify B=1 T=1 (triton) us"]["met"] is False  # 16 > 15
    assert rows["verify B=1 top_p=0.9 (triton) us"]["met"] is True
    assert rows["verify B=64 greedy fraction of roofline"]["met"] is True
    assert rows["verify B=64 T=1 fraction of roofline"]["met"] is False
    plain = {k: v for k, v in rows.items() if k.startswith("plain decoding")}
    b1 = next(v for k, v in plain.items() if "B=1" in k)
    assert "gemv_layer_pdl" in b1["what"] and b1["met"] is True  # 0.80 * 6.0 / 5.2 = 0.92
    b8 = next(v for k, v in plain.items() if "B=8" in k)
    assert b8["met"] is False  # 0.70 * 7.0 / 6.5 = 0.75
    tree = rows["tree_verify T=1 N=64 over chain_verify K=8, B=1"]
    assert tree["measured"] == 1.8 and tree["met"] is True  # 90 / 50 (not the row's own chain)
    assert report["suite"].startswith("==== 2400 passed")
    assert report["levers"]["GEMV_LAYER"]["advice"] == "on" and report["levers"]["GEMV_PDL"]["advice"] == "on"
    assert report["levers"]["MERGE_IN_KERNEL"]["advice"] == "on"  # 0.8 and 0.92 faster, 1.01 within noise
    variant, greedy = report["stream_variants"]
    assert variant["best"] == "lanes_unroll2"  # unroll4 is faster but gave other tokens
    assert greedy["best"] == "lanes_argmax_only"
    argmax = report["levers"]["STREAM_GREEDY_ARGMAX_ONLY"]
    assert argmax["advice"] == "on" and argmax["ratios"]["B=64 V=128256 greedy lanes verify"] == round(60 / 95, 3)
    assert argmax["ratios"]["tree B=1 N=64 greedy"] == 0.99  # the flip (argmax only) over the default (sums)
    assert report["tree_kernels"][0] == {"kernel": "walk_kernel", "launches": 1.0, "us": 40.0}
    walk = report["levers"]["TREE_WALK_PARALLEL"]
    assert walk["advice"] == "on" and walk["ratios"] == {"B=1 N=64 T=1": 0.667, "B=1 N=64 greedy": 1.0}
    skips = report["levers"]["RESIDUAL_SKIP_IDENTITIES"]
    assert skips["advice"] == "on" and skips["ratios"] == {"B=1 N=64 T=1": 0.833}  # 75 / 90, the greedy row has none
    fused = report["levers"]["RESIDUAL_FUSED"]
    assert fused["advice"] == "on" and fused["ratios"] == {"B=1 N=64 T=1": 0.778}  # 70 / 90 (off by default)
    skips, block = report["levers"]["EMIT_SKIP_IDENTITIES"], report["levers"]["EMIT_ONE_ROW_BLOCK_V=256"]
    assert skips["advice"] == "on" and skips["ratios"]["B=1 top_k=50 verify"] == 0.909  # 60 / 66, the rest within noise
    assert block["advice"] == "off"  # the B = 1 sampler 57 on against 55 off: 3.6% slower with the lever
    assert set(block["ratios"]) == {"B=1 top_k=50 verify", "B=1 top_k=50 sample"}  # a B = 1 lever: no B = 64 way
    search = report["levers"]["FINISH_SEARCH_TILE=1024"]
    assert search["advice"] == "on" and search["ratios"]["B=1 top_k=50 verify"] == 0.833  # 60 / 72; B = 64 within noise
    assert report["levers"]["DEFAULTS_OF_2026_11_28"]["advice"] == "unmeasured"  # no earlier_defaults way in these rows
    text = issue25_report.markdown(report)
    assert "| GEMV_LAYER | on |" in text and "not measured" not in text
    assert "| residual_mass_kernel | 5 | 20.0 |" in text


def test_the_rules_say_no(tmp_path):
    files = copy.deepcopy(FILES)
    files["profile_step"]["steps"]["N=5"]["gemv_layer"]["graph_ms"] = 6.8  # 4.6% slower than cuBLAS at N = 5
    files["attention"]["results"][1]["in_kernel_N1_us"] = 52.0  # one shape 4% slower
    files["verify"]["results"][0]["tokens_equal_reference"] = False
    files["tree_kernels"]["rows"][1]["tokens_equal_reference"] = False
    report = build(tmp_path, files)
    assert report["levers"]["GEMV_LAYER"]["advice"] == "off"
    assert report["levers"]["GEMV_PDL"]["advice"] == "off" and "needs GEMV_LAYER on" in report["levers"]["GEMV_PDL"]["why"]
    assert report["levers"]["MERGE_IN_KERNEL"]["advice"] == "off"
    assert by_what(report)["verify B=1 greedy (triton) us"]["met"] is False  # fast, but other tokens
    assert by_what(report)["tree_verify T=1 N=64 over chain_verify K=8, B=1"]["met"] is False  # the same


def test_errors_and_disagreement_block_a_lever(tmp_path):
    files = copy.deepcopy(FILES)
    files["profile_step"]["steps"]["N=1"]["gemv_layer_pdl"] = {"error": "RuntimeError: CUDA error: illegal instruction"}
    files["profile_step"]["steps"]["N=1"]["gemv_layer"]["argmax_agreement"] = 0.9
    files["attention"]["results"][0]["in_kernel_max_abs_diff_N5"] = 0.5
    files["tree_kernels"]["rows"][1]["walk_parallel_tokens_equal"] = False
    files["verify_latency"]["rows"][0]["tokens_equal_reference_emit_skip_identities"] = False
    del files["verify_latency"]["rows"][1]["verify_search_tile_us"]  # the way failed on that row
    files["verify_latency"]["rows"][1]["error_search_tile"] = "CompilationError: out of resources"
    files["stream_lanes"]["rows"][1]["tokens_equal_reference_lanes_argmax_only"] = False
    files["tree_kernels"]["rows"][1]["residual_fused_workspace_zero"] = False  # faster, same tokens, but gave up
    report = build(tmp_path, files)
    for lever in ("GEMV_LAYER", "GEMV_PDL", "MERGE_IN_KERNEL", "TREE_WALK_PARALLEL", "EMIT_SKIP_IDENTITIES",
                  "FINISH_SEARCH_TILE=1024", "STREAM_GREEDY_ARGMAX_ONLY", "RESIDUAL_FUSED"):
        assert report["levers"][lever]["advice"] == "off" and report["levers"][lever]["why"], lever
    assert any("CompilationError" in why for why in report["levers"]["FINISH_SEARCH_TILE=1024"]["why"])


def test_forced_splits_that_disagree_block_the_merge_lever(tmp_path):
    """bench_attention's sweep checks every forced split count's output against the automatic plan's:
    a disagreement there turns MERGE_IN_KERNEL off as the two merges' disagreement does."""
    assert build(tmp_path)["levers"]["MERGE_IN_KERNEL"]["advice"] == "on"
    files = copy.deepcopy(FILES)
    files["attention"]["results"][0]["sweep_max_abs_diff_N1"] = 0.3
    lever = build(tmp_path, files)["levers"]["MERGE_IN_KERNEL"]
    assert lever["advice"] == "off" and any("forced splits" in why for why in lever["why"]), lever


def test_a_lever_missing_rows_is_incomplete(tmp_path):
    """GEMV_LAYER decides every batch: without the B = 8 profile its B = 1 rows alone say incomplete
    (and GEMV_PDL, which needs it, off); an attention run that left shapes out says so too."""
    files = {k: v for k, v in copy.deepcopy(FILES).items() if k != "profile_step_b8"}
    files["attention"]["not_run"] = ["B=8 context=8192"]
    files["verify_latency"]["not_run"] = ["B=64 K=4 V=128256 top_p=0.9"]
    report = build(tmp_path, files)
    assert report["levers"]["FINISH_SEARCH_TILE=1024"]["advice"] == "incomplete"
    assert report["levers"]["GEMV_LAYER"]["advice"] == "incomplete"
    assert "B=8 not measured" in report["levers"]["GEMV_LAYER"]["why"]
    assert report["levers"]["GEMV_PDL"]["advice"] == "off"
    assert report["levers"]["MERGE_IN_KERNEL"]["advice"] == "incomplete"
    assert set(report["levers"]["GEMV_LAYER"]["ratios"]) == {"B=1 N=1", "B=1 N=5"}


def test_missing_files_are_not_measured(tmp_path):
    report = build(tmp_path, {"verify": FILES["verify"]})
    rows = by_what(report)
    assert rows["verify B=1 T=1 (triton) us"]["measured"] == 16.0
    assert all(r["met"] is None for k, r in rows.items() if not k.startswith("verify"))
    assert {lever["advice"] for lever in report["levers"].values()} == {"unmeasured"}
    assert report["stream_variants"] == [] and "not measured" in issue25_report.markdown(report)
    assert report["tree_kernels"] == []


@pytest.mark.parametrize("partial", [{"results": []}, {"results": [verify_row(1, "greedy", 5.0, 0.1)]}])
def test_rows_a_budget_left_out(tmp_path, partial):
    report = build(tmp_path, {"verify": partial})
    rows = by_what(report)
    assert rows["verify B=64 greedy fraction of roofline"]["met"] is None


def test_main_names_the_device(tmp_path, capsys):
    build(tmp_path)
    issue25_report.main(["--results", str(tmp_path), "--device", DEV, "--out", str(tmp_path / "out.json")])
    assert "Issue 25 on nvidia_h100" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text())["device"] == DEV


def test_a_lever_off_by_default_reads_the_way_over_now(tmp_path):
    """A row whose way turns a lever on ("<way>_default_on" False, or an earlier run's row without the
    field, when the ways were off-by-default candidates): the ratio is the way's time over the
    defaults', so "on" still means "the lever on is faster"."""
    files = copy.deepcopy(FILES)
    for row in files["verify_latency"]["rows"]:
        row["search_tile_default_on"] = False
        row["verify_now_us"], row["verify_search_tile_us"] = row["verify_search_tile_us"], row["verify_now_us"]
        row["sample_now_us"], row["sample_search_tile_us"] = row["sample_search_tile_us"], row["sample_now_us"]
    flipped = build(tmp_path, files)["levers"]["FINISH_SEARCH_TILE=1024"]
    assert flipped == build(tmp_path)["levers"]["FINISH_SEARCH_TILE=1024"]
    for row in files["verify_latency"]["rows"]:
        del row["search_tile_default_on"]
    assert build(tmp_path, files)["levers"]["FINISH_SEARCH_TILE=1024"] == flipped


def test_argmax_lever_reads_the_pinned_sums_where_the_default_has_none():
    """With STREAM_GREEDY_ARGMAX_ONLY on, a greedy row's "lanes" is the argmax-only loop itself: the lever
    compares with "lanes_sums" (the sums pinned on) where the file has it, with "lanes" only in files
    written before it existed (the default then kept the sums)."""
    row = {"B": 64, "V": 128256, "mode": "greedy", "tokens_equal_reference_lanes_argmax_only": True,
           "verify_lanes": {"median_us": 78.0}, "sample_lanes": {"median_us": 20.0},
           "verify_lanes_argmax_only": {"median_us": 78.0}, "sample_lanes_argmax_only": {"median_us": 20.0}}
    assert issue25_report.argmax_lever({"rows": [row]})["advice"] == "off"  # level with its own default
    pinned = dict(row, verify_lanes_sums={"median_us": 96.0}, sample_lanes_sums={"median_us": 22.0})
    lever = issue25_report.argmax_lever({"rows": [pinned]})
    assert lever["advice"] == "on" and lever["ratios"] == {"B=64 V=128256 greedy lanes verify": round(78 / 96, 3),
                                                           "B=64 V=128256 greedy lanes sample": round(20 / 22, 3)}


def test_argmax_unroll_lever_reads_the_unrolled_argmax_only_loop():
    """STREAM_ARGMAX_UNROLL=2: the argmax-only per-lane loop 2 blocks a step over 1, greedy rows; other
    tokens than the reference keep it off."""
    row = {"B": 64, "V": 128256, "mode": "greedy", "tokens_equal_reference_lanes_argmax_only_unroll2": True,
           "verify_lanes_argmax_only": {"median_us": 78.0}, "sample_lanes_argmax_only": {"median_us": 20.0},
           "verify_lanes_argmax_only_unroll2": {"median_us": 62.0}, "sample_lanes_argmax_only_unroll2": {"median_us": 19.0}}
    lever = issue25_report.argmax_unroll_lever({"rows": [row]}, 2)
    assert lever["advice"] == "on" and lever["ratios"]["B=64 V=128256 greedy lanes verify"] == round(62 / 78, 3)
    assert issue25_report.argmax_unroll_lever({"rows": [row]}, 4)["advice"] == "unmeasured"
    wrong = dict(row, tokens_equal_reference_lanes_argmax_only_unroll2=False)
    assert issue25_report.argmax_unroll_lever({"rows": [wrong]}, 2)["advice"] == "off"


def test_blas_lever_reads_the_cublaslt_rows():
    """BLAS_CUBLASLT: profile_step's "cublaslt" step over the default step per batch and width; an
    error keeps it off; a batch not profiled makes it incomplete."""
    one = {"steps": {"N=1": {"graph_ms": 4.8, "cublaslt": {"graph_ms": 4.6}},
                     "N=5": {"graph_ms": 5.2, "cublaslt": {"graph_ms": 5.0}}}}
    lever = issue25_report.blas_lever({1: one, 8: None})
    assert lever["advice"] == "incomplete" and lever["ratios"] == {"B=1 N=1": round(4.6 / 4.8, 3),
                                                                   "B=1 N=5": round(5.0 / 5.2, 3)}
    assert issue25_report.blas_lever({1: one, 8: one})["advice"] == "on"
    broken = {"steps": {"N=1": {"graph_ms": 4.8, "cublaslt": {"error": "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED"}}}}
    assert issue25_report.blas_lever({1: broken, 8: one})["advice"] == "off"


def test_argmax_unroll_rule_lever_reads_the_planned_unroll_per_call():
    """STREAM_ARGMAX_UNROLL (the plan's): per row and call the plan unrolls (planned_unroll_verify / _sample), the
    plan's own loop ("lanes") over the same loop one block a step; calls the plan leaves at one block a step are
    not read; files without the fields are unmeasured; other tokens keep it off."""
    row = {"B": 64, "V": 128256, "mode": "greedy", "planned_unroll_verify": 4, "planned_unroll_sample": 2,
           "tokens_equal_reference_lanes": True,
           "verify_lanes_argmax_only": {"median_us": 77.2}, "sample_lanes_argmax_only": {"median_us": 18.6},
           "verify_lanes": {"median_us": 62.0}, "sample_lanes": {"median_us": 17.9}}
    lever = issue25_report.argmax_unroll_rule_lever({"rows": [row]})
    assert lever["advice"] == "on" and lever["ratios"] == {
        "B=64 V=128256 greedy verify 4 blocks a step": round(62.0 / 77.2, 3),
        "B=64 V=128256 greedy sample 2 blocks a step": round(17.9 / 18.6, 3)}
    slower = dict(row, sample_lanes={"median_us": 19.1})  # a planned unroll slower than one block a step
    assert issue25_report.argmax_unroll_rule_lever({"rows": [slower]})["advice"] == "off"
    one = dict(row, B=1, planned_unroll_verify=1, planned_unroll_sample=1)
    assert issue25_report.argmax_unroll_rule_lever({"rows": [one]})["advice"] == "unmeasured"
    unrecorded = {k: v for k, v in row.items() if not k.startswith("planned_")}
    assert issue25_report.argmax_unroll_rule_lever({"rows": [unrecorded]})["advice"] == "unmeasured"
    wrong = dict(row, tokens_equal_reference_lanes=False)
    assert issue25_report.argmax_unroll_rule_lever({"rows": [wrong]})["advice"] == "off"
