"""Drafters: propose K draft tokens per row without a host sync.

Protocol (the engine calls these in order):
    start(state, prompt)               after the target's prefill and first token; prompt: the
                                       call's engine.loop.PromptBatch (ids, mask, KV budgets, K)
    propose(k) -> (draft_tokens [B, k] int64, -1 pads; draft_logits [B, k, V] in the draft
                   runner's logits dtype (bf16 on GPU: no float32 copy), or None)
    commit(num_accepted [B], draft_tokens [B, k])   after verify; the emitted tokens are
                                       already in state.seq (state.end advanced)
    compact(max_len_bound)             at poll time, for drafters with needs_compact
``state`` is the engine's DecodeState: seq [B, T] (left-padded prompt then generated tokens),
start [B] (first real token), end [B] (one past the last emitted token), sampling tensors,
gen_len [B] (the random-stream offset), backend, live [B] (1 while the row is unfinished; it
does not change between propose and commit) and skip_finished (feed finished rows nothing).

Graph safety (engine/loop.py, engine/graphs.py): ``graph_safe`` says that propose / commit keep every tensor
that outlives a call in place (copy_, never rebinding) with static shapes, so both can be
replayed from a CUDA graph. A drafter serves call after call (an engine's): start() re-fills the
buffers of the call's batch size in place (allocated at the first call of that size), so graphs
captured at an earlier call of that size read them at the same addresses.
"""
import dataclasses

import torch

from ..kernels.rng import STREAM_DRAFT
from ..kernels.verify import prepared_impls


class ModelDrafter:
    """A draft model through its own runner; each draft sampled with the fused ``sample`` kernel.

    The draft cache lags the emitted context by one token (the last emitted y), or by two when
    every draft was accepted (d_{K-1} was drafted but never fed): the first draft step feeds
    those 1 or 2 tokens as one left-padded call, so the draft never misses context.
    """

    def __init__(self, runner):
        self.runner = runner
        self.vocab_size = runner.vocab_size

    @property
    def graph_safe(self) -> bool:
        return bool(getattr(self.runner, "graph_safe", False))

    @property
    def needs_compact(self) -> bool:
        return bool(getattr(self.runner, "needs_compact", False))

    def start(self, state, prompt) -> None:
        self.state = state
        self.runner.prefill(prompt.ids, prompt.mask, budgets=prompt.budgets, num_draft_tokens=prompt.k)
        batch, dev = state.seq.shape[0], state.seq.device
        buffers = self.__dict__.setdefault("_buffers", {})
        if batch not in buffers:  # per batch size, once: [B, 2] pending tokens, [B] their count, noise positions, [B, 0]
            buffers[batch] = (torch.zeros(batch, 2, dtype=torch.long, device=dev),
                              torch.ones(batch, dtype=torch.long, device=dev), [],
                              torch.zeros(batch, 0, dtype=torch.long, device=dev))
        self.pending, self.num_pending, self._positions, self._no_drafts = buffers[batch]  # _positions: int64 [B] of i
        self.pending.zero_()
        self.pending[:, 1] = state.last_token()
        self.num_pending.fill_(1)
        self._sample = prepared_impls(state.backend, dev)[1]
        self._params = dataclasses.replace(state.params, offset=state.gen_len)  # offset: the live counter
        # Every row greedy (known on the host): each draft is its logits' argmax (lowest index),
        # so the verify's p = one-hot(argmax) is one-hot(draft) exactly: propose returns no
        # logits, and the verify reads K + 1 distributions instead of 2K + 1 (no [B, K, V] stack).
        self._logits_needed = state.params.modes != {"greedy"}

    def _position(self, i: int) -> torch.Tensor:
        while len(self._positions) <= i:
            batch = self.state.seq.shape[0]
            self._positions.append(torch.full((batch,), len(self._positions), dtype=torch.long, device=self.state.seq.device))
        return self._positions[i]

    def propose(self, k: int):
        """K one-token draft steps (the first feeds the 1 or 2 pending tokens); finished rows are
        fed nothing when state.skip_finished. -> drafts [B, k] int64, logits [B, k, V] (None
        when every row is greedy: the verify's p is then one-hot(draft), as the logits would give)."""
        live = self.state.live if self.state.skip_finished else None
        stage = self.state.stage  # logits processors / penalties of the call (engine/logits_stage.py), or None
        penalties = None if stage is None else stage.penalties
        tokens, logits = [], []
        step_input = self.pending
        num_valid = self.num_pending if live is None else self.num_pending * live
        for i in range(k):
            step_logits = self.runner.score(step_input, num_valid)[:, -1]  # [B, V], the runner's dtype
            if stage is not None:  # processed as the target's logits at this position: the drafts so far in the prefix
                drafted = torch.stack(tokens, 1) if tokens else self._no_drafts
                step_logits = stage.draft(step_logits, self.state, drafted)
                token = self._sample(step_logits, self._params, self._position(i), STREAM_DRAFT, penalties,
                                     drafted if penalties is not None else None).long()
            else:
                token = self._sample(step_logits, self._params, self._position(i), STREAM_DRAFT).long()
            tokens.append(token)
            logits.append(step_logits)
            step_input, num_valid = token[:, None], live
        return torch.stack(tokens, 1), torch.stack(logits, 1) if self._logits_needed else None

    def commit(self, num_accepted: torch.Tensor, draft_tokens: torch.Tensor) -> None:
        k = draft_tokens.shape[1]
        acc = num_accepted.long()
        # Fed since the last commit: the pending tokens, then d_0 .. d_{k-2} (nothing for a finished row).
        fed = self.num_pending + acc.clamp(max=k - 1)
        self.runner.commit(fed * self.state.live if self.state.skip_finished else fed)
        all_accepted = acc == k
        # In place: the draft step (a CUDA graph) reads these buffers at fixed addresses.
        self.pending.copy_(torch.stack([draft_tokens[:, k - 1], self.state.last_token()], 1))
        self.num_pending.copy_(1 + all_accepted.long())

    def compact(self, max_len_bound: int) -> None:
        self.runner.compact(max_len_bound)
