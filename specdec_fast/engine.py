"""SpeculativeDecoder: the decoding loop (DESIGN.md section 1), free of host syncs.

One iteration: drafter.propose(K) -> target.score(K+1 tokens per row, one forward) ->
chain_verify -> commit both caches -> append the emitted tokens to the device output buffer,
update the device-side lengths and finished flags. The host learns about them only through a
poll: a non-blocking copy into pinned memory (CUDA) every ``poll_every`` iterations, read one
poll later, so the GPU always has queued work. K = 0 is plain decoding through the same code.
"""
import dataclasses
import time
from dataclasses import dataclass

import torch

from .kernels.verify import prepared_impls
from .kernels.sampling_params import SamplingTensors
from .stats import PhaseTimer, StatsRecorder


@dataclass
class DecodeState:
    """Device state shared with the drafters. seq [B, T]: left-padded prompt (width P) then the
    generated tokens; start [B]: first real prompt slot; end [B] = P + gen_len."""

    seq: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    gen_len: torch.Tensor
    finished: torch.Tensor
    params: SamplingTensors
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    backend: str | None

    def last_token(self) -> torch.Tensor:
        return self.seq.gather(1, (self.end - 1)[:, None])[:, 0]


class SpeculativeDecoder:
    """Speculative (K >= 1) or plain (K = 0) decoding of one batch.

    target: a runner (runners/base.py); drafter: ModelDrafter / PromptLookupDrafter, or None
    for K = 0. params: SamplingTensors [B] (seed per row). eos: int tensor [E] or None.
    """

    def __init__(self, target, drafter, *, k: int, params: SamplingTensors, max_new_tokens: int,
                 eos_token_ids=None, pad_token_id: int = 0, backend=None, poll_every: int | None = None,
                 streamer=None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k (num_assistant_tokens) must be an int >= 0, got {k!r}")
        if k > 0 and drafter is None:
            raise ValueError("k >= 1 needs a drafter (assistant_model or prompt_lookup_num_tokens)")
        self.target, self.drafter, self.k = target, drafter, k if drafter is not None else 0
        self.params, self.max_new_tokens = params, max_new_tokens
        self.pad_token_id, self.backend, self.streamer = pad_token_id, backend, streamer
        self.device = target.device
        self.eos = None if eos_token_ids is None else torch.as_tensor(eos_token_ids, dtype=torch.long, device=self.device).reshape(-1)
        cuda = self.device.type == "cuda"
        self.poll_every = poll_every or (4 if cuda and streamer is None else 1)
        self._chain_verify = prepared_impls(backend, self.device)[0]  # resolves (and checks) the backend once
        self.stats = StatsRecorder(self.k, self.device)
        self.timer = PhaseTimer(self.device)

    # -- setup --------------------------------------------------------------------------
    def _prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        batch, width = input_ids.shape
        dev = self.device
        buffer = width + self.max_new_tokens + self.k + 1
        seq = torch.full((batch, buffer), self.pad_token_id, dtype=torch.long, device=dev)
        seq[:, :width] = input_ids
        mask = attention_mask.long()
        self.state = DecodeState(
            seq=seq, start=width - mask.sum(1), end=torch.full((batch,), width, dtype=torch.long, device=dev),
            gen_len=torch.zeros(batch, dtype=torch.long, device=dev), finished=torch.zeros(batch, dtype=torch.bool, device=dev),
            params=self.params, prompt_ids=input_ids, prompt_mask=mask, backend=self.backend,
        )
        self.prompt_width = width
        logits = self.target.prefill(input_ids, mask).float()
        # The first token: a K = 0 verify at offset 0 (y ~ q), like every later bonus token.
        tokens, accepted = self._verify(logits[:, None, :], None, torch.zeros(batch, 0, dtype=torch.long, device=dev))
        self._append(tokens, accepted)
        if self.drafter is not None:
            self.drafter.start(self.state)

    def _verify(self, target_logits, draft_logits, drafts):
        params = dataclasses.replace(self.params, offset=self.state.gen_len)
        return self._chain_verify(target_logits, draft_logits, drafts, params)

    def _append(self, tokens: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
        """Write the emitted tokens [B, K+1] (-1 padded) into seq; EOS and max_new_tokens cut
        a row exactly there. Returns the number of tokens appended per row [B]."""
        st = self.state
        width = tokens.shape[1]
        slot = torch.arange(width, device=self.device)[None, :]
        emitted = num_accepted.long()[:, None] >= slot  # accepted drafts + the final token
        toks = tokens.long()
        if self.eos is not None:
            is_eos = (toks[..., None] == self.eos).any(-1) & emitted
            first_eos = torch.where(is_eos, slot, torch.full_like(toks, width)).amin(1)
            emitted &= slot <= first_eos[:, None]
            hit_eos = first_eos < width
        else:
            hit_eos = torch.zeros_like(st.finished)
        room = (self.max_new_tokens - st.gen_len)[:, None]
        emitted &= (slot < room) & ~st.finished[:, None]
        count = emitted.long().sum(1)
        index = st.end[:, None] + slot
        st.seq.scatter_(1, index, torch.where(emitted, toks, st.seq.gather(1, index)))
        st.finished |= (hit_eos & (count > 0)) | (st.gen_len + count >= self.max_new_tokens)
        st.gen_len += count
        st.end += count
        self.stats.record(num_accepted, count, st.finished)
        return count

    # -- the loop ------------------------------------------------------------------------
    def step(self) -> None:
        """One iteration; no host sync."""
        st = self.state
        k = self.k
        self.timer.mark("draft")
        if k:
            drafts, draft_logits = self.drafter.propose(k)
        else:
            drafts, draft_logits = torch.zeros(st.seq.shape[0], 0, dtype=torch.long, device=self.device), None
        self.timer.mark("target")
        target_in = torch.cat([st.last_token()[:, None], drafts.clamp(min=0)], 1)
        target_logits = self.target.score(target_in).float()
        tokens, accepted = self._verify(target_logits, draft_logits, drafts)
        self.target.commit(accepted.long() + 1)
        self._append(tokens, accepted)
        if k:
            self.drafter.commit(accepted, drafts)
        self.timer.mark(None)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids [B, P] (left padded), attention_mask [B, P] -> tokens [B, P + new] (pad after EOS)."""
        t0 = time.perf_counter()
        self._prefill(input_ids, attention_mask)
        if self.streamer is not None:
            self.streamer.put(input_ids.cpu())
            self._streamed = 0
        poller = _Poller(self.state, self.device)
        poller.issue(0)
        iteration = 0
        # Every unfinished row gains >= 1 token per iteration: max_new_tokens - 1 iterations suffice.
        while iteration < self.max_new_tokens - 1:
            snapshot = poller.latest()
            if snapshot is not None:
                done, lengths, at_iter = snapshot
                if self.streamer is not None:
                    self._stream(lengths)
                if done:
                    break
                bound = self.prompt_width + int(lengths.max()) + (self.k + 1) * (iteration - at_iter)
                self.target.compact(bound)
                if self.drafter is not None:
                    self.drafter.compact(bound)
            self.step()
            iteration += 1
            if iteration % self.poll_every == 0:
                poller.issue(iteration)
        gen_len = self.state.gen_len.cpu()  # the one sync at the end
        if self.streamer is not None:
            self._stream(gen_len)
            self.streamer.end()
        self.timer.finish()
        new = int(gen_len.max()) if gen_len.numel() else 0
        self.stats.finish(time.perf_counter() - t0, iteration, self.timer, gen_len)
        return self.state.seq[:, : self.prompt_width + new].clone()

    def _stream(self, lengths: torch.Tensor) -> None:
        upto = int(lengths[0])
        if upto > self._streamed:
            start = self.prompt_width + self._streamed
            self.streamer.put(self.state.seq[0, start : self.prompt_width + upto].cpu())
            self._streamed = upto


class _Poller:
    """finished/gen_len copied to the host without blocking: on CUDA into pinned memory behind
    an event, read at the next poll once the event has completed."""

    def __init__(self, state: DecodeState, device: torch.device):
        self.state, self.cuda = state, device.type == "cuda"
        self.pending = None

    def issue(self, iteration: int) -> None:
        packed = torch.stack([self.state.finished.long(), self.state.gen_len], 0)
        if self.cuda:
            host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host, event = packed.clone(), None
        self.pending = (host, event, iteration)

    def latest(self):
        """(all finished, gen_len [B] host tensor, iteration) of the last completed copy, or None."""
        if self.pending is None:
            return None
        host, event, iteration = self.pending
        if event is not None and not event.query():
            return None
        self.pending = None
        return bool(host[0].all()), host[1], iteration
