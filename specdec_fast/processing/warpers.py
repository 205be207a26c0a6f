"""standardise_all: every sampling warper of transformers, in its order, in plain torch:
temperature -> top_h -> top_k -> top_p -> min_p (temperature, top_k, top_p, min_p:
kernels/verify/reference.py's standardise, the verify kernels' spec) -> typical_p ->
epsilon_cutoff -> eta_cutoff (transformers' TopHLogitsWarper, TypicalLogitsWarper,
EpsilonLogitsWarper, EtaLogitsWarper, line for line, batched over [B, N, V] rows).

The engine uses it only when top_h, typical_p, epsilon_cutoff or eta_cutoff is on
(``stage_warpers_on``): it hands the verify
kernel these float32 logits (-inf = removed) with temperature 1 and truncation off, so the
kernel samples exactly this distribution. The price is float32 [B, N, V] passes with full vocabulary
sorts (standardise sorts for top-k and top-p whatever the parameters; typical sorts once more)
instead of the fused kernel's streaming pass. Why not fused: typical needs the entropy of the distribution
after top-p and a sort by |-log p - H|, eta needs that entropy, epsilon the maximum after top-p:
each is another reduction over the vocabulary after the truncation the kernel settles in its
finishing launch, i.e. at least one more pass per warper inside the kernel, for options that are
rarely used; top_h needs the 100 largest logits sorted (a top-k of 100) and their entropy before
top_k runs. Measured on the CPU (shared 2-core VM under load, 1 thread, torch 2.13, float32,
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
from dataclasses import replace
from numbers import Real

import torch

from ..kernels.sampling_params import SamplingTensors
from ..kernels.verify.reference import standardise


# The warpers standardise_all adds to the kernel's, with the value that means "off" (transformers'
# neutral values; top_h is on at any value but None, as in _get_logits_processor).
STAGE_WARPERS = {"top_h": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}
TOP_H_CANDIDATES = 100  # TopHLogitsWarper.top_n: the entropy rule looks at the 100 largest logits


def check_warpers(typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, top_h=None) -> tuple:
    """-> (typical_p, epsilon_cutoff, eta_cutoff, top_h) as floats (top_h None = off); ValueError
    naming a bad one."""
    values = (("typical_p", typical_p), ("epsilon_cutoff", epsilon_cutoff), ("eta_cutoff", eta_cutoff))
    if top_h is not None:
        values += (("top_h", top_h),)
    for name, value in values:
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ValueError(f"{name} must be a number, got {value!r}")
    if not 0 < typical_p <= 1:
        raise ValueError(f"typical_p must be in (0, 1] (1 = off), got {typical_p!r}")
    for name, value in (("epsilon_cutoff", epsilon_cutoff), ("eta_cutoff", eta_cutoff)):
        if not 0 <= value < 1:
            raise ValueError(f"{name} must be in [0, 1) (0 = off), got {value!r}")
    if top_h is not None and not 0 < top_h <= 1:
        raise ValueError(f"top_h must be in (0, 1] (None = off), got {top_h!r}")
    return float(typical_p), float(epsilon_cutoff), float(eta_cutoff), None if top_h is None else float(top_h)


def stage_warpers_on(options: dict, do_sample: bool) -> bool:
    """Whether a call with these options (transformers' names; absent or None = off) runs its
    warpers in standardise_all: sampling with top_h, typical_p, epsilon_cutoff or eta_cutoff on,
    or with a watermark (transformers watermarks after the warpers: watermark.py)."""
    if not do_sample:
        return False
    if options.get("watermarking_config") is not None:
        return True
    return any(options.get(name) is not None and (name == "top_h" or options[name] != off)
               for name, off in STAGE_WARPERS.items())


def top_h_(scores: torch.Tensor, top_h: float) -> torch.Tensor:
    """TopHLogitsWarper(top_h) on float32 rows [R, V]: of the 100 largest logits, in descending
    order, keep the longest run whose cumulative entropy terms -p log p (p: softmax over those
    100) stay <= top_h * their entropy, and always the largest; everything else -inf. Equal logits
    at the cut are ordered as torch.topk orders them, as in transformers."""
    top_logits, top_idx = torch.topk(scores, min(TOP_H_CANDIDATES, scores.shape[-1]), dim=-1, largest=True,
                                     sorted=True)
    # torch.distributions.Categorical(logits=top_logits): its probs and entropy(), without its
    # argument validation (a host read)
    normalized = top_logits - top_logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(normalized, dim=-1)
    entropy = -(torch.clamp(normalized, min=torch.finfo(normalized.dtype).min) * probs).sum(-1)
    tau = (entropy * top_h).unsqueeze(-1)
    cumulative_entropy = torch.cumsum(-probs * torch.log(probs), dim=-1)
    selection = cumulative_entropy <= tau
    selection[:, 0] = True
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, top_idx, selection)
    return scores.masked_fill(~keep, float("-inf"))


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


def standardise_all(logits: torch.Tensor, params: SamplingTensors, *, top_h: float | None = None,
                    typical_p: float = 1.0, epsilon_cutoff: float = 0.0, eta_cutoff: float = 0.0) -> torch.Tensor:
    """logits [B, N, V] (any float dtype), params [B] -> float32 [B, N, V]: transformers' warpers
    in transformers' order (module docstring); -inf = removed. Greedy rows (temperature 0): the
    one-hot of standardise at the raw logits' argmax (the other warpers leave it)."""
    typical_p, epsilon_cutoff, eta_cutoff, top_h = check_warpers(typical_p, epsilon_cutoff, eta_cutoff, top_h)
    if top_h is None:
        x = standardise(logits, params)  # [B, N, V] float32
    else:  # top_h sits between the temperature and top_k: scale here, then standardise at temperature 1
        temperature = params.temperature.reshape(-1, 1, 1)
        sampled = temperature > 0
        # standardise's own division (a greedy row divides by 1: x / 1 == x, its argmax unchanged)
        scaled = logits.float() / torch.where(sampled, temperature, torch.ones_like(temperature))
        warped = top_h_(scaled.reshape(-1, scaled.shape[-1]), top_h).reshape(scaled.shape)
        unit = replace(params, temperature=sampled.reshape(-1).to(params.temperature.dtype))
        x = standardise(torch.where(sampled, warped, scaled), unit)
    rows = x.reshape(-1, x.shape[-1])
    if typical_p < 1.0:
        rows = typical_(rows, typical_p)
    if epsilon_cutoff > 0.0:
        rows = epsilon_(rows, epsilon_cutoff)
    if eta_cutoff > 0.0:
        rows = eta_(rows, eta_cutoff)
    return rows.reshape(x.shape)
