"""standardise_all: every sampling warper of transformers, in its order, in plain torch:
temperature -> top_k -> top_p -> min_p (kernels/verify/reference.py's standardise, the verify
kernels' spec) -> typical_p -> epsilon_cutoff -> eta_cutoff (transformers' TypicalLogitsWarper,
EpsilonLogitsWarper, EtaLogitsWarper, line for line, batched over [B, N, V] rows).

The engine uses it only when typical_p, epsilon_cutoff or eta_cutoff is on: it hands the verify
kernel these float32 logits (-inf = removed) with temperature 1 and truncation off, so the
kernel samples exactly this distribution. The price is float32 [B, N, V] passes with full vocabulary
sorts (standardise sorts for top-k and top-p whatever the parameters; typical sorts once more)
instead of the fused kernel's streaming pass. Why not fused: typical needs the entropy of the distribution
after top-p and a sort by |-log p - H|, eta needs that entropy, epsilon the maximum after top-p:
each is another reduction over the vocabulary after the truncation the kernel settles in its
finishing launch, i.e. at least one more pass per warper inside the kernel, for options that are
rarely used. Measured on the CPU (shared 2-core VM under load, 1 thread, torch 2.13, float32,
V = 32000, N = 5; median of 15 calls, the two alternated; bench/bench_processing.py ->
bench/results/processing_cpu.json; single runs vary by ~1.3x on this machine):
    standardise (top_k 50, top_p 0.9)                      B = 1:  26 ms     B = 8: 179 ms
    standardise_all (same + typical 0.9, epsilon, eta)     B = 1:  34 ms     B = 8: 223 ms
i.e. about one more sort (typical's): a [5, 32000] float32 sort alone took 11.8 ms there, a
softmax 0.06 ms; the sorts are the cost (on a GPU the same pass is a few sorts of B * N rows).

Host-sync free and static-shaped (Categorical's argument validation, which reads the logits on
the host, is replaced by its formula).
"""
import math
from numbers import Real

import torch

from ..kernels.sampling_params import SamplingTensors
from ..kernels.verify.reference import standardise


def check_warpers(typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0) -> tuple:
    """-> (typical_p, epsilon_cutoff, eta_cutoff) as floats; ValueError naming a bad one."""
    for name, value in (("typical_p", typical_p), ("epsilon_cutoff", epsilon_cutoff), ("eta_cutoff", eta_cutoff)):
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ValueError(f"{name} must be a number, got {value!r}")
    if not 0 < typical_p <= 1:
        raise ValueError(f"typical_p must be in (0, 1] (1 = off), got {typical_p!r}")
    for name, value in (("epsilon_cutoff", epsilon_cutoff), ("eta_cutoff", eta_cutoff)):
        if not 0 <= value < 1:
            raise ValueError(f"{name} must be in [0, 1) (0 = off), got {value!r}")
    return float(typical_p), float(epsilon_cutoff), float(eta_cutoff)


def typical_(scores: torch.Tensor, mass: float) -> torch.Tensor:
    """TypicalLogitsWarper(mass) on float32 rows [R, V] (min_tokens_to_keep 1)."""
    normalized = torch.nn.functional.log_softmax(scores, dim=-1)
    p = torch.exp(normalized)
    ent = -(normalized * p).nansum(-1, keepdim=True)
    shifted_scores = torch.abs((-normalized) - ent)
    sorted_scores, sorted_indices = torch.sort(shifted_scores, descending=False)
    sorted_logits = scores.gather(-1, sorted_indices)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    last_ind = (cumulative_probs < mass).sum(dim=1)
    last_ind.clamp_(max=sorted_scores.shape[-1] - 1)
    sorted_indices_to_remove = sorted_scores > sorted_scores.gather(1, last_ind.view(-1, 1))
    sorted_indices_to_remove[..., :1] = 0
    indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
    return scores.masked_fill(indices_to_remove, float("-inf"))


def epsilon_(scores: torch.Tensor, epsilon: float) -> torch.Tensor:
    """EpsilonLogitsWarper(epsilon) on rows [R, V]: drop p < epsilon, keep the most probable."""
    indices_to_remove = scores.softmax(dim=-1) < epsilon
    indices_to_remove = indices_to_remove & (scores < scores.amax(-1, keepdim=True))
    return scores.masked_fill(indices_to_remove, float("-inf"))


def eta_(scores: torch.Tensor, epsilon: float) -> torch.Tensor:
    """EtaLogitsWarper(epsilon) on rows [R, V]: drop p < min(eps, sqrt(eps) * exp(-entropy))."""
    probabilities = scores.softmax(dim=-1)
    # torch.distributions.Categorical(logits=scores).entropy(), without its validation (a host read)
    normalized = scores - scores.logsumexp(dim=-1, keepdim=True)
    p_log_p = torch.clamp(normalized, min=torch.finfo(normalized.dtype).min) * torch.softmax(normalized, dim=-1)
    entropy = -p_log_p.sum(-1)
    # transformers keeps epsilon as a float32 tensor (its sqrt in float32); a fill, not a host copy
    eps = torch.full((), epsilon, dtype=scores.dtype, device=scores.device)
    eta = torch.min(eps, torch.sqrt(eps) * torch.exp(-entropy))[..., None]
    indices_to_remove = (probabilities < eta) & (scores < scores.amax(-1, keepdim=True))
    return scores.masked_fill(indices_to_remove, float("-inf"))


def standardise_all(logits: torch.Tensor, params: SamplingTensors, *, typical_p: float = 1.0,
                    epsilon_cutoff: float = 0.0, eta_cutoff: float = 0.0) -> torch.Tensor:
    """logits [B, N, V] (any float dtype), params [B] -> float32 [B, N, V]: transformers' warpers
    in transformers' order (module docstring); -inf = removed. Greedy rows (temperature 0): the
    one-hot of standardise (the later warpers keep it)."""
    typical_p, epsilon_cutoff, eta_cutoff = check_warpers(typical_p, epsilon_cutoff, eta_cutoff)
    x = standardise(logits, params)  # [B, N, V] float32
    rows = x.reshape(-1, x.shape[-1])
    if typical_p < 1.0:
        rows = typical_(rows, typical_p)
    if epsilon_cutoff > 0.0:
        rows = epsilon_(rows, epsilon_cutoff)
    if eta_cutoff > 0.0:
        rows = eta_(rows, eta_cutoff)
    return rows.reshape(x.shape)
