"""Dynamic token trees (EAGLE-2 style) with static shapes: per row, per level, on the device.

A dynamic TokenTree fixes n_d, the number of nodes at each depth d (so N, the depths and every
call shape are static: CUDA-graph safe). Which node of depth d - 1 each depth-d node hangs on
(its parent) and its rank are chosen per row when depth d - 1's logits are known:

    candidates  (e, r): depth d - 1's node e (slot among that depth's nodes) x rank r < R_d
                (R_1 = n_1: the root alone; deeper R_d = min(n_d, RANK_CAP))
    score       log path score of e + log of the child's estimated acceptance:
                  top-b children (greedy rows; children "top"): the draft's log-probability of
                    its r-th most probable token (EAGLE-2: path probability x draft probability)
                    under softmax(logits / (T * score_temperature)): the demo draft is flat and
                    under-confident (mean top-1 probability 0.29, accepted 0.76 of the time); the
                    greedy target token's NLL under it is lowest at score_temperature 0.3 (0.4
                    for the noisier draft), calibration prompts of bench/bench_tree.py;
                  sampled children (children "sample", sampling rows): log acceptance[d][r], the
                    measured P(the accepted child has rank r) (non-increasing: a running minimum),
                    + SAMPLED_CONFIDENCE_WEIGHT x log max p at e (the draft's confidence there).
                    The number of children of a parent is fixed from the parents' scores before
                    any child is sampled and never depends on the children's values, so the
                    children stay i.i.d. samples from p (Chen et al. Alg. 2 / SpecInfer need it).
    keep        the n_d best candidates per row (a stable sort: ties go to the lower (e, r), so a
                parent's kept ranks are 0..k-1), in (e, r) order: BFS order, siblings by rank.
    path score  a node's log path score = its candidate score (T = 1 on greedy rows; top-k / top-p
                are not applied: a sort over V per node per level for an estimate).

Outputs, updated in place each step (the verify and the stats read them; graph safe):
    parents [B, N] int64, ranks [B, N] int64, mask [B, N] int64 (bit j of mask[b, i]: node j is
    node i's ancestor or i itself: mask[i] = mask[parent[i]] | bit i, level by level).
The draft's re-feed calls feed nodes 1..end - 1: their masks are mask >> 1 (a logical shift:
bit 63 -> 62, the sign bit cleared).
"""
import dataclasses
import math

import torch

from ..kernels.rng import STREAM_DRAFT
from ..kernels.sampling_params import SamplingTensors, refill_params
from .token_tree import DEMO_RANK_ACCEPTANCE, TokenTree, _acceptance_rows

RANK_CAP = 8  # ranks tried per parent below depth 1 (the measured acceptance profiles hold 8 ranks)
# Sampled children: a node's score adds log acceptance[d][rank] + this x log max_v p(v) at its
# parent (the draft's confidence there). Demo pair, sampling T 0.8 / top-p 0.95, 6 prompts x 2
# seeds, 32 / 64 nodes, tokens per step (static tree 5.28 / 6.06): weight 0.5: 5.48 / 6.33;
# 1.0: 5.17 / 5.98; 0 reproduces the static best-first tree. Scoring by the sampled token's own
# probability (EAGLE-2's path probability) instead: 3.84 / 3.79 (the demo draft is flat: its
# top-1 probability averages 0.29 where the target accepts it 0.76 of the time).
SAMPLED_CONFIDENCE_WEIGHT = 0.5
LOW_63_BITS = (1 << 63) - 1


def rank_widths(tree: TokenTree) -> list:
    """R_d for d = 1..D: the ranks a node of depth d may have (static tree: its largest rank + 1)."""
    widths = []
    for d in range(1, tree.depth + 1):
        nodes = tree.level(d)
        if tree.dynamic:
            widths.append(len(nodes) if d == 1 else min(len(nodes), RANK_CAP))
        else:
            widths.append(max(tree.ranks[i] for i in nodes) + 1)
    return widths


def node_bits(n: int, device) -> torch.Tensor:
    """int64 [n]: 1 << i (bit 63 as the int64 sign bit)."""
    return torch.tensor([(1 << i) if i < 63 else -(1 << 63) for i in range(n)], dtype=torch.int64, device=device)


def log_rank_acceptance(tree: TokenTree, depth: int, width: int) -> list:
    """log P(accepted child has rank r) at ``depth`` for r < width, non-increasing in r."""
    rows = _acceptance_rows(tree.acceptance if tree.acceptance is not None else DEMO_RANK_ACCEPTANCE["sampling"])
    row = rows[min(depth, len(rows)) - 1]
    out, low = [], 1.0
    for r in range(width):
        low = min(low, row[r] if r < len(row) else 0.0)
        out.append(math.log(low) if low > 0 else float("-inf"))
    return out


@dataclasses.dataclass
class DynamicLevel:
    """Depth d: its nodes [start, end), depth d - 1's nodes (expanding [E], all of them) and
    their rows among the previous call's logits, the rank width R, log acceptance per rank [R]
    (sampled children), and per-child sampling rows (row index, noise positions, params)."""

    start: int
    end: int
    expanding: torch.Tensor
    parent_rows: torch.Tensor
    width: int
    log_acceptance: torch.Tensor
    row_index: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    params: SamplingTensors | None = None


class DynamicExpansion:
    """The per-row choice of a dynamic tree's parents and ranks (TreeDrafter uses it).

    sample(rows [M, V], params, positions [M], stream) -> int32 [M]: the backend's sampler."""

    def __init__(self, tree: TokenTree, state, sample):
        if not tree.dynamic:
            raise ValueError("DynamicExpansion needs a dynamic TokenTree")
        self.tree, self.sample = tree, sample
        batch, dev = state.seq.shape[0], state.seq.device
        long = dict(dtype=torch.long, device=dev)
        n = tree.size
        static = tree.tensors(dev)  # the skeleton: valid contents before the first propose
        self.parents = static["parents"].repeat(batch, 1)
        self.ranks = static["ranks"].repeat(batch, 1)
        self.mask = static["mask"].repeat(batch, 1)
        self.log_score = torch.zeros(batch, n, dtype=torch.float32, device=dev)
        self.bits = node_bits(n, dev)
        # Sampled children where some row may sample (params.modes, known on the host): an all-greedy
        # batch takes the top-b on every row and skips the sampler.
        modes = state.params.modes
        self.sampled = tree.children == "sample" and (modes is None or set(modes) != {"greedy"})
        # Rows whose children are the top-b: greedy rows always; every row with children "top".
        greedy = state.params.temperature == 0
        self.top_rows = greedy if self.sampled else torch.ones_like(greedy)
        self.inv_temperature = self._inv_temperature(state.params.temperature, greedy)
        self.levels = []
        for d, width in enumerate(rank_widths(tree), 1):
            nodes, above = tree.level(d), tree.level(d - 1)
            level = DynamicLevel(
                start=nodes[0], end=nodes[-1] + 1,
                expanding=torch.tensor(above, **long),
                parent_rows=torch.tensor([0] if d == 1 else [e - 1 for e in above], **long),
                width=width,
                log_acceptance=torch.tensor(log_rank_acceptance(tree, d, width), dtype=torch.float32, device=dev),
            )
            if self.sampled:
                n_d = len(nodes)
                level.row_index = torch.arange(batch, **long).repeat_interleave(n_d)
                level.positions = torch.tensor([i - 1 for i in nodes], **long).repeat(batch)
                level.params = state.params.select_rows(level.row_index)
            self.levels.append(level)

    def refresh(self, state) -> None:
        """A later call of the same batch size and modes: every tensor built from the parameters
        re-filled in place (captured graphs read them), the tree back to its skeleton."""
        static = self.tree.tensors(state.seq.device)
        self.parents.copy_(static["parents"].expand_as(self.parents))
        self.ranks.copy_(static["ranks"].expand_as(self.ranks))
        self.mask.copy_(static["mask"].expand_as(self.mask))
        self.log_score.zero_()
        greedy = state.params.temperature == 0
        self.top_rows.copy_(greedy if self.sampled else torch.ones_like(greedy))
        self.inv_temperature.copy_(self._inv_temperature(state.params.temperature, greedy))
        for level in self.levels:
            if level.params is not None:
                refill_params(level.params, state.params.select_rows(level.row_index))

    def _inv_temperature(self, temperature: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
        """[B, 1, 1]: 1 / (T * score temperature), T = 1 for greedy rows."""
        return (torch.where(greedy, torch.ones_like(temperature), temperature) * self.tree.score_temperature).reciprocal()[:, None, None]

    def expand(self, d: int, parent_logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        """Depth d's tokens [B, n_d] from depth d - 1's logits [B, E, V]; writes the nodes'
        parents, ranks, masks and log path scores in place."""
        level = self.levels[d - 1]
        batch, num_parents, vocab = parent_logits.shape
        n_d, width = level.end - level.start, min(level.width, vocab)
        logp = torch.log_softmax(parent_logits.float() * self.inv_temperature, dim=-1)  # [B, E, V]
        top_logp, top_tokens = logp.topk(width, dim=-1)  # [B, E, R]
        parent_score = self.log_score.index_select(1, level.expanding)  # [B, E]
        candidates = parent_score[:, :, None] + top_logp
        if self.sampled:
            allocation = parent_score[:, :, None] + level.log_acceptance[:width]
            candidates = torch.where(self.top_rows[:, None, None], candidates, allocation)
        # The n_d best (parent, rank) pairs per row; ties to the lower pair; then in (parent, rank) order.
        order = torch.sort(candidates.reshape(batch, -1), dim=-1, descending=True, stable=True).indices
        keep = torch.sort(order[:, :n_d], dim=-1).values  # [B, n_d]
        slot, rank = keep // width, keep % width
        tokens = top_tokens.reshape(batch, -1).gather(1, keep)
        score = parent_score.gather(1, slot) + top_logp.reshape(batch, -1).gather(1, keep)
        if self.sampled:
            rows = parent_logits.gather(1, slot[:, :, None].expand(-1, -1, vocab)).reshape(-1, vocab)  # [B * n_d, V]
            child_params = dataclasses.replace(level.params, offset=params.offset[level.row_index])
            sampled = self.sample(rows, child_params, level.positions, STREAM_DRAFT).long().view(batch, n_d)
            confidence = logp.max(dim=-1).values.gather(1, slot)  # log max_v p(v) at each child's parent
            sampled_score = parent_score.gather(1, slot) + level.log_acceptance[rank] + SAMPLED_CONFIDENCE_WEIGHT * confidence
            top = self.top_rows[:, None]
            tokens = torch.where(top, tokens, sampled)
            score = torch.where(top, score, sampled_score)
        parent = level.expanding[slot]  # node indices [B, n_d]
        self.parents[:, level.start:level.end] = parent
        self.ranks[:, level.start:level.end] = rank
        self.log_score[:, level.start:level.end] = score
        self.mask[:, level.start:level.end] = self.mask.gather(1, parent) | self.bits[level.start:level.end]
        return tokens

    def feed_mask(self, end: int) -> torch.Tensor:
        """int64 [B, end - 1]: the masks of a draft call feeding nodes 1..end - 1 (positions node - 1)."""
        return (self.mask[:, 1:end] >> 1) & LOW_63_BITS
