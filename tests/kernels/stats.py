"""Statistical helpers for sampling tests."""
import numpy as np
import torch
from scipy.stats import chisquare

# Each statistical test is deterministic (fixed seeds), so it cannot flake; the threshold only
# decides how surprising a result must be before we call the sampler wrong.
P_VALUE_THRESHOLD = 1e-3


def chi_square_pvalue(samples: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of samples (int tokens [N]) against probs [V]. Tokens of zero probability must
    never appear (asserted); bins with expected count < min_expected are pooled."""
    probs = probs.double().cpu().numpy()
    counts = np.bincount(samples.long().cpu().numpy(), minlength=probs.shape[0]).astype(np.float64)
    assert counts[probs == 0].sum() == 0, f"sampled tokens of zero probability: {np.nonzero(counts * (probs == 0))[0]}"
    n = counts.sum()
    expected = probs * n
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0
    exp = np.array(exp)
    exp *= sum(obs) / exp.sum()
    return float(chisquare(obs, exp).pvalue)
