"""Eagle3Drafter: K drafts per iteration from an EAGLE-3 head that reads the target's hidden states.

Protocol: drafters/model.py (start / propose / commit). The head's context entry t pairs the
target's hidden states at position t (captured by the target runner: runners/hidden_capture.py)
with the token at t + 1, so an entry exists once the token after t is known:

    start    the target's prefill hidden states are taken; entries t = 0 .. n-2 of each row's
             prompt go into the head's cache (prefill_pairs), entry n-1 (h_{n-1}, first token)
             is PENDING
    propose  the pending entries (1 .. K+1 per row, left padded) are fed and committed (they are
             final context: target features), the last one's logits give d_1; then K - 1 draft
             steps feed (g, d_i) -- the head's own pre-norm output g in place of the target's
             features -- as tentative entries, each giving d_{i+1}
    commit   the draft steps' entries are dropped (commit 0: no copy, the next feed overwrites
             them); with j drafts accepted the new pending entries are (h_c+i, x_c+i+1) for
             i = 0 .. j: the target's hidden states of this iteration's verify at the accepted
             positions and the tokens emitted there (d_1 .. d_j, then the final token)

so the head's committed cache always holds entries for the target's committed positions less
the pending ones, with the target's features (EAGLE's rule: draft entries never become context).

Draft vocabulary. The head scores Vd tokens; draft id d is target token d2t_ids[d]. Each draft
position's logits go into a [B, K, V] buffer over the TARGET vocabulary whose other columns hold
-inf from allocation (only the mapped columns are written per step). The draft is sampled from
that row and the same row is the verify's draft distribution p, so p is exactly the law the
draft was drawn from: p(x) = 0 outside the mapped set, and chain_verify's rule (accept x iff
u p(x) < q(x), else emit from norm(max(q - p, 0))) gives target-distributed tokens for ANY p
(Chen et al. Theorem 1), the reduced vocabulary included: every unmapped token keeps its whole
target mass in the residual. Standardisation sees the same row in both places (temperature,
top-k, top-p, min-p of -inf entries: probability 0 either way). All-greedy batches skip the
buffer: the draft is d2t_ids[argmax] and the verify's p = one-hot(draft).

Graph safety: every tensor that outlives a call is per batch size (and K) and re-filled in
place by start(); propose / commit have static shapes and no host reads (engine/graphs.py).
Rows that finished are fed nothing (num_valid 0) when state.skip_finished.
"""
import dataclasses

import torch

from ..kernels.rng import STREAM_DRAFT
from ..kernels.verify import prepared_impls


class Eagle3Drafter:
    """runner: the head's PagedEagle3Runner; target: the target's paged runner, capturing the
    head's hidden states (capture_hidden_states(head.hidden_indices(L))). draft_to_target: int64
    [Vd] target id of each draft id (None: the draft vocabulary is the target's)."""

    def __init__(self, runner, target, draft_to_target: torch.Tensor | None):
        if getattr(target, "hidden_capture", None) is None:
            raise ValueError("the target runner must capture the head's hidden states (capture_hidden_states)")
        if target.hidden_capture.width != runner.feature_width:
            raise ValueError(f"the head's fc reads {runner.feature_width} features, the target captures "
                             f"{target.hidden_capture.width}")
        self.runner, self.target = runner, target
        self.vocab_size = target.vocab_size
        self.d2t_ids = None if draft_to_target is None else draft_to_target.to(device=runner.device, dtype=torch.long)
        if self.d2t_ids is None and runner.vocab_size != target.vocab_size:
            raise ValueError(f"a draft vocabulary of {runner.vocab_size} tokens needs its map to the target's "
                             f"{target.vocab_size} (d2t)")

    @property
    def graph_safe(self) -> bool:
        return bool(getattr(self.runner, "graph_safe", False) and getattr(self.target, "graph_safe", False))

    needs_compact = False

    def start(self, state, prompt) -> None:
        """After the target's prefill: the prompt's entries into the head's cache, the last one pending.
        prompt.k is the call's largest K (an adaptive schedule's; engine/loop.py): the pending
        entries, the draft-logits rows and the head's reservation are sized for it, and every
        iteration's K (propose / commit) uses the first K of them."""
        self.state = state
        k, ids, mask = prompt.k, prompt.ids, prompt.mask
        hidden = self.target.take_prefill_hidden()  # [B, P, W]
        batch, width = ids.shape
        # Entry e = (h_e, token e + 1) for e < P - 1; real where mask[e] (left padding: the last ones).
        self.runner.prefill_pairs(ids[:, 1:], hidden[:, :-1], mask[:, :-1], budgets=prompt.budgets, num_draft_tokens=k)
        buffers = self.__dict__.setdefault("_buffers", {})
        key = (batch, k)
        if key not in buffers:
            buffers[key] = self._allocate(batch, k, hidden.shape[-1], state.seq.device)
        (self.pend_tokens, self.pend_features, self.num_pending, self._slots, self._draft_logits,
         self._positions, self._no_drafts) = buffers[key]
        self.pend_tokens.zero_()
        self.pend_tokens[:, k] = state.last_token()
        self.pend_features.zero_()
        self.pend_features[:, k] = hidden[:, width - 1]
        self.num_pending.fill_(1)
        self._sample = prepared_impls(state.backend, state.seq.device)[1]
        self._params = dataclasses.replace(state.params, offset=state.gen_len)
        self._logits_needed = state.params.modes != {"greedy"}

    def _allocate(self, batch: int, k: int, width: int, device):
        """This (batch size, K)'s buffers: pending entries [B, K+1] / [B, K+1, W], their count [B],
        slot index [1, K+1], the target-vocabulary draft logits [B, K, V] (-inf outside the mapped
        columns, forever), noise positions [B] per draft position, no drafts [B, 0]."""
        long = dict(dtype=torch.long, device=device)
        logits = None
        if self.d2t_ids is not None:
            logits = torch.full((batch, k, self.vocab_size), float("-inf"), dtype=self.runner.dtype, device=device)
        positions = [torch.full((batch,), i, **long) for i in range(k)]
        return (torch.zeros(batch, k + 1, **long), torch.zeros(batch, k + 1, width, dtype=self.target.dtype, device=device),
                torch.ones(batch, **long), torch.arange(k + 1, **long)[None, :], logits, positions,
                torch.zeros(batch, 0, **long))

    def _target_row(self, i: int, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [B, Vd] of draft position i -> its target-vocabulary row [B, V]."""
        if self._draft_logits is None:
            return logits
        row = self._draft_logits[:, i]
        row.index_copy_(1, self.d2t_ids, logits)  # the unmapped columns keep their -inf
        return row

    def propose(self, k: int):
        """-> drafts [B, k] int64, draft logits [B, k, V] over the target vocabulary (None when
        every row is greedy)."""
        st = self.state
        live = st.live if st.skip_finished else None
        fed = self.num_pending if live is None else self.num_pending * live
        logits, g = self.runner.score_pairs(self.pend_tokens, self.pend_features, fed, project=True, last_only=True)
        self.runner.commit(fed)  # context entries: final
        logits, g = logits[:, -1], g[:, -1:]
        stage = getattr(st, "stage", None)  # logits processors / penalties of the call (engine/logits_stage.py)
        tokens, rows = [], []
        for i in range(k):
            if self._logits_needed and stage is not None:  # processed as the target's row at this position
                drafted = torch.stack(tokens, 1) if tokens else self._no_drafts
                rows.append(stage.draft(self._target_row(i, logits), st, drafted))
                penalties = stage.penalties  # the verify penalises q as it penalises p: sample from the same
                token = self._sample(rows[-1], self._params, self._positions[i], STREAM_DRAFT, penalties,
                                     drafted if penalties is not None else None).long()
            elif self._logits_needed:
                rows.append(self._target_row(i, logits))
                token = self._sample(rows[-1], self._params, self._positions[i], STREAM_DRAFT).long()
            else:  # greedy: the argmax (lowest draft id; d2t is increasing: the lowest target id too)
                token = logits.argmax(-1)
                token = token if self.d2t_ids is None else self.d2t_ids[token]
            tokens.append(token)
            if i + 1 < k:
                step_logits, g = self.runner.score_pairs(token[:, None], g, live, project=False)
                logits = step_logits[:, -1]
        drafts = torch.stack(tokens, 1)
        if not self._logits_needed:
            return drafts, None
        if self._draft_logits is not None and stage is None:  # the rows are its columns (the first k: an adaptive K)
            return drafts, self._draft_logits[:, :k]
        return drafts, torch.stack(rows, 1)

    def commit(self, num_accepted: torch.Tensor, draft_tokens: torch.Tensor) -> None:
        """After the verify: the draft entries go; the accepted positions' entries become pending.
        draft_tokens [B, k]: this iteration's K, at most the call's largest (the buffers' width - 1)."""
        st, k = self.state, draft_tokens.shape[1]
        width = self._slots.shape[1]  # the call's largest K + 1: the pending entries' slots
        self.runner.commit(torch.zeros_like(self.num_pending))  # drop the draft steps' tentative entries
        j = num_accepted.long()
        hidden = self.target.hidden_states(draft_tokens.shape[0], k + 1)  # [B, k+1, W]: positions c .. c+k
        # Left padded: slot s holds entry i = s - (width - 1 - j) (i in 0 .. j), the others are padding.
        entry = (self._slots - (width - 1) + j[:, None]).clamp(min=0)  # [B, width]
        self.pend_features.copy_(hidden.gather(1, entry[:, :, None].expand(-1, -1, hidden.shape[-1])))
        drafted = draft_tokens.gather(1, entry.clamp(max=k - 1))
        self.pend_tokens.copy_(torch.where(entry < j[:, None], drafted, st.last_token()[:, None]))
        self.num_pending.copy_(j + 1)

    def compact(self, max_len_bound: int) -> None:
        pass
