"""SpeculativeDecoder: the decoding loop (docs/architecture.md §1, §3), free of host syncs.

generate() is prefill, then per iteration  wait -> step -> poll:
    wait   read the device's progress (run_ahead.py): the newest completed polls, blocking only
           when the oldest unread one is R = run_ahead iterations old; a read poll says whether
           every row has finished, feeds the streamer and bounds the lengths for runners that
           compact (_take_snapshot)
    step   the draft step (drafter.propose(K) -> drafts [B, K], draft_logits [B, K, V]) and the
           verify step (target.score(K+1 tokens per row, one forward) -> chain_verify -> commit
           both caches -> append the emitted tokens), each an in-place update of device state;
           under CUDA graphs, two graph replays (graph_policy.py)
    poll   one asynchronous copy of the device status buffer (gen_len, live rows) + one event
K = 0 is plain decoding through the same code. A finished batch stops within R iterations.

Finished rows (batch > 1) cost no attention and no KV writes while the batch runs: both runners
are fed 0 real tokens for them (score's num_valid; the paged runners pack real tokens first and
their attention / append kernels touch only real rows), both caches commit 0 tokens, and their
drafts reach the verify kernels as -1 (no draft examined). Shapes stay static (graph safe):
the matrix products still run over every row. The price is the runners' packing path (num_valid
given): counted on CPU (llama test pair, K = 3, batch 3), the draft step grows from 175 to 239
torch ops and the verify step from 144 to 177, i.e. ~100 tiny kernels per iteration, ~0.2 ms
of an 8B iteration under graphs (estimate: ~2 us per graph node); what it saves grows with the
context (a finished row's attention reads its whole KV cache in every layer). At batch 1 a
finished row is a finished batch: skip_finished=None turns it on for batch > 1 only.

Logits stay in the runners' dtype (bf16 on GPU): the verify and sample kernels read bf16 /
fp16 / fp32 and standardise in float32 internally, so the float32 copy of the [B, K+1, V]
target logits that the loop used to make is gone; only when target and draft logits differ in
dtype are both cast to float32 (chain_verify needs one dtype).

Graphs belong to one decoder (one generate call): each call captures its own (the runners'
buffers are sized per call). Under graphs the phase timer's events sit between the two
replays (draft, verify), so c is still measured; stats.py defines host_ms_per_iter.
"""
import dataclasses
import time
from dataclasses import dataclass

import torch

from ..kernels.sampling_params import SamplingTensors
from ..kernels.verify import prepared_impls
from .graph_policy import GRAPHS_BY_DEFAULT, graph_unsupported_reason, resolve_graph_mode, step_callables  # noqa: F401
from .graphs import state_tensors
from .run_ahead import RunAheadPoller, Snapshot
from .stats import PhaseTimer, StatsRecorder

DEFAULT_RUN_AHEAD = 2  # run_ahead.py: the smallest bound that keeps one iteration queued on the GPU


@dataclass
class DecodeState:
    """Device state shared with the drafters. seq [B, T]: left-padded prompt (width P) then the
    generated tokens; start [B]: first real prompt slot; end [B] = P + gen_len. status [2, B]
    int64, the buffer the host polls: gen_len = status[0] (tokens generated per row), live =
    status[1] (1 while the row is unfinished, as of the start of the coming iteration).
    finished [B] bool is updated by the append; live follows it at the end of the verify step.
    skip_finished: feed finished rows 0 real tokens (batch > 1)."""

    seq: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    status: torch.Tensor
    finished: torch.Tensor
    params: SamplingTensors
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    backend: str | None
    skip_finished: bool = False

    @classmethod
    def create(cls, seq: torch.Tensor, start: torch.Tensor, end: torch.Tensor, **fields) -> "DecodeState":
        """A state with nothing generated yet: status zeros (gen_len 0, live 0 until the first
        token's append updates it), finished False."""
        batch, dev = seq.shape[0], seq.device
        return cls(seq=seq, start=start, end=end, status=torch.zeros(2, batch, dtype=torch.long, device=dev),
                   finished=torch.zeros(batch, dtype=torch.bool, device=dev), **fields)

    @property
    def gen_len(self) -> torch.Tensor:
        return self.status[0]

    @property
    def live(self) -> torch.Tensor:
        return self.status[1]

    def last_token(self) -> torch.Tensor:
        return self.seq.gather(1, (self.end - 1)[:, None])[:, 0]


class SpeculativeDecoder:
    """Speculative (K >= 1) or plain (K = 0) decoding of one batch.

    target: a runner (runners/base.py); drafter: ModelDrafter / PromptLookupDrafter, or None
    for K = 0. params: SamplingTensors [B] (seed per row). eos_token_ids: int tensor [E] or None.
    run_ahead: R >= 1, how many iterations the host may issue beyond the newest poll it has
    read (run_ahead.py; 2 keeps the GPU fed, 1 is synchronous).
    cuda_graphs: None (graph_policy.GRAPHS_BY_DEFAULT where supported; else eager, graph_note
    says why), True (ValueError if unsupported), False (eager), "static" (the graph code path
    run eagerly with its checks; any device, graph-safe runners). graph_warmup: eager
    iterations before the capture (>= 1 for the paged runners: their index cache is built on first use).
    skip_finished: feed finished rows nothing (module docstring); None: when batch > 1.
    """

    def __init__(self, target, drafter, *, k: int, params: SamplingTensors, max_new_tokens: int,
                 eos_token_ids=None, pad_token_id: int = 0, backend=None, run_ahead: int = DEFAULT_RUN_AHEAD,
                 streamer=None, cuda_graphs=None, graph_warmup: int = 1, skip_finished: bool | None = None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k (num_assistant_tokens) must be an int >= 0, got {k!r}")
        if k > 0 and drafter is None:
            raise ValueError("k >= 1 needs a drafter (assistant_model or prompt_lookup_num_tokens)")
        if isinstance(run_ahead, bool) or not isinstance(run_ahead, int) or run_ahead < 1:
            raise ValueError(f"run_ahead must be an int >= 1, got {run_ahead!r}")
        if isinstance(graph_warmup, bool) or not isinstance(graph_warmup, int) or graph_warmup < 0:
            raise ValueError(f"graph_warmup must be an int >= 0, got {graph_warmup!r}")
        self.target, self.drafter, self.k = target, drafter, k if drafter is not None else 0
        self.params, self.max_new_tokens = params, max_new_tokens
        self.pad_token_id, self.backend, self.streamer = pad_token_id, backend, streamer
        self.run_ahead, self.graph_warmup, self.skip_finished = run_ahead, graph_warmup, skip_finished
        self.device = target.device
        self.eos = None if eos_token_ids is None else torch.as_tensor(eos_token_ids, dtype=torch.long, device=self.device).reshape(-1)
        self._verify_impl = prepared_impls(backend, self.device)[0]  # resolves (and checks) the backend once
        self.stats = StatsRecorder(self.k, self.device)
        self.use_events(torch.cuda.Event if self.device.type == "cuda" else None)
        self.graph_mode, self.graph_note = resolve_graph_mode(cuda_graphs, target, drafter, backend, self.device)
        # Runners that leave holes in their cache (HFRunner) and reclaim them at poll time.
        self._compacting = [obj for obj in (target, drafter) if getattr(obj, "needs_compact", False)]
        self.steps = None  # graph_policy.StepCallables, built after the prefill

    def use_events(self, events) -> None:
        """The event class of the polls and the phase timer (torch.cuda.Event on CUDA, None on
        CPU; tests/fake_cuda.py passes one whose device work completes late)."""
        self.events = events
        self.timer = PhaseTimer(events)

    def graph_state(self) -> dict:
        """name -> tensor: everything the draft and verify steps may read or write that outlives a
        step (graphs.state_tensors from the decoder, the runners and the drafter, whatever their class)."""
        return state_tensors(self._state_roots())

    def _state_roots(self) -> dict:
        return {"decoder": self, "target": self.target, "drafter": self.drafter,
                "drafter.runner": getattr(self.drafter, "runner", None)}

    # -- setup --------------------------------------------------------------------------
    def _prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Prompt into both caches, the first token (a K = 0 verify at offset 0, y ~ q, like
        every later bonus token), then the step callables of the graph mode."""
        self.timer.mark("prefill")
        batch, width = input_ids.shape
        dev = self.device
        seq = torch.full((batch, width + self.max_new_tokens + self.k + 1), self.pad_token_id, dtype=torch.long, device=dev)
        seq[:, :width] = input_ids
        mask = attention_mask.long()
        self.state = DecodeState.create(
            seq, width - mask.sum(1), torch.full((batch,), width, dtype=torch.long, device=dev), params=self.params,
            prompt_ids=input_ids, prompt_mask=mask, backend=self.backend,
            skip_finished=batch > 1 if self.skip_finished is None else bool(self.skip_finished),
        )
        self.prompt_width = width
        # offset = gen_len, the live counter of generated tokens: one params object for every call.
        self._verify_params = dataclasses.replace(self.params, offset=self.state.gen_len)
        self._no_drafts = torch.zeros(batch, 0, dtype=torch.long, device=dev)
        self._slots = torch.arange(self.k + 1, device=dev)[None, :]  # [1, K+1], the append's slot index
        logits = self.target.prefill(input_ids, mask)  # [B, V]
        tokens, accepted = self._chain_verify(logits[:, None, :], None, self._no_drafts)
        self.stats.record_first(self._append(tokens, accepted))
        self._update_live()
        if self.drafter is not None:
            self.drafter.start(self.state)
        self.steps = step_callables(self.graph_mode, self.draft_step if self.k else None, self.verify_step,
                                    self._state_roots(), self.graph_warmup)
        # Steps before the one that captures the graphs (timed as "capture"); -1: never.
        self._steps_to_capture = self.graph_warmup if self.steps.graphs else -1
        self.timer.mark(None)

    # -- the pieces of one iteration (each a device-side, in-place update; no host sync) --
    def draft_step(self):
        """drafter.propose(K) -> (drafts [B, K] int64, -1 pads; draft_logits [B, K, V] or None)."""
        return self.drafter.propose(self.k)

    def verify_step(self, drafts: torch.Tensor, draft_logits) -> None:
        """drafts [B, K] int64 (-1 pads), draft_logits [B, K, V] or None: target.score(K+1) ->
        chain_verify -> commit both caches -> append. Every effect is an in-place update of the
        state (graph safe); returns nothing."""
        st = self.state
        if st.skip_finished:  # a finished row: no draft to examine, no token to score
            drafts = torch.where(st.live[:, None] > 0, drafts, -1)
        target_in = torch.cat([st.last_token()[:, None], drafts.clamp(min=0)], 1)  # [B, K+1]
        num_valid = st.live * (self.k + 1) if st.skip_finished else None
        target_logits = self.target.score(target_in, num_valid)  # [B, K+1, V], the runner's dtype
        if draft_logits is not None and draft_logits.dtype != target_logits.dtype:
            target_logits, draft_logits = target_logits.float(), draft_logits.float()
        tokens, accepted = self._chain_verify(target_logits, draft_logits, drafts)  # [B, K+1] int32, [B] int32
        self.target.commit(self._kept(accepted.long() + 1))
        self.stats.record(accepted, self._append(tokens, accepted))
        if self.k:
            self.drafter.commit(accepted, drafts)
        self._update_live()

    def _chain_verify(self, target_logits, draft_logits, drafts):
        return self._verify_impl(target_logits, draft_logits, drafts, self._verify_params)

    def _kept(self, keep: torch.Tensor) -> torch.Tensor:
        """keep [B] -> 0 for rows that were finished (fed nothing) this iteration."""
        return keep * self.state.live if self.state.skip_finished else keep

    def _append(self, tokens: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
        """Write the emitted tokens [B, W] (-1 padded, W <= K+1) into seq; EOS and max_new_tokens
        cut a row exactly there; finished rows take nothing. Returns the tokens appended per row [B]."""
        st = self.state
        width = tokens.shape[1]
        slot = self._slots[:, :width]
        emitted = num_accepted.long()[:, None] >= slot  # accepted drafts + the final token
        toks = tokens.long()
        if self.eos is not None:
            is_eos = (toks[..., None] == self.eos).any(-1) & emitted
            first_eos = torch.where(is_eos, slot, width).amin(1)
            emitted &= slot <= first_eos[:, None]
        room = (self.max_new_tokens - st.gen_len)[:, None]
        emitted &= (slot < room) & ~st.finished[:, None]
        count = emitted.long().sum(1)
        index = st.end[:, None] + slot
        st.seq.scatter_(1, index, torch.where(emitted, toks, st.seq.gather(1, index)))
        done = st.gen_len + count >= self.max_new_tokens
        if self.eos is not None:
            done |= (first_eos < width) & (count > 0)
        st.finished |= done
        st.gen_len.add_(count)
        st.end += count
        return count

    def _update_live(self) -> None:
        """status row 1 (live) from finished: what the next poll reports and the next iteration feeds."""
        torch.logical_not(self.state.finished, out=self.state.live)

    def step(self) -> None:
        """One iteration: the draft and verify steps (after the capture, two graph replays)."""
        phase = "capture" if self._steps_to_capture == 0 else None
        self._steps_to_capture -= 1
        if self.k:
            self.timer.mark(phase or "draft")
            drafts, draft_logits = self.steps.draft()
        else:
            drafts, draft_logits = self._no_drafts, None
        self.timer.mark(phase or "target")
        self.steps.verify(drafts, draft_logits)
        self.timer.mark(None)

    # -- the loop ------------------------------------------------------------------------
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids [B, P] (left padded), attention_mask [B, P] -> tokens [B, P + new] (pad after EOS)."""
        t0 = time.perf_counter()
        self._prefill(input_ids, attention_mask)
        poller = self._start_polls(input_ids)
        iterations = 0
        # Every unfinished row gains >= 1 token per iteration: max_new_tokens - 1 iterations suffice.
        while iterations < self.max_new_tokens - 1:
            snapshot = poller.wait(iterations)
            if snapshot is not None and self._take_snapshot(snapshot, iterations):
                break
            self.step()
            iterations += 1
            poller.issue(iterations)
        return self._finish(poller, iterations, t0)

    def _start_polls(self, input_ids: torch.Tensor) -> RunAheadPoller:
        if self.streamer is not None:
            self.streamer.put(input_ids.cpu())
            self._streamed = 0
        row0 = self.state.seq[0] if self.streamer is not None else None
        poller = RunAheadPoller(self.state.status, self.run_ahead, events=self.events, seq_row0=row0)
        poller.issue(0)
        return poller

    def _take_snapshot(self, snapshot: Snapshot, issued: int) -> bool:
        """A read poll (taken after snapshot.iteration iterations; ``issued`` issued so far):
        stream row 0's new tokens; True when every row has finished; else give the compacting
        runners a bound on every row's committed length: the poll's longest row plus K+1 tokens
        (the most one iteration can add to a row) per iteration issued since the poll. The bound
        holds when compact() runs: it is queued on the stream after those iterations."""
        if self.streamer is not None:
            self._stream(int(snapshot.gen_len[0]), snapshot.seq_row0)
        if snapshot.done:
            return True
        if self._compacting:
            bound = self.prompt_width + int(snapshot.gen_len.max()) + (self.k + 1) * (issued - snapshot.iteration)
            for runner in self._compacting:
                runner.compact(bound)
        return False

    def _finish(self, poller: RunAheadPoller, iterations: int, t0: float) -> torch.Tensor:
        gen_len = self.state.gen_len.cpu()  # the one sync at the end
        poller.finish()
        if self.streamer is not None:
            self._stream(int(gen_len[0]), None)
            self.streamer.end()
        self.timer.finish()
        new = int(gen_len.max()) if gen_len.numel() else 0
        needed = poller.first_done if poller.first_done is not None else iterations
        loop = dict(poller.report(), iterations_needed=needed)
        self.stats.finish(time.perf_counter() - t0, iterations, self.timer, gen_len, graphs=self.graph_report(), loop=loop)
        return self.state.seq[:, : self.prompt_width + new].clone()

    def _stream(self, upto: int, seq_row0) -> None:
        """Row 0's tokens up to gen_len ``upto`` to the streamer: from the poll's host copy of the
        row (seq_row0, numpy) or, after the final sync, from the device."""
        if upto > self._streamed:
            start, stop = self.prompt_width + self._streamed, self.prompt_width + upto
            chunk = torch.from_numpy(seq_row0[start:stop].copy()) if seq_row0 is not None else self.state.seq[0, start:stop].cpu()
            self.streamer.put(chunk)
            self._streamed = upto

    def graph_report(self) -> dict:
        """What ran: mode, why eager (if so), calls served by each graph (or its static twin)."""
        replays = self.steps.replays() if self.steps is not None else {}
        return dict(mode=self.graph_mode, note=self.graph_note, replays=replays)
