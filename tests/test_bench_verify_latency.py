"""bench/bench_verify_latency.py on CPU under the interpreter (--smoke): the script runs every way on
a shape with several chunks a row, each gives the reference's tokens, and the JSON holds the
timings and their ratios to the defaults'."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_verify_latency  # noqa: E402


@pytest.mark.cpu_only  # the GPU mode's code on CPU tensors through the Triton interpreter
def test_smoke_rows_give_the_reference_tokens_every_way(tmp_path, monkeypatch):
    out = tmp_path / "verify_latency_smoke.json"
    ways = dict(bench_verify_latency.WAYS)
    # a way that fails (on a device: a compile error) is recorded and the others are measured
    monkeypatch.setitem(bench_verify_latency.WAYS, "broken", dict(no_such_override=1))
    # a lever that changes only other batches' plans is not run on this row
    monkeypatch.setitem(bench_verify_latency.WAYS, "b8_only", dict(emit_block_v=128))
    monkeypatch.setitem(bench_verify_latency.LEVERS, "b8_only", (dict(emit_block_v=128), False, (8,)))
    bench_verify_latency.main(["--smoke", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu (smoke") and report["not_run"] == []
    assert [r["mode"] for r in report["rows"]] == list(bench_verify_latency.SMOKE_MODES)
    for row in report["rows"]:
        assert row["error_broken"].startswith("TypeError") and row["tokens_equal_reference_broken"] is False
        assert "verify_broken_us" not in row and "verify_broken_over_now" not in row
        assert not any("b8_only" in key for key in row)
        assert row["B"] == 1  # where every way runs (emit_one_row_block changes the B = 1 plan alone)
        for name in ways:
            batches = bench_verify_latency.LEVERS[name][2] if name in bench_verify_latency.LEVERS else None
            if batches is not None and 1 not in batches:  # finish_gather_8192: B = 64 alone
                assert f"tokens_equal_reference_{name}" not in row
                continue
            assert row[f"tokens_equal_reference_{name}"] is True, (row["mode"], name)
            assert row[f"verify_{name}_us"] > 0 and row[f"sample_{name}_us"] > 0
        assert row["verify_search_tile_over_now"] == row["verify_search_tile_us"] / row["verify_now_us"]
        # the defaults' levers, as kernels/verify/_triton_plan.py has them (the report orients the ratios by them)
        assert row["search_tile_default_on"] is True and row["emit_skip_identities_default_on"] is True
