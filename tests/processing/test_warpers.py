"""standardise_all equals transformers' warpers in transformers' order (temperature -> top_h ->
top_k -> top_p -> min_p -> typical -> epsilon -> eta), row by row, with per-row parameters; its
temperature, top_k, top_p and min_p are kernels/verify/reference.py's standardise (the verify
kernels' spec)."""
import pytest
import torch
from transformers.generation import logits_process as lp

from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.processing import standardise_all

ROWS = [dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0), dict(temperature=1.0, top_k=12, top_p=0.9, min_p=0.0),
        dict(temperature=1.3, top_k=0, top_p=0.8, min_p=0.05), dict(temperature=0.5, top_k=400, top_p=1.0, min_p=0.1)]


def transformers_warpers(row: dict, typical_p, epsilon, eta, top_h=None):
    """_get_logits_processor's warper list for do_sample=True (min_tokens_to_keep 1)."""
    warpers = []
    if row["temperature"] != 1.0:
        warpers.append(lp.TemperatureLogitsWarper(row["temperature"]))
    if top_h is not None:
        warpers.append(lp.TopHLogitsWarper(top_h))
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
                                   dict(typical_p=0.7, epsilon_cutoff=1e-3, eta_cutoff=4e-3), dict(top_h=0.4),
                                   dict(top_h=1.0), dict(top_h=0.25, typical_p=0.9, eta_cutoff=2e-3)])
@pytest.mark.parametrize("vocab", [60, 300])
def test_standardise_all_equals_transformers_warpers(extra, vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(len(ROWS), 5, vocab, generator=gen) * 2.5
    params = make_sampling_tensors(len(ROWS), "cpu", **{k: torch.tensor([r[k] for r in ROWS]) for k in ROWS[0]})
    ours = standardise_all(logits, params, **extra)
    assert ours.dtype == torch.float32
    for b, row in enumerate(ROWS):
        warpers = transformers_warpers(row, extra.get("typical_p", 1.0), extra.get("epsilon_cutoff", 0.0),
                                       extra.get("eta_cutoff", 0.0), extra.get("top_h"))
        want = warpers(None, logits[b].clone())
        assert torch.equal(torch.isneginf(ours[b]), torch.isneginf(want)), (b, row)
        finite = torch.isfinite(want)
        torch.testing.assert_close(ours[b][finite], want[finite], atol=1e-6, rtol=1e-6)
        assert (~finite).any() or row["top_p"] == 1.0  # something was removed where a truncation is on


@pytest.mark.parametrize("vocab", [150, 4099])
def test_top_h_is_bit_for_bit_transformers_top_h(vocab):
    """top_h alone (the 100-logit cap below and above V, 40 rows at several temperatures): every
    value equal to TopHLogitsWarper's after TemperatureLogitsWarper's, -inf where it puts -inf."""
    logits = torch.randn(8, 5, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    temperature = torch.tensor([0.3, 0.7, 1.0, 1.0, 1.4, 2.0, 0.9, 1.1])
    ours = standardise_all(logits, make_sampling_tensors(8, "cpu", temperature=temperature), top_h=0.35)
    for b, t in enumerate(temperature.tolist()):
        want = lp.TopHLogitsWarper(0.35)(None, lp.TemperatureLogitsWarper(t)(None, logits[b].clone()))
        assert torch.equal(ours[b], want), b
        assert torch.isfinite(want).sum() < want.numel() / 2  # it did cut


def test_control_top_h_after_top_k_differs():
    """The order matters (transformers: temperature, top_h, then top_k): top_h over the top-k
    survivors keeps other tokens, which the equality above would catch."""
    logits = torch.randn(4, 5, 300, generator=torch.Generator().manual_seed(1)) * 2.5
    ours = standardise_all(logits, make_sampling_tensors(4, "cpu", top_k=12), top_h=0.5)
    wrong = lp.TopHLogitsWarper(0.5)(None, lp.TopKLogitsWarper(12)(None, logits.reshape(-1, 300).clone()))
    assert not torch.equal(torch.isneginf(ours.reshape(-1, 300)), torch.isneginf(wrong))


def test_greedy_rows_stay_one_hot():
    logits = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(0))
    params = make_sampling_tensors(2, "cpu", temperature=0.0)
    for extra in (dict(typical_p=0.5, epsilon_cutoff=0.01, eta_cutoff=0.01), dict(top_h=0.2)):
        ours = standardise_all(logits, params, **extra)
        assert torch.equal(ours.argmax(-1), logits.argmax(-1)) and torch.isfinite(ours).sum(-1).eq(1).all()


def test_top_h_leaves_the_greedy_rows_of_a_mixed_batch():
    """Row 0 greedy, row 1 sampled: row 0's one-hot sits at the raw argmax, row 1 is warped."""
    logits = torch.randn(2, 3, 200, generator=torch.Generator().manual_seed(2))
    params = make_sampling_tensors(2, "cpu", temperature=torch.tensor([0.0, 0.8]))
    ours = standardise_all(logits, params, top_h=0.3)
    assert torch.equal(ours[0].argmax(-1), logits[0].argmax(-1)) and torch.isfinite(ours[0]).sum(-1).eq(1).all()
    want = lp.TopHLogitsWarper(0.3)(None, lp.TemperatureLogitsWarper(0.8)(None, logits[1].clone()))
    assert torch.equal(ours[1], want)


@pytest.mark.parametrize("kw", [dict(typical_p=0.0), dict(typical_p=1.5), dict(epsilon_cutoff=1.0),
                                dict(eta_cutoff=-0.1), dict(eta_cutoff=float("nan")), dict(top_h=0.0),
                                dict(top_h=1.5), dict(top_h=float("nan")), dict(top_h=True)])
def test_bad_warper_values_raise_naming_the_option(kw):
    params = make_sampling_tensors(1, "cpu")
    with pytest.raises(ValueError, match=next(iter(kw))):
        standardise_all(torch.zeros(1, 1, 8), params, **kw)
