"""SelectorBlockDrafter: DFlash2's drafter (heads/dflash2.py): DFlash's block (drafters/block.py:
the same context bookkeeping, the same one forward per iteration, runners/paged_dflash2.py) and
then the candidate selector's walk instead of independent positions.

propose(k): the block's norm(h) at positions 1 .. k -> each position's top selector_top_k
candidates of the target's lm_head logits, U = softcap(output_multiplier * logit), the gates
B[c] * P h (heads/dflash2.py); then from the anchor (the last accepted token) one step per
position:
    scores_i = U_i + <A[x_{i-1}], gates_i>          over position i's candidates
    all rows greedy: x_i = the candidate of the largest score (ties: the earlier candidate)
    otherwise:       row_i = scores_i at the candidates, -inf elsewhere [B, V]; processed by the
                     call's logits stage when it has one (as DFlash's rows: drafters/block.py);
                     x_i ~ row_i with the call's temperature / top-k / top-p (the sample kernel,
                     greedy rows its argmax), and row_i is handed to the verify as q_i's logits.
The verify standardises row_i as the sampler did, so q_i is exactly the law x_i was drawn from
(the selector's distribution over the candidates given x_{i-1}, zero elsewhere): the verify's
rule holds (Chen et al. need x_i ~ q_i given x_<i, which a chain satisfies).

With a logits stage, each position is processed ONCE (a user's stateful processor sees every
position once): the row holding the selector's scores at the candidates and U (DFlash's own
logits) elsewhere goes through the stage; the candidates' entries of the result are the row. A
stage can mask every candidate (bad_words_ids, suppress_tokens, a min_length that bans the only
ones left): such a position takes the whole processed row instead (U where it was not masked),
which is then both what x_i is drawn from and q_i; the next step reads A[x_i] whatever x_i is.
For processors that act token by token (penalties, masks, temperature) the candidates' entries
are exactly what processing the candidates alone would give.

Graph safety: torch ops on device tensors only (top-k, gathers, one [B, V] row per position);
no host reads.
"""
import torch

from ..heads.dflash import scale_logits
from ..heads.dflash2 import candidates, edge_scores, successor_gates
from ..runners._linear import linear
from .block import BlockDrafter


class SelectorBlockDrafter(BlockDrafter):
    """runner: the drafter's PagedDFlash2Runner; target: the target's paged runner (BlockDrafter)."""

    def propose(self, k: int):
        """-> drafts [B, k] int64, draft logits [B, k, V] (None when every row is greedy)."""
        runner = self.runner
        h = self._run_block()[:, 1:k + 1]
        logits = linear(h, runner.lm_head)  # [B, k, V]
        ids, unary = candidates(logits, runner.selector_top_k, runner.output_multiplier, runner.final_logit_softcapping)
        gates = successor_gates(h, ids, runner.successor_codebook, runner.selector_projection)  # [B, k, k_s, r]
        previous = self.block[:, 0]  # the anchor: the last accepted token
        stage = getattr(self.state, "stage", None)
        tokens, rows = [], []
        for i in range(k):
            scores = edge_scores(unary[:, i], gates[:, i], runner.predecessor_codebook[previous])  # [B, k_s]
            if not self._logits_needed:
                previous = ids[:, i].gather(1, scores.argmax(-1, keepdim=True))[:, 0]
            else:
                if stage is None:
                    row = torch.full_like(logits[:, i], float("-inf")).scatter_(1, ids[:, i], scores.to(logits.dtype))
                else:
                    # ONE processing call per position (a user's stateful processor sees each position
                    # once): the selector's scores at the candidates, U elsewhere; then the candidates
                    # alone, or the whole processed row where the stage masked every candidate
                    whole = self._unary_row(logits[:, i]).scatter(1, ids[:, i], scores.to(logits.dtype))
                    whole = self._process(whole, tokens)
                    chosen = torch.zeros_like(whole, dtype=torch.bool).scatter_(1, ids[:, i], True)
                    row = torch.where(chosen, whole, float("-inf"))
                    row = torch.where(torch.isfinite(row).any(-1, keepdim=True), row, whole)
                rows.append(row)
                previous = self._draw(row, i, tokens)
            tokens.append(previous)
        return torch.stack(tokens, 1), (torch.stack(rows, 1) if rows else None)

    def _unary_row(self, logits: torch.Tensor) -> torch.Tensor:
        """U over the whole vocabulary [B, V] (the fallback row: module docstring)."""
        return scale_logits(logits, self.runner.output_multiplier, self.runner.final_logit_softcapping)
