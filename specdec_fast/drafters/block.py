"""BlockDrafter: all K drafts of an iteration from ONE forward of a block-parallel drafter (DFlash:
heads/dflash.py, runners/paged_dflash.py) that reads the target's hidden states.

Protocol: drafters/model.py (start / propose / commit).
    start    the target's prefill hidden states of every prompt position become the drafter's
             context (prefill_context); nothing pending
    propose  the pending context entries (the target's hidden states at the positions accepted
             last iteration, 1 .. K+1 per row, left padded) are committed and the block
             [last token, mask_token_id x (block_size - 1)] at positions c .. c + block_size - 1
             runs once; block position i = 1 .. K proposes the token at c + i through the
             target's lm_head (K <= block_size - 1: the first K of the whole block)
    commit   with j drafts accepted, the pending entries become the target's hidden states of
             this verify at indices 0 .. j (positions c .. c + j: the last token and the accepted
             drafts, whose tokens are now committed in the target)

Exact sampling: draft i is drawn from the block's distribution at position i alone (the
positions are independent given the context: the block holds masks, not the earlier drafts),
and that same distribution is the verify's p_i, so chain_verify's rule keeps the target's law
(Chen et al. Theorem 1 asks only that x_i ~ p_i given what precedes it; p_i may ignore x_<i).
Greedy rows: the argmax of each position (p = one-hot: no logits handed over when every row is).

K may change from one iteration to the next (the adaptive schedule: engine/schedule.py): start()
sizes the pending entries for the call's largest K, and every K's drafts are the first K of the
same block.

Graph safety: per (batch size, K) buffers re-filled in place by start(); static shapes; no host
reads. Finished rows feed nothing (num_valid 0 for their context and block) when state.skip_finished.
"""
import dataclasses

import torch

from ..heads.dflash import scale_logits
from ..kernels.rng import STREAM_DRAFT
from ..kernels.verify import prepared_impls
from ..runners._linear import linear


class BlockDrafter:
    """runner: the drafter's PagedDFlashRunner; target: the target's paged runner, capturing the
    hidden states the drafter reads."""

    needs_compact = False
    # The adaptive schedule's cost model (engine/schedule.py): one forward per iteration whatever K
    # (a draft model's cost is per draft step).
    draft_cost = "per_iteration"

    def __init__(self, runner, target):
        if getattr(target, "hidden_capture", None) is None:
            raise ValueError("the target runner must capture the drafter's hidden states (capture_hidden_states)")
        if target.hidden_capture.width != runner.feature_width:
            raise ValueError(f"the drafter's fc reads {runner.feature_width} features, the target captures "
                             f"{target.hidden_capture.width}")
        self.runner, self.target = runner, target
        self.vocab_size = target.vocab_size
        self.block_size = runner.block

    @property
    def graph_safe(self) -> bool:
        return bool(getattr(self.runner, "graph_safe", False) and getattr(self.target, "graph_safe", False))

    def start(self, state, prompt) -> None:
        k = prompt.k
        if k > self.block_size - 1:
            raise ValueError(f"a block of {self.block_size} drafts at most {self.block_size - 1} tokens per iteration, "
                             f"got K = {k}")
        self.state = state
        hidden = self.target.take_prefill_hidden()  # [B, P, W]: every prompt position is context
        self.runner.prefill_context(hidden, prompt.mask, budgets=prompt.budgets, num_draft_tokens=k)
        batch, dev = state.seq.shape[0], state.seq.device
        buffers = self.__dict__.setdefault("_buffers", {})
        key = (batch, k)
        if key not in buffers:
            long = dict(dtype=torch.long, device=dev)
            buffers[key] = (torch.zeros(batch, k + 1, hidden.shape[-1], dtype=self.target.dtype, device=dev),
                            torch.zeros(batch, **long), torch.full((batch, self.block_size), self.runner.mask_token_id,
                                                                   **long),
                            torch.full((batch,), self.block_size, **long), torch.arange(k + 1, **long)[None, :],
                            [torch.full((batch,), i, **long) for i in range(k)], torch.zeros(batch, 0, **long))
        (self.pend_features, self.num_pending, self.block, self._full_block, self._slots,
         self._positions, self._no_drafts) = buffers[key]
        self.pend_features.zero_()
        self.num_pending.zero_()
        self._sample = prepared_impls(state.backend, dev)[1]
        self._params = dataclasses.replace(state.params, offset=state.gen_len)
        self._logits_needed = state.params.modes != {"greedy"}

    def propose(self, k: int):
        """-> drafts [B, k] int64, draft logits [B, k, V] (None when every row is greedy)."""
        h = self._run_block()
        runner = self.runner  # [B, k, V]: position i proposes the token at c + i (the published output transform)
        logits = scale_logits(linear(h[:, 1:k + 1], runner.lm_head), runner.output_multiplier,
                              runner.final_logit_softcapping)
        if not self._logits_needed:
            return logits.argmax(-1), None
        tokens, rows = [], []
        for i in range(k):
            rows.append(self._process(logits[:, i], tokens))
            tokens.append(self._draw(rows[-1], i, tokens))
        return torch.stack(tokens, 1), (logits if getattr(self.state, "stage", None) is None else torch.stack(rows, 1))

    # The pieces of propose (drafters/block_selector.py composes them too).
    def _run_block(self) -> torch.Tensor:
        """The block [last token, mask ...] after this iteration's pending context -> norm(h) [B, block_size, H]."""
        st = self.state
        live = st.live if st.skip_finished else None
        fed = self.num_pending if live is None else self.num_pending * live
        self.block[:, 0] = st.last_token()
        return self.runner.draft(self.pend_features, fed, self.block, None if live is None else self._full_block * live)

    def _process(self, row: torch.Tensor, tokens: list) -> torch.Tensor:
        """Position i's draft logits [B, V] (tokens: the drafts before it) -> what it samples from:
        as they are, or processed as the target's at c + i by the call's logits stage
        (engine/logits_stage.py; the verify penalises q with the counts plus those drafts, as it
        does p: the draft samples from the same)."""
        stage = getattr(self.state, "stage", None)
        if stage is None:
            return row
        return stage.draft(row, self.state, torch.stack(tokens, 1) if tokens else self._no_drafts)

    def _draw(self, row: torch.Tensor, i: int, tokens: list):
        """Position i's draft [B] int64 sampled from row [B, V] (processed; tokens: the drafts before it)."""
        stage = getattr(self.state, "stage", None)
        penalties = None if stage is None else stage.penalties
        if penalties is None:
            return self._sample(row, self._params, self._positions[i], STREAM_DRAFT).long()
        drafted = torch.stack(tokens, 1) if tokens else self._no_drafts
        return self._sample(row, self._params, self._positions[i], STREAM_DRAFT, penalties, drafted).long()

    def commit(self, num_accepted: torch.Tensor, draft_tokens: torch.Tensor) -> None:
        """The accepted positions' target hidden states become the pending context entries."""
        k = draft_tokens.shape[1]  # this iteration's K (<= the call's largest, which sized the slots)
        j = num_accepted.long()
        hidden = self.target.hidden_states(draft_tokens.shape[0], k + 1)  # [B, K+1, W]: positions c .. c+K
        last = self._slots.shape[1] - 1
        entry = (self._slots - last + j[:, None]).clamp(min=0)  # left padded: slot s holds entry s - (last - j) <= j
        self.pend_features.copy_(hidden.gather(1, entry[:, :, None].expand(-1, -1, hidden.shape[-1])))
        self.num_pending.copy_(j + 1)

    def compact(self, max_len_bound: int) -> None:
        pass
