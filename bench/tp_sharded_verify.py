"""The alternative to gathering the logits (bench/bench_tp.py measures both): chain_verify on
vocab-parallel target logits, with small all-gathers of each row's statistics. A prototype for
the measurement, in plain torch, for greedy and temperature-only rows (no top-k / top-p / min-p:
those need a distributed selection, one or two more rounds; no penalties or processors, which
read whole rows), a replicated draft (its logits whole on every rank) -- the semantics of
kernels/verify/reference.py, the same counter-based randomness.

Two collective rounds per verify, each an all-gather of a few numbers per row:
  round 1  per row and position i (K+1): the shard's max and sum of exp of the standardised
           target logits, the logit of draft x_i when x_i is in the shard, and (greedy) the
           shard's argmax -> every rank: q_i(x_i), the accept test, j, greedy acceptance.
  round 2  at position j: the shard's best residual candidate (log max(q_j - p_j, 0) + Gumbel)
           and best bonus candidate (std_q_j + Gumbel), and whether the shard has residual mass
           -> every rank: the emitted token y (ties to the lowest vocabulary index).
Each rank runs ``local_round1`` / ``local_round2`` on its shard; ``combine1`` / ``combine2``
merge the gathered [N, ...] stats in rank order, so every rank gets the same answer.
"""
import torch

from specdec_fast.kernels.rng import STREAM_ACCEPT, STREAM_TOKEN
from specdec_fast.kernels.rng.reference import gumbel, random_bits, uniform


def _std(logits: torch.Tensor, params) -> torch.Tensor:
    """Temperature only: logits / T (greedy rows: T = 1 here; handled by the argmax)."""
    t = params.temperature.float()
    return logits.float() / torch.where(t > 0, t, torch.ones_like(t)).view(-1, *([1] * (logits.dim() - 1)))


def local_round1(local: torch.Tensor, drafts: torch.Tensor, params, start: int) -> torch.Tensor:
    """local [B, K+1, Vr] target logits of vocabulary [start, start + Vr); drafts [B, K] (-1 pads)
    -> stats [B, K+1, 5] float64: max, sum of exp(x - max), logit of draft i here (-inf if not
    here or i = K), the shard's argmax (global index) and max of the raw logits (greedy rows)."""
    batch, n, part = local.shape
    std = _std(local, params)
    m = std.amax(-1)
    s = torch.exp(std - m[..., None]).sum(-1)
    x = torch.full((batch, n), -1, dtype=torch.long)
    x[:, : n - 1] = drafts.long()
    here = (x >= start) & (x < start + part)
    z = std.gather(-1, (x - start).clamp(0, part - 1)[..., None])[..., 0]
    z = torch.where(here, z, torch.full_like(z, float("-inf")))
    raw_max, raw_arg = local.float().max(-1)
    return torch.stack([m.double(), s.double(), z.double(), (raw_arg + start).double(), raw_max.double()], -1)


def combine1(stats: torch.Tensor, drafts: torch.Tensor, draft_logits, params):
    """stats [N, B, K+1, 5] (rank order) -> (j [B] accepted, M [B, K+1], S [B, K+1], argmax [B, K+1])."""
    m, s, z, arg, raw = stats.unbind(-1)
    big_m = m.amax(0)
    big_s = (s * torch.exp(m - big_m)).sum(0)
    best = raw.argmax(0)  # the first rank holding the max: lowest vocabulary index among ties
    argmax = arg.gather(0, best[None])[0].long()
    batch, n = big_m.shape
    k = n - 1
    q_x = torch.exp(z.amax(0) - big_m) / big_s  # [B, K+1] (only one rank holds x_i)
    drafts = drafts.long()
    num_drafts = (drafts >= 0).long().cumprod(1).sum(1)
    pos = torch.arange(k)
    greedy = params.temperature == 0
    if draft_logits is None:
        p_x = torch.ones(batch, k, dtype=torch.float64)
    else:
        p_x = torch.softmax(_std(draft_logits, params), -1).gather(-1, drafts.clamp(min=0)[..., None])[..., 0].double()
    u = uniform(random_bits(params.seed[:, None], params.offset[:, None], pos[None, :], STREAM_ACCEPT, 0))
    accept = (pos[None, :] < num_drafts[:, None]) & (p_x > 0) & (u * p_x < q_x[:, :k])
    accept_greedy = (pos[None, :] < num_drafts[:, None]) & (drafts == argmax[:, :k])
    accept = torch.where(greedy[:, None], accept_greedy, accept)
    j = accept.long().cumprod(1).sum(1)
    return j, num_drafts, big_m, big_s, argmax


def local_round2(local, draft_logits, params, start: int, j, num_drafts, big_m, big_s) -> torch.Tensor:
    """At each row's position j: [B, 5] float64: best residual value, its global index, best bonus
    value, its index, 1 if the shard has residual mass."""
    batch, n, part = local.shape
    rows = torch.arange(batch)
    std = _std(local, params)[rows, j]  # [B, Vr]
    q = torch.exp(std.double() - big_m[rows, j][:, None]) / big_s[rows, j][:, None]
    v = torch.arange(start, start + part)
    noise = gumbel(random_bits(params.seed[:, None], params.offset[:, None], j[:, None], STREAM_TOKEN, v[None, :]))
    if draft_logits is None or n == 1:
        residual = torch.zeros_like(q)
    else:
        p = torch.softmax(_std(draft_logits, params), -1)[rows, j.clamp(max=n - 2), start:start + part].double()
        residual = (q - p).clamp(min=0)
    res_val, res_arg = (torch.log(residual) + noise).max(-1)
    bonus_val, bonus_arg = (std.double() + noise).max(-1)
    mass = (residual > 0).any(-1).double()
    return torch.stack([res_val, (res_arg + start).double(), bonus_val, (bonus_arg + start).double(), mass], -1)


def combine2(cands: torch.Tensor, params, j, num_drafts, argmax, drafts) -> tuple:
    """cands [N, B, 5] -> (tokens [B, K+1] int32, num_accepted [B] int32), as chain_verify returns."""
    res_val, res_arg, bonus_val, bonus_arg, mass = cands.unbind(-1)
    rows = torch.arange(res_val.shape[1])
    res = res_arg[res_val.argmax(0), rows].long()  # argmax picks the first rank among equal values
    bonus = bonus_arg[bonus_val.argmax(0), rows].long()
    rejected = j < num_drafts
    y = torch.where(rejected & (mass.amax(0) > 0), res, bonus)
    y = torch.where(params.temperature == 0, argmax[rows, j], y)
    k = drafts.shape[1]
    tokens = torch.full((rows.shape[0], k + 1), -1, dtype=torch.long)
    pos = torch.arange(k)
    tokens[:, :k] = torch.where(pos[None, :] < j[:, None], drafts.long(), -1)
    tokens[rows, j] = y
    return tokens.int(), j.int()


def sharded_verify(local, draft_logits, drafts, params, start: int, gather) -> tuple:
    """One rank's verify: gather(t [..]) -> [N, ..] (an all-gather over the ranks, rank order)."""
    j, num_drafts, big_m, big_s, argmax = combine1(gather(local_round1(local, drafts, params, start)), drafts,
                                                   draft_logits, params)
    cands = gather(local_round2(local, draft_logits, params, start, j, num_drafts, big_m, big_s))
    return combine2(cands, params, j, num_drafts, argmax, drafts)


def simulate(target_logits, draft_logits, drafts, params, ranks: int) -> tuple:
    """The N ranks' computation in one process (tests, the bench's correctness check)."""
    part = target_logits.shape[-1] // ranks
    shards = [target_logits[..., r * part:(r + 1) * part] for r in range(ranks)]
    stats = torch.stack([local_round1(s, drafts, params, r * part) for r, s in enumerate(shards)])
    j, num_drafts, big_m, big_s, argmax = combine1(stats, drafts, draft_logits, params)
    cands = torch.stack([local_round2(s, draft_logits, params, r * part, j, num_drafts, big_m, big_s)
                         for r, s in enumerate(shards)])
    return combine2(cands, params, j, num_drafts, argmax, drafts)
