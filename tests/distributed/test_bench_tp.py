"""bench/bench_tp.py's pieces that run without ranks: the sharded-statistics verify prototype
(simulated ranks) gives chain_verify's tokens, so the collective times it is measured by are
those of a correct verify; the NVLink model is labelled a prediction and counts what the runner
does (2L + 1 all-reduces, weights / N per rank; the 8B shape's weights are the measured run's)."""
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import tp_model  # noqa: E402
import tp_sharded_verify  # noqa: E402

from specdec_fast.kernels import chain_verify  # noqa: E402
from specdec_fast.kernels.sampling_params import make_sampling_tensors  # noqa: E402


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", range(4))
def test_sharded_statistics_verify_equals_chain_verify(ranks, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, k, vocab = 6, 4, 1000
    target = torch.randn(batch, k + 1, vocab, generator=gen) * 3
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=gen) * 1.5
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.0, 1.0])
    drafts = torch.where(temperature[:, None] == 0, draft.argmax(-1), (draft / 0.9).softmax(-1).view(-1, vocab)
                         .multinomial(1, generator=gen).view(batch, k))
    drafts[1, 2:] = -1
    params = make_sampling_tensors(batch, "cpu", temperature=temperature, seed=seed)
    expected = chain_verify(target, draft, drafts, temperature=temperature, seed=params.seed, offset=0, backend="torch")
    got = tp_sharded_verify.simulate(target, draft, drafts, params, ranks)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_the_nvlink_model_is_a_labelled_prediction():
    p = tp_model.predictions(batches=(1, 32))
    assert p["label"].startswith("PREDICTION")
    assert abs(p["shapes"]["8B"]["streamed_GB"] - p["calibration"]["weight_bytes_8b"] / 1e9) < 0.01
    plain = p["70B_on_8"]["B=1"]["plain"]
    assert plain["allreduces"] == 161 and abs(plain["weight_bytes_per_rank"] - 139.0e9 / 8) < 0.1e9
    assert all(r["plain_tok_s"] > 0 and r["speedup"] > 0 for r in p["speculative_70B_on_8_B1"])
    b1 = next(r for r in p["verify_pricing"] if r["target"] == "70B" and r["batch"] == 1)
    assert b1["faster"] == "all_gather"  # the runner's choice where speculative decoding pays most (B = 1)
