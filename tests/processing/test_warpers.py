"""standardise_all equals transformers' warpers in transformers' order (temperature -> top_k ->
top_p -> min_p -> typical -> epsilon -> eta), row by row, with per-row parameters; its first four
steps are kernels/verify/reference.py's standardise (the verify kernels' spec)."""
import pytest
import torch
from transformers.generation import logits_process as lp

from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.processing import standardise_all

ROWS = [dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0), dict(temperature=1.0, top_k=12, top_p=0.9, min_p=0.0),
        dict(temperature=1.3, top_k=0, top_p=0.8, min_p=0.05), dict(temperature=0.5, top_k=400, top_p=1.0, min_p=0.1)]


def transformers_warpers(row: dict, typical_p, epsilon, eta):
    """_get_logits_processor's warper list for do_sample=True (min_tokens_to_keep 1)."""
    warpers = []
    if row["temperature"] != 1.0:
        warpers.append(lp.TemperatureLogitsWarper(row["temperature"]))
    if row["top_k"]:
        warpers.append(lp.TopKLogitsWarper(row["top_k"]))
    if row["top_p"] < 1.0:
        warpers.append(lp.TopPLogitsWarper(row["top_p"]))
    warpers.append(lp.MinPLogitsWarper(row["min_p"]))
    if typical_p < 1.0:
        warpers.append(lp.TypicalLogitsWarper(typical_p))
    if 0 < epsilon < 1:
        warpers.append(lp.EpsilonLogitsWarper(epsilon))
    if 0 < eta < 1:
        warpers.append(lp.EtaLogitsWarper(eta))
    return lp.LogitsProcessorList(warpers)


@pytest.mark.parametrize("extra", [dict(), dict(typical_p=0.9), dict(epsilon_cutoff=3e-3), dict(eta_cutoff=2e-3),
                                   dict(typical_p=0.7, epsilon_cutoff=1e-3, eta_cutoff=4e-3)])
@pytest.mark.parametrize("vocab", [60, 300])
def test_standardise_all_equals_transformers_warpers(extra, vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(len(ROWS), 5, vocab, generator=gen) * 2.5
    params = make_sampling_tensors(len(ROWS), "cpu", **{k: torch.tensor([r[k] for r in ROWS]) for k in ROWS[0]})
    ours = standardise_all(logits, params, **extra)
    assert ours.dtype == torch.float32
    for b, row in enumerate(ROWS):
        warpers = transformers_warpers(row, extra.get("typical_p", 1.0), extra.get("epsilon_cutoff", 0.0),
                                       extra.get("eta_cutoff", 0.0))
        want = warpers(None, logits[b].clone())
        assert torch.equal(torch.isneginf(ours[b]), torch.isneginf(want)), (b, row)
        finite = torch.isfinite(want)
        torch.testing.assert_close(ours[b][finite], want[finite], atol=1e-6, rtol=1e-6)
        assert (~finite).any() or row["top_p"] == 1.0  # something was removed where a truncation is on


def test_greedy_rows_stay_one_hot():
    logits = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(0))
    params = make_sampling_tensors(2, "cpu", temperature=0.0)
    ours = standardise_all(logits, params, typical_p=0.5, epsilon_cutoff=0.01, eta_cutoff=0.01)
    assert torch.equal(ours.argmax(-1), logits.argmax(-1)) and torch.isfinite(ours).sum(-1).eq(1).all()


@pytest.mark.parametrize("kw", [dict(typical_p=0.0), dict(typical_p=1.5), dict(epsilon_cutoff=1.0),
                                dict(eta_cutoff=-0.1), dict(eta_cutoff=float("nan"))])
def test_bad_warper_values_raise_naming_the_option(kw):
    params = make_sampling_tensors(1, "cpu")
    with pytest.raises(ValueError, match=next(iter(kw))):
        standardise_all(torch.zeros(1, 1, 8), params, **kw)
