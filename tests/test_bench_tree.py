"""bench/bench_tree.py --kernels-only (run_gpu.sh `limits`, issue 25's tree row) on CPU under the
interpreter (--smoke): the script the next GPU session runs unattended is not broken on arrival,
its rows carry every field bench/issue25_report.py reads, and the report reads them."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_tree  # noqa: E402
import issue25_report  # noqa: E402


@pytest.mark.cpu_only  # the GPU mode's code on CPU tensors through the Triton interpreter; on a GPU machine
# (compiled Triton, no CPU tensors) bench/run_gpu.sh runs the real mode
def test_kernels_only_smoke_rows_feed_the_report(tmp_path):
    out = tmp_path / "tree_kernels_smoke.json"
    bench_tree.main(["--kernels-only", "--smoke", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu (smoke") and "smoke" in report["timer"]
    rows = report["rows"]
    chains = [r for r in rows if r["nodes"] is None]
    trees = [r for r in rows if r["nodes"] is not None]
    assert [r["mode"] for r in chains] == ["T=1", "greedy"] and [r["mode"] for r in trees] == ["T=1", "greedy"]
    for row in chains:
        assert row["chain_k"] == 8 and row["chain_verify_us"] > 0 and row["tokens_equal_reference"] is True, row
    for row in trees:
        assert row["tokens_equal_reference"] is True and row["walk_parallel_tokens_equal"] is True, row
        assert min(row["tree_verify_us"], row["chain_verify_us"], row["tree_verify_us_walk_parallel"],
                   row["tree_verify_us_walk_scan"]) > 0, row
        assert row["tree_kernels"] == {"skipped": "smoke run (CPU)"}
    launches = {r["mode"]: r["tree_launches"] for r in trees}
    assert 1 <= launches["greedy"] < launches["T=1"], launches  # greedy: statistics + walk only
    # the report reads this file as run_gpu.sh names it: tree_kernels_<device>.json
    built = issue25_report.build(tmp_path, "smoke")
    line = next(r for r in built["targets"] if r["what"].startswith("tree_verify T=1 N=64"))
    assert line["measured"] is not None and line["met"] is not None
    assert set(built["levers"]["TREE_WALK_PARALLEL"]["ratios"]) == {"B=1 N=64 T=1", "B=1 N=64 greedy"}
    # the residual launches' identity skips, flipped beside the default on the sampled row: the same tokens
    sampled = next(r for r in trees if r["mode"] == "T=1")
    assert sampled["skip_identities_flipped_tokens_equal"] is True and sampled["tree_verify_us_skip_identities_flipped"] > 0
    assert set(built["levers"]["RESIDUAL_SKIP_IDENTITIES"]["ratios"]) == {"B=1 N=64 T=1"}
    # the residual masses in one launch, flipped beside the default: the same tokens, the workspace at zero
    assert sampled["residual_fused_flipped_tokens_equal"] is True and sampled["tree_verify_us_residual_fused_flipped"] > 0
    assert sampled["residual_fused_workspace_zero"] is True
    assert set(built["levers"]["RESIDUAL_FUSED"]["ratios"]) == {"B=1 N=64 T=1"}
    # the statistics pass's chunks swept beside the default (one chunk at V = 1000 under the interpreter)
    for row in trees:
        assert row["stats_chunks_default"] == 1, row
        for chunks in bench_tree.STATS_CHUNKS:
            assert row[f"stats_chunks_{chunks}_tokens_equal"] is True and row[f"tree_verify_us_stats_chunks_{chunks}"] > 0
            ratios = built["levers"][f"TREE_STATS_CHUNKS={chunks}"]["ratios"]
            assert {where.split(" (")[0] for where in ratios} == {"B=1 N=64 T=1", "B=1 N=64 greedy"}
    # the greedy row: the statistics without their streaming sums, flipped beside the default: the same tokens
    greedy = next(r for r in trees if r["mode"] == "greedy")
    assert greedy["argmax_only_flipped_tokens_equal"] is True and greedy["tree_verify_us_argmax_only_flipped"] > 0
    assert "tree B=1 N=64 greedy" in built["levers"]["STREAM_GREEDY_ARGMAX_ONLY"]["ratios"]
    assert built["tree_kernels"] == []
