"""The verify step in plain torch: the spec, the CPU fallback and the test oracle.

Written for clarity, not speed. Semantics (docs/architecture.md §6; Chen et al. Algorithm 2):

standardise(logits): float32, in this order, per row (transformers' logits warpers):
    temperature == 0  -> greedy: 0 at argmax of the raw logits (ties: lowest index), -inf elsewhere
    x = logits / temperature
    top_k > 0         -> x < (k-th largest x) becomes -inf (ties with the k-th are kept)
    top_p < 1         -> with P = softmax(x): x becomes -inf where the mass of tokens strictly
                         more probable than it is >= top_p (ties at the boundary are all kept)
    min_p > 0         -> with P = softmax(x): x becomes -inf where P < min_p * max(P)

chain_verify, row b with K_b real drafts x_0..x_{K_b-1} (the first -1 starts padding):
    p_i = softmax(standardise(draft_logits_i)), or one-hot(x_i) when draft_logits is None
    q_i = softmax(standardise(target_logits_i))
    accept x_i iff p_i(x_i) > 0 and u_i * p_i(x_i) < q_i(x_i),  u_i = uniform(STREAM_ACCEPT, i, 0)
    j = number of accepted drafts before the first rejection
    j < K_b:  y = argmax_v log(max(q_j - p_j, 0))(v) + G_j(v)   (residual, Gumbel-max)
              where the residual has no positive entry: y = argmax_v std_j(v) + G_j(v)  (y ~ q_j)
    j = K_b:  y = argmax_v std_j(v) + G_j(v)  (bonus, y ~ q_j)
    with std_j = standardise(target_logits_j) and G_j(v) = gumbel(STREAM_TOKEN, position j, vocab v).
    tokens[b] = x_0..x_{j-1}, y, then -1;  num_accepted[b] = j.

Penalties (penalties=PenaltyTensors; kernels/penalties/reference.py): every distribution's raw
logits are penalised before standardise, target position i (0..K) and draft position i (0..K-1)
alike with the row's state plus the drafts x_0..x_{i-1} (the drafter sampled x_i from its
penalised logits after the same prefix); sample(): the state plus prefix_tokens.
"""
import torch

from ..penalties.reference import penalised_logits
from ..rng import STREAM_ACCEPT, STREAM_DRAFT, STREAM_TOKEN
from ..rng.reference import gumbel, random_bits, uniform
from ..sampling_params import SamplingTensors


def _rows(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """[B] -> [B, 1, ..., 1] with ndim dims in all."""
    return t.reshape(t.shape[0], *([1] * (ndim - 1)))


def standardise(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """logits [B, N, V] (any float dtype) -> float32 [B, N, V] standardised logits (-inf = removed)."""
    x = logits.float()
    vocab = x.shape[-1]
    temperature, top_k = _rows(params.temperature, 3), _rows(params.top_k.long(), 3)
    top_p, min_p = _rows(params.top_p, 3), _rows(params.min_p, 3)
    neg_inf = torch.tensor(float("-inf"), device=x.device)

    x = x / torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    # top-k: the k-th largest value is the threshold; equal values stay.
    ordered = torch.sort(x, dim=-1, descending=True).values
    kth = ordered.gather(-1, (top_k - 1).clamp(0, vocab - 1).expand(*x.shape[:-1], 1))
    x = torch.where((top_k > 0) & (x < kth), neg_inf, x)
    # top-p: mass strictly above each token, from an ascending sort (float64 sums).
    probs = torch.softmax(x, dim=-1).double()
    ascending = torch.sort(probs, dim=-1).values
    cumulative = ascending.cumsum(-1)
    at_most = torch.searchsorted(ascending, probs, right=True)  # count of tokens with P <= P(x)
    mass_le = cumulative.gather(-1, (at_most - 1).clamp(min=0))
    mass_above = cumulative[..., -1:] - mass_le
    x = torch.where((top_p < 1) & (mass_above >= top_p.double()), neg_inf, x)
    # min-p, relative to the most probable token.
    probs = torch.softmax(x, dim=-1)
    x = torch.where((min_p > 0) & (probs < min_p * probs.amax(-1, keepdim=True)), neg_inf, x)
    # greedy rows: one-hot at the argmax of the raw logits.
    argmax = logits.float().argmax(-1, keepdim=True)
    greedy = torch.full_like(x, float("-inf")).scatter(-1, argmax, 0.0)
    return torch.where(temperature == 0, greedy, x)


def _token_noise(params: SamplingTensors, position: torch.Tensor, stream: int, vocab: int) -> torch.Tensor:
    """Gumbel noise [B, V] for each row's ``position`` [B] in ``stream``."""
    v = torch.arange(vocab, device=position.device, dtype=torch.int64)
    bits = random_bits(params.seed[:, None], params.offset[:, None], position.long()[:, None], stream, v[None, :])
    return gumbel(bits)


def _penalties_on(penalties) -> bool:
    return penalties is not None and bool(penalties.active)


def sample_reference(logits: torch.Tensor, params: SamplingTensors, position=0, stream: int = STREAM_DRAFT,
                     penalties=None, prefix_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from standardise(logits): logits [B, V] -> int32 [B] (Gumbel-max).
    penalties: PenaltyTensors or None; prefix_tokens [B, W] int (-1 = not a token) or None: the
    row's generated tokens the state does not hold yet (the drafts of this iteration)."""
    logits = logits[:, None, :]
    if _penalties_on(penalties):
        first = 0 if prefix_tokens is None else prefix_tokens.shape[1]
        logits = penalised_logits(logits, penalties, prefix_tokens, first)
    std = standardise(logits, params)[:, 0]
    pos = torch.as_tensor(position, device=logits.device, dtype=torch.int64).expand(logits.shape[0])
    return (std + _token_noise(params, pos, stream, logits.shape[-1])).argmax(-1).to(torch.int32)


def chain_verify_reference(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingTensors,
    penalties=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """target_logits [B, K+1, V], draft_logits [B, K, V] or None, draft_tokens [B, K] (-1 pads)
    -> tokens int32 [B, K+1] (-1 padded), num_accepted int32 [B]. penalties: PenaltyTensors or
    None (position i sees the state plus draft_tokens[:, :i])."""
    if _penalties_on(penalties):
        target_logits = penalised_logits(target_logits, penalties, draft_tokens)
        if draft_logits is not None:
            draft_logits = penalised_logits(draft_logits, penalties, draft_tokens)
    batch, k_plus_1, vocab = target_logits.shape
    k = k_plus_1 - 1
    device = target_logits.device
    rows = torch.arange(batch, device=device)
    positions = torch.arange(k, device=device)

    std_q = standardise(target_logits, params)
    q = torch.softmax(std_q, dim=-1)
    drafts = draft_tokens.long()
    num_drafts = (drafts >= 0).long().cumprod(1).sum(1)  # K_b: drafts before the first -1
    x = drafts.clamp(min=0)
    if draft_logits is None:
        p = torch.nn.functional.one_hot(x, vocab).float()
    else:
        p = torch.softmax(standardise(draft_logits, params), dim=-1)
    p_x = p.gather(-1, x[..., None])[..., 0]
    q_x = q[:, :k].gather(-1, x[..., None])[..., 0]

    u = uniform(random_bits(params.seed[:, None], params.offset[:, None], positions[None, :], STREAM_ACCEPT, 0))
    accept = (positions[None, :] < num_drafts[:, None]) & (p_x > 0) & (u * p_x < q_x)
    num_accepted = accept.int().cumprod(1).sum(1) if k else torch.zeros_like(rows)

    j = num_accepted.long()
    noise = _token_noise(params, j, STREAM_TOKEN, vocab)
    from_q = (std_q[rows, j] + noise).argmax(-1)
    rejected = j < num_drafts
    if k:
        residual = (q[rows, j] - p[rows, j.clamp(max=k - 1)]).clamp(min=0)
        from_residual = (torch.log(residual) + noise).argmax(-1)
        y = torch.where(rejected & (residual > 0).any(-1), from_residual, from_q)
    else:
        y = from_q

    tokens = torch.full((batch, k_plus_1), -1, dtype=torch.int64, device=device)
    tokens[:, :k] = torch.where(positions[None, :] < j[:, None], x, torch.full_like(x, -1))
    tokens[rows, j] = y
    return tokens.to(torch.int32), num_accepted.to(torch.int32)
