"""tree_verify in plain torch: the spec, the CPU fallback and the test oracle.

The tree of row b has N nodes in topological (BFS) order. Node 0 is the root: the last token
already emitted (its own token is not read). For i >= 1, parents[b, i] is node i's parent,
in [0, i), or -1: node i is absent (ragged rows). A node is *present* when it is the root, or
its parent lies in [0, i) and is present; tokens[b, i] is present node i's token. The
children of a node are the present nodes whose parent it is, in index order (the drafter's
order: its rank or sample order). target_logits[b, n] / draft_logits[b, n] are the target's /
the draft's logits after node n's path (the distribution of n's children); draft rows of nodes
without children are never read.

q_n = softmax(standardise(target_logits[b, n])), p_n = softmax(standardise(draft_logits[b, n]))
(kernels/verify/reference.py: temperature -> top-k -> top-p -> min-p, same parameters for both).

Sampling rows (temperature > 0): recursive rejection sampling down the tree (Chen et al.
Algorithm 2 per step; SpecInfer's multi-draft rule over siblings). At node n, with residual
state (lam, W) = (0, 1), try n's children c in order, token x = tokens[c], coin
u_c = uniform(STREAM_ACCEPT, position c - 1, vocab index 0):
  sampled children (draft_logits given; children i.i.d. from p_n):
      accept iff p_n(x) > 0 and (u_c * p_n(x)) * W < max(q_n(x) - lam * p_n(x), 0)
      reject:  lam <- lam + W;  W <- sum_v max(q_n(v) - lam * p_n(v), 0)
    After k rejections the target distribution at n is r_k = max(q_n - lam_k p_n, 0) / W_k,
    which is normalise(max(r_{k-1} - p_n, 0)): the test accepts x w.p. min(1, r_k(x) / p_n(x)).
  deterministic children (draft_logits None; p = one-hot at each child, e.g. the draft's top-b):
      accept iff x is no earlier sibling's token and u_c * W < q_n(x)
      reject:  W <- W - q_n(x) (unless x repeats a sibling's token);  lam <- 1
    r = q_n with the rejected tokens removed, over its mass W: accepts x w.p. r(x).
  The first accepted child becomes the current node (its path extends by one); a node whose
  children are all rejected, or that has none, ends the walk: it is the final node f, at
  depth j = the number of accepted nodes. The emitted token, with
  G(v) = gumbel(STREAM_TOKEN, position j, vocab v) and std_f = standardise(target_logits[b, f]):
      f has no children:      y = argmax_v std_f(v) + G(v)                    (bonus, y ~ q_f)
      f's children rejected:  r = max(q_f - lam * p~_f, 0), p~_f = p_f (sampled) or the
                              indicator of f's children's tokens (deterministic, lam = 1);
                              y = argmax_v log r(v) + G(v), or argmax std_f + G where r has
                              no positive entry (y ~ q_f)
  A residual with no mass (W = 0, only when q_n == p_n up to rounding) rejects every later
  sibling. Float32 throughout, in the order written.
Greedy rows (temperature == 0): a child c is good when tokens[c] is the argmax of the raw
target logits at its parent (ties: lowest index). The accepted path is the longest path of
good nodes from the root (ties: at each node the lowest-index child among the longest); y is
the argmax at its final node. No randomness.

A chain (parents[i] = i - 1) reproduces chain_verify exactly: the same coins (position c - 1
= draft index), the same residual (lam = 1: max(q - p, 0)) and the same emission noise.
(Greedy rows differ in one corner: chain_verify also rejects a draft the draft's own argmax
did not pick, p(x) = 0; a drafter never proposes one.)

Outputs: tokens int32 [B, N] (tokens of the accepted nodes in path order, then y, then -1; the
chain convention), path int32 [B, N] ([0, a_1, ..., a_j] then -1: node indices, ready for
compact_kv), num_accepted int32 [B] (= j).
"""
import torch

from ..rng import STREAM_ACCEPT, STREAM_TOKEN
from ..rng.reference import random_bits, uniform
from ..sampling_params import SamplingTensors
from ..verify.reference import _token_noise, standardise


def present_nodes(parents: torch.Tensor) -> torch.Tensor:
    """parents [B, N] -> bool [B, N]: the root, and nodes whose parent lies before them and is present."""
    batch, n = parents.shape
    par = parents.long()
    present = torch.zeros(batch, n, dtype=torch.bool, device=parents.device)
    present[:, 0] = True
    for i in range(1, n):
        pi = par[:, i]
        ok = (pi >= 0) & (pi < i)
        present[:, i] = ok & present.gather(1, pi.clamp(0, n - 1)[:, None])[:, 0]
    return present


def _greedy_choice(present, par, tok, amax) -> torch.Tensor:
    """choice [B, N]: at each node, its child on a longest path of good nodes, or -1."""
    batch, n = par.shape
    best = torch.zeros(batch, n, dtype=torch.long, device=par.device)
    choice = torch.full((batch, n), -1, dtype=torch.long, device=par.device)
    for i in range(n - 1, 0, -1):  # descending: a node's children are final before it is read
        pi = par[:, i].clamp(0, n - 1)[:, None]
        good = present[:, i] & (tok[:, i] == amax.gather(1, pi)[:, 0])
        cand = best[:, i] + 1
        upd = (good & (cand >= best.gather(1, pi)[:, 0]))[:, None]  # '>=': lower indices, seen later, win ties
        best.scatter_(1, pi, torch.where(upd, cand[:, None], best.gather(1, pi)))
        choice.scatter_(1, pi, torch.where(upd, torch.full_like(pi, i), choice.gather(1, pi)))
    return choice


def tree_verify_reference(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    params: SamplingTensors,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """target_logits [B, N, V], draft_logits [B, N, V] or None, tokens [B, N], parents [B, N]
    -> tokens int32 [B, N], path int32 [B, N], num_accepted int32 [B] (see the module doc).
    Written as one ascending scan over the nodes (a node's parent comes first, so the scan
    walks the tree), vectorised over rows: no host sync."""
    batch, n, vocab = target_logits.shape
    device = target_logits.device
    rows = torch.arange(batch, device=device)
    par = parents.long()
    tok = tokens.long().clamp(0, vocab - 1)
    present = present_nodes(parents)
    greedy = params.temperature == 0

    std_q = standardise(target_logits, params)
    q = torch.softmax(std_q, dim=-1)
    p = None if draft_logits is None else torch.softmax(standardise(draft_logits, params), dim=-1)
    choice = _greedy_choice(present, par, tok, target_logits.float().argmax(-1))
    positions = (torch.arange(n, device=device) - 1).clamp(min=0)  # node c's coin: position c - 1
    u = uniform(random_bits(params.seed[:, None], params.offset[:, None], positions[None, :], STREAM_ACCEPT, 0))
    node_index = torch.arange(n, device=device)

    def children_of(node: torch.Tensor) -> torch.Tensor:
        return present & (par == node[:, None]) & (node_index[None, :] > 0)

    cur = torch.zeros(batch, dtype=torch.long, device=device)
    j = torch.zeros(batch, dtype=torch.long, device=device)
    lam = torch.zeros(batch, dtype=torch.float32, device=device)
    mass = torch.ones(batch, dtype=torch.float32, device=device)
    path = torch.full((batch, n), -1, dtype=torch.long, device=device)
    path[:, 0] = 0
    zero, one = torch.zeros_like(lam), torch.ones_like(lam)
    for c in range(1, n):
        child = present[:, c] & (par[:, c] == cur)
        x = tok[:, c]
        q_x = q[rows, cur, x]
        if p is not None:
            p_x = p[rows, cur, x]
            ok = (p_x > 0) & (u[:, c] * p_x * mass < (q_x - lam * p_x).clamp(min=0))
            lam_rej = lam + mass
            mass_rej = (q[rows, cur] - lam_rej[:, None] * p[rows, cur]).clamp(min=0).sum(-1)
        else:
            earlier = children_of(cur) & (node_index[None, :] < c) & (tok == x[:, None])
            repeat = earlier.any(1)
            ok = ~repeat & (u[:, c] * mass < q_x)
            lam_rej = one
            mass_rej = torch.where(repeat, mass, mass - q_x)
        ok = torch.where(greedy, choice[rows, cur] == c, ok)
        accept = child & ok
        reject = child & ~ok & ~greedy
        lam = torch.where(accept, zero, torch.where(reject, lam_rej, lam))
        mass = torch.where(accept, one, torch.where(reject, mass_rej, mass))
        cur = torch.where(accept, c, cur)
        j = j + accept.long()
        path[rows, j] = torch.where(accept, c, path[rows, j])

    # Emission at the final node cur (depth j).
    noise = _token_noise(params, j, STREAM_TOKEN, vocab)
    from_q = (std_q[rows, cur] + noise).argmax(-1)
    if p is not None:
        p_f = p[rows, cur]
    else:
        p_f = torch.zeros(batch, vocab, device=device).scatter_add_(1, tok, children_of(cur).float()).clamp(max=1.0)
    residual = (q[rows, cur] - lam[:, None] * p_f).clamp(min=0)
    from_residual = (torch.log(residual) + noise).argmax(-1)
    rejected = (lam > 0) & ~greedy
    y = torch.where(rejected & (residual > 0).any(-1), from_residual, from_q)

    out = torch.full((batch, n), -1, dtype=torch.long, device=device)
    if n > 1:  # slot d holds the token of the path's node at depth d + 1
        out[:, :-1] = torch.where(node_index[None, :-1] < j[:, None], tok.gather(1, path[:, 1:].clamp(min=0)), -1)
    out[rows, j] = y
    return out.to(torch.int32), path.to(torch.int32), j.to(torch.int32)
