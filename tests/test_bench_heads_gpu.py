"""bench/bench_heads_gpu.py (the GPU rows of issues 23 and 28) must run when a GPU session starts
it unattended: its --tiny CPU path builds the target, the 2-layer draft, an EAGLE-3 head and a
DFlash drafter, runs each through generate() and turns the measured per-iteration costs into
the Theorem 3.8 table; and the 8B-shaped heads have the published shapes."""
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import bench_heads_gpu as bh  # noqa: E402
import scale_models as sm  # noqa: E402


def test_tiny_run_fills_every_row():
    result = bh.main(["--tiny", "--k", "2", "--dflash-k", "3", "--prompt-len", "8", "--new-tokens", "6",
                      "--repeats", "1"])
    rows = result["rows"]
    assert set(rows) == {"plain", "draft K=2", "eagle3 K=2", "dflash K=3"}
    for name in ("draft K=2", "eagle3 K=2", "dflash K=3"):
        row = rows[name]
        assert row["draft_ms_per_iter"] > 0 and row["target_ms_per_iter"] > 0 and row["iterations"] >= 1
        predicted = row["predicted_tokens_per_s_at_alpha"]
        assert list(predicted) == [str(a) for a in bh.ALPHAS] and predicted["0.9"] > predicted["0.6"] > 0


def test_theorem_3_8_tokens_per_iteration():
    assert bh.tokens_per_iteration(0.8, 4) == pytest.approx(1 + 0.8 + 0.8 ** 2 + 0.8 ** 3 + 0.8 ** 4)
    assert bh.tokens_per_iteration(0.0, 4) == 1.0 and bh.tokens_per_iteration(1.0, 4) == 5.0


def test_8b_heads_have_the_published_shapes():
    target = sm._on_meta(sm._config(sm.LLAMA3_8B), torch.bfloat16)
    eagle3 = bh.eagle3_head(target, "meta", torch.bfloat16, tiny=False)
    assert tuple(eagle3.fc.weight.shape) == (4096, 3 * 4096) and eagle3.draft_vocab_size == 32000
    assert tuple(eagle3.lm_head.weight.shape) == (32000, 4096)
    dflash = bh.dflash_head(target, "meta", torch.bfloat16, tiny=False)
    assert len(dflash.layers) == 5 and dflash.block_size == 16
