"""bench/bench_noise.py (the emission's noise forms, timed on a GPU): its kernel draws what its torch
mirror draws in every form (CPU interpreter), the forms really differ (so that equality says
something), and each noise form samples the residual's law: a chi-square over many seeds, with a
control that a wrong law is rejected."""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_noise  # noqa: E402

from .kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue  # noqa: E402


@pytest.mark.cpu_only  # the kernel on CPU tensors through the Triton interpreter; a GPU runs the timed mode
def test_smoke_kernel_draws_what_torch_draws():
    result = bench_noise.main(["--smoke"])
    assert {row["form"] for row in result["rows"]} == set(bench_noise.FORMS)
    for row in result["rows"]:
        assert row["tokens_equal_torch"] is True, row["form"]


def _tokens(form, r, seeds):
    offset = torch.zeros_like(seeds)
    return bench_noise.torch_keys(r, seeds, offset, 3, form).argmax(1)


def test_the_noise_forms_draw_different_tokens():
    """One residual, 512 seeds: a Philox call per four entries draws other tokens than today's
    noise on many rows (so the kernel's equality with its mirror checks the word mapping, not just
    the largest r), while the exponential race on the same bits is the same draw as Gumbel's
    (argmax log r - log E = argmax r / E), up to rounding."""
    r = bench_noise.residuals(1, 1000, "cpu").expand(512, -1)
    seeds = torch.arange(512, dtype=torch.int64)
    one, four, race = (_tokens(form, r, seeds) for form in ("gumbel_1word", "gumbel_4words", "race_4words"))
    assert (one != four).float().mean() > 0.4 and (one != race).float().mean() > 0.4
    assert (four == race).float().mean() > 0.99


@pytest.mark.parametrize("form", ["gumbel_1word", "gumbel_4words", "race_4words"])
def test_each_noise_form_samples_the_residual(form):
    """20000 seeds over a residual with zeros among 9 entries: the tokens follow r / sum(r);
    control: the same tokens against r^2 / sum(r^2) are rejected."""
    r = torch.tensor([[0.05, 0.0, 0.2, 0.01, 0.3, 0.0, 0.14, 0.2, 0.1]])
    seeds = torch.arange(20000, dtype=torch.int64) * 2654435761 % (1 << 62)
    tokens = _tokens(form, r.expand(seeds.shape[0], -1), seeds)
    law = r[0] / r[0].sum()
    assert chi_square_pvalue(tokens, law) > P_VALUE_THRESHOLD
    wrong = r[0] ** 2 / (r[0] ** 2).sum()
    assert chi_square_pvalue(tokens, wrong) < P_VALUE_THRESHOLD
