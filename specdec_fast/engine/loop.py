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

Reuse across calls (engine/engine.py keeps one decoder per batch bucket, K and sampling
modes): a decoder allocates its state for ``rows`` rows and ``seq_capacity`` tokens at its first
call and re-initialises it IN PLACE at every later call (prompt, lengths, sampling parameters,
seeds, max_new_tokens and EOS are device tensors; the runners' KV pool never moves), so the
graphs captured at the first call are replayed by every later one: 0 captures after the first
call. A call of B < rows rows fills the others with unused rows (no prompt, finished from the
start: fed nothing, no KV blocks). Every state tensor a graph reads must keep its address from
call to call: StepGraph.check_reuse() checks that at each later call (GraphSafetyError naming
what moved). Under graphs the phase timer's events sit between the two replays (draft,
verify), so c is still measured; stats.py defines host_ms_per_iter.
"""
import dataclasses
import time
from dataclasses import dataclass

import torch

from ..kernels.sampling_params import SamplingTensors, fill_rows, static_sampling_tensors
from ..kernels.verify import prepared_impls
from .graph_policy import GRAPHS_BY_DEFAULT, graph_memory, graph_unsupported_reason, resolve_graph_mode, step_callables  # noqa: F401
from .graphs import state_tensors
from .logits_stage import LogitsStage
from .run_ahead import RunAheadPoller, Snapshot
from .schedule import AdaptiveK
from .stats import PhaseTimer, StatsRecorder

DEFAULT_RUN_AHEAD = 2  # run_ahead.py: the smallest bound that keeps one iteration queued on the GPU
_DEFAULT = object()  # generate()'s per-call arguments: "the constructor's value"


EOS_SLOTS = 8  # EOS ids a decoder holds (a device buffer, -1 = unused): a call with more takes a new decoder


@dataclass
class DecodeState:
    """Device state shared with the drafters. seq [B, T]: left-padded prompt (width P) then the
    generated tokens; start [B]: first real prompt slot; end [B] = P + gen_len. status [2, B]
    int64, the buffer the host polls: gen_len = status[0] (tokens generated per row), live =
    status[1] (1 while the row is unfinished, as of the start of the coming iteration).
    finished [B] bool is updated by the append; live follows it at the end of the verify step.
    skip_finished: feed finished rows 0 real tokens (batch > 1). Every tensor keeps its address
    for the decoder's life (re-initialised in place at each call)."""

    seq: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    status: torch.Tensor
    finished: torch.Tensor
    params: SamplingTensors
    backend: str | None
    skip_finished: bool = False
    stage: object = None  # the decoder's LogitsStage (logits_stage.py) for this call, or None

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


@dataclass
class PromptBatch:
    """One call's prompt as the runners' prefill takes it: ids [R, P] int64 and mask [R, P]
    (left padding; rows past the call's batch are unused: mask 0), each row's KV reservation
    budgets (R ints: real prompt tokens + max_new_tokens + K + 1; 0 for an unused row) and K."""

    ids: torch.Tensor
    mask: torch.Tensor
    budgets: list
    k: int  # tokens drafted per iteration (K; a tree's N - 1 nodes): the runners hold K + 1 tentative tokens


class SpeculativeDecoder:
    """Speculative (K >= 1) or plain (K = 0) decoding of batches of up to ``rows`` rows, call after call.

    target: a runner (runners/base.py); drafter: ModelDrafter / PromptLookupDrafter, or None
    for K = 0. Per call (the constructor's values are the defaults of generate()): params:
    SamplingTensors [B] (seed per row); max_new_tokens; eos_token_ids: ints or None; pad_token_id;
    streamer. Fixed for the decoder's life: rows (None: the first call's batch), seq_capacity
    (tokens per row of the state, prompt width + max_new_tokens + K + 1 at most; None: the first
    call's), the sampling modes (the first call's params.modes: they choose the kernels' launches).
    run_ahead: R >= 1, how many iterations the host may issue beyond the newest poll it has
    read (run_ahead.py; 2 keeps the GPU fed, 1 is synchronous).
    cuda_graphs: None (graph_policy.GRAPHS_BY_DEFAULT where supported; else eager, graph_note
    says why), True (ValueError if unsupported), False (eager), "static" (the graph code path
    run eagerly with its checks; any device, graph-safe runners). graph_warmup: eager
    iterations before the capture (>= 1 for the paged runners: their index cache is built on first use).
    skip_finished: feed finished rows nothing (module docstring); None: when rows > 1.
    """

    # The verify kernels apply a call's penalties fused (logits_stage.py); TreeDecoder's do not.
    fused_penalties = True

    def __init__(self, target, drafter, *, k: int, params: SamplingTensors | None = None, max_new_tokens: int | None = None,
                 eos_token_ids=None, pad_token_id: int = 0, backend=None, run_ahead: int = DEFAULT_RUN_AHEAD,
                 streamer=None, cuda_graphs=None, graph_warmup: int = 1, skip_finished: bool | None = None,
                 rows: int | None = None, seq_capacity: int | None = None, ks=None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k (num_assistant_tokens) must be an int >= 0, got {k!r}")
        if k > 0 and drafter is None:
            raise ValueError("k >= 1 needs a drafter (assistant_model or prompt_lookup_num_tokens)")
        if isinstance(run_ahead, bool) or not isinstance(run_ahead, int) or run_ahead < 1:
            raise ValueError(f"run_ahead must be an int >= 1, got {run_ahead!r}")
        if isinstance(graph_warmup, bool) or not isinstance(graph_warmup, int) or graph_warmup < 0:
            raise ValueError(f"graph_warmup must be an int >= 0, got {graph_warmup!r}")
        for name, value in (("rows", rows), ("seq_capacity", seq_capacity)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or an int >= 1, got {value!r}")
        self.target, self.drafter, self.k = target, drafter, k if drafter is not None else 0
        # ks: the Ks an adaptive schedule chooses among before each iteration (schedule.py); k: the
        # first iteration's. None: K = k throughout.
        if ks is not None and (drafter is None or any(isinstance(q, bool) or not isinstance(q, int) or q < 1 for q in ks)):
            raise ValueError(f"ks must be ints >= 1 with a drafter, got {ks!r}")
        self.ks = (self.k,) if ks is None or len(set(ks)) < 2 else tuple(sorted(set(ks)))
        self.schedule = AdaptiveK(self.ks, start=self.k, draft_cost=getattr(drafter, "draft_cost", "per_step")) \
            if len(self.ks) > 1 else None
        self.k_max = max(self.ks)
        # tensor parallel: the call's distributed.k_leader.LeaderK (every rank runs rank 0's choice), set by the
        # engine around a call; None: this process's own schedule chooses
        self.k_leader = None
        self.drafted_per_step = self.k_max  # tokens the target scores beyond the last one (a tree's: N - 1)
        self.defaults = dict(params=params, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                             pad_token_id=pad_token_id, streamer=streamer, stage=None, stopping_criteria=None)
        self._stops = None  # stopping.HostStops of a call with host-side stopping criteria
        self.stage = None  # the LogitsStage (logits_stage.py) of calls with processors / penalties
        self.backend = backend
        self.run_ahead, self.graph_warmup, self.skip_finished = run_ahead, graph_warmup, skip_finished
        self.rows, self.seq_capacity = rows, seq_capacity
        self.device = target.device
        self._verify_impl = prepared_impls(backend, self.device)[0]  # resolves (and checks) the backend once
        self.use_events(torch.cuda.Event if self.device.type == "cuda" else None)
        self.graph_mode, self.graph_note = resolve_graph_mode(cuda_graphs, target, drafter, backend, self.device)
        # Runners that leave holes in their cache (HFRunner) and reclaim them at poll time.
        self._compacting = [obj for obj in (target, drafter) if getattr(obj, "needs_compact", False)]
        self.state = None  # allocated by the first call (_allocate), then re-initialised in place
        self._steps_by_k = {}  # K -> graph_policy.StepCallables, built the first time K runs
        self._settled = set()  # Ks whose steps run as they will from now on (graphs captured, or eager)
        self._graph_memory = None  # (pool, stream) shared by the graphs of every K
        self.calls = 0
        self.stats = None

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
    def _call_options(self, overrides: dict) -> dict:
        call = dict(self.defaults)
        call.update({name: value for name, value in overrides.items() if value is not _DEFAULT})
        if call["params"] is None:
            raise ValueError("SpeculativeDecoder needs params (SamplingTensors), at construction or per call")
        if call["max_new_tokens"] is None:
            raise ValueError("SpeculativeDecoder needs max_new_tokens, at construction or per call")
        return call

    def _allocate(self, rows: int, width: int, params: SamplingTensors) -> None:
        """The decoder's state for ``rows`` rows of ``width`` tokens, once; every later call fills
        these tensors in place (their addresses are what captured graphs read)."""
        dev = self.device
        self.rows, self.seq_capacity, self.modes = rows, width, params.modes
        long = dict(dtype=torch.long, device=dev)
        self.state = DecodeState.create(
            torch.zeros(rows, width, **long), torch.zeros(rows, **long), torch.zeros(rows, **long),
            params=static_sampling_tensors(rows, dev, params.modes), backend=self.backend,
            skip_finished=rows > 1 if self.skip_finished is None else bool(self.skip_finished))
        # offset = gen_len, the live counter of generated tokens: one params object for every call.
        self._verify_params = dataclasses.replace(self.state.params, offset=self.state.gen_len)
        self._max_new = torch.zeros(rows, **long)  # max_new_tokens per row (a device value: graphs replay it)
        self._eos = torch.full((EOS_SLOTS,), -1, **long)  # EOS ids, -1 = unused (no token is -1)
        self._no_drafts = torch.zeros(rows, 0, **long)
        self._slots = torch.arange(self.k_max + 1, device=dev)[None, :]  # [1, K+1], the append's slot index
        self.stats = StatsRecorder(self.k_max, dev)

    def _begin_call(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, call: dict) -> PromptBatch:
        """Checks the call against the decoder's fixed shapes, allocates at the first call, and
        re-initialises every state tensor in place: the prompt rows (then unused rows), lengths,
        finished, sampling parameters and seeds, max_new_tokens, EOS."""
        batch, width = input_ids.shape
        params, new = call["params"], call["max_new_tokens"]
        if isinstance(new, bool) or not isinstance(new, int) or new < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {new!r}")
        if params.batch != batch:
            raise ValueError(f"params are for {params.batch} rows, input_ids has {batch}")
        eos = [] if call["eos_token_ids"] is None else [int(e) for e in torch.as_tensor(call["eos_token_ids"]).reshape(-1).tolist()]
        if len(eos) > EOS_SLOTS:
            raise ValueError(f"at most {EOS_SLOTS} eos_token_ids per decoder, got {len(eos)}")
        need = width + new + self.k_max + 1
        if self.state is None:
            self._allocate(self.rows or batch, self.seq_capacity or need, params)
        if batch > self.rows:
            raise ValueError(f"a batch of {batch} rows exceeds this decoder's {self.rows} rows")
        if need > self.seq_capacity:
            raise ValueError(f"prompt width {width} + max_new_tokens {new} + K + 1 = {need} tokens exceed this decoder's "
                             f"{self.seq_capacity} (seq_capacity)")
        if params.modes != self.modes:
            raise ValueError(f"this decoder was built for sampling modes {sorted(self.modes or ['unknown'])}, "
                             f"the call's are {sorted(params.modes or ['unknown'])}")
        self.max_new_tokens, self.pad_token_id, self.streamer = new, int(call["pad_token_id"]), call["streamer"]
        limits = call["stopping_criteria"]  # stopping.CallLimits or None
        self._stops = None if limits is None else limits.stops(width, batch, self.pad_token_id)
        st, dev, rows = self.state, self.device, self.rows
        mask = attention_mask.to(dev).long()
        ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long, device=dev)
        full_mask = torch.zeros((rows, width), dtype=torch.long, device=dev)
        ids[:batch], full_mask[:batch] = input_ids, mask
        st.seq.fill_(self.pad_token_id)
        st.seq[:, :width] = ids
        st.start.copy_(width - full_mask.sum(1))
        st.end.fill_(width)
        st.status.zero_()
        st.finished.zero_()
        st.finished[batch:] = True  # unused rows: finished from the start (fed nothing, emit nothing)
        fill_rows(st.params, params)
        self._max_new.fill_(new)
        self._eos.fill_(-1)
        if eos:
            self._eos[: len(eos)] = torch.tensor(eos, dtype=torch.long, device="cpu")
        self.stats.reset()
        self.prompt_width, self.batch = width, batch
        real = full_mask.sum(1).tolist()  # one host read at the start of a call: the rows' KV budgets
        extra = self.drafted_per_step + 1
        # An unused row is fed nothing when finished rows are skipped (no KV blocks at all); a tree
        # scores every row, so it keeps room for one step's tentative tokens there.
        unused = 0 if st.skip_finished else extra
        prompt = PromptBatch(ids, full_mask, [n + new + extra if n else unused for n in real], self.drafted_per_step)
        self._begin_stage(prompt, call["stage"])
        return prompt

    def _begin_stage(self, prompt: PromptBatch, request) -> None:
        """The call's logits stage (logits_stage.py): built at the first call that asks for one (a
        user's logits_processor: every call, eagerly), re-filled in place by later calls."""
        if request is None:
            if self.stage is not None and any(steps.graphs for steps in self._steps_by_k.values()):
                raise ValueError("this decoder's graphs were captured with a logits stage; a call without one needs another decoder")
            self.stage = self.state.stage = None
            return
        # forced_eos_token_id's position: generation_config's max_new_tokens (may differ from the loop's
        # own when a user's MaxLengthCriteria decides the length)
        forced_at = self.max_new_tokens if request.max_new_tokens is None else request.max_new_tokens
        if self.stage is None or request.spec == "user":
            self.stage = LogitsStage(request, rows=self.rows, vocab=self.target.vocab_size, device=self.device,
                                     prompt_width=prompt.ids.shape[1], max_new_tokens=forced_at,
                                     fused_penalties=self.fused_penalties)
            if not self.stage.graph_safe and self.graph_mode != "eager":
                raise ValueError(f"{self.stage.graph_note}: decode such calls with cuda_graphs=False")
        self.stage.begin_call(prompt, request, forced_at, self.batch)
        self.state.stage = self.stage

    def _prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **overrides) -> None:
        """Prompt into both caches, the first token (a K = 0 verify at offset 0, y ~ q, like
        every later bonus token), then (first call) the step callables of the graph mode."""
        self.timer.mark("prefill")
        prompt = self._begin_call(input_ids, attention_mask, self._call_options(overrides))
        logits = self.target.prefill(prompt.ids, prompt.mask, budgets=prompt.budgets, max_new_tokens=self.max_new_tokens,
                                     num_draft_tokens=prompt.k)[:, None, :]  # [R, 1, V]
        if self.stage is not None:
            logits = self.stage.target(logits, self.state, self._no_drafts)
        tokens, accepted = self._chain_verify(logits, None, self._no_drafts)
        self.stats.record_first(self._append(tokens, accepted))
        self._update_live()
        if self.drafter is not None:
            self.drafter.start(self.state, prompt)
        self._captured_before = self._captured()
        for steps in self._steps_by_k.values():
            steps.check_reuse()
        if self.schedule is not None:
            self.schedule.begin_call()
            self.k = self.schedule.start
        self.steps  # the current K's step callables exist before the first step  # noqa: B018
        self.timer.mark(None)

    @property
    def steps(self):
        """The step callables of the current K (graph_policy.StepCallables), built at its first use."""
        steps = self._steps_by_k.get(self.k)
        if steps is None:
            if self._graph_memory is None:
                self._graph_memory = graph_memory(self.graph_mode)
            steps = self._steps_by_k[self.k] = step_callables(
                self.graph_mode, self.draft_step if self.k else None, self.verify_step, self._state_roots(),
                self.graph_warmup, *self._graph_memory)
        return steps

    def _captured(self) -> int:
        return sum(len(steps.captured()) for steps in self._steps_by_k.values())

    def release(self) -> None:
        """Returns the runners' KV blocks to their pools (after a call)."""
        for runner in (self.target, getattr(self.drafter, "runner", None)):
            if runner is not None and hasattr(runner, "release"):
                runner.release()

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
        num_valid = st.live * (self.k + 1) if st.skip_finished else None  # self.k: this iteration's K
        target_logits = self.target.score(target_in, num_valid)  # [B, K+1, V], the runner's dtype
        if self.stage is not None:  # logits processors per position (each sees the drafts before it)
            target_logits = self.stage.target(target_logits, st, drafts)
        if draft_logits is not None and draft_logits.dtype != target_logits.dtype:
            target_logits, draft_logits = target_logits.float(), draft_logits.float()
        tokens, accepted = self._chain_verify(target_logits, draft_logits, drafts)  # [B, K+1] int32, [B] int32
        self.target.commit(self._kept(accepted.long() + 1))
        count = self._append(tokens, accepted)
        self.stats.record(accepted, count)
        if self.schedule is not None:  # acceptance per position, whatever K this iteration ran
            self.stats.record_positions(accepted, count, self.k)
        if self.k:
            self.drafter.commit(accepted, drafts)
        self._update_live()

    def _chain_verify(self, target_logits, draft_logits, drafts):
        if self.stage is not None and self.stage.penalties is not None:  # fused into the kernels
            return self._verify_impl(target_logits, draft_logits, drafts, self._verify_params, self.stage.penalties)
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
        # EOS ids live in a device buffer (-1 = unused): the same ops every call, EOS or not.
        is_eos = (toks[..., None] == self._eos).any(-1) & emitted
        first_eos = torch.where(is_eos, slot, width).amin(1)
        emitted &= slot <= first_eos[:, None]
        room = (self._max_new - st.gen_len)[:, None]
        emitted &= (slot < room) & ~st.finished[:, None]
        count = emitted.long().sum(1)
        index = st.end[:, None] + slot
        st.seq.scatter_(1, index, torch.where(emitted, toks, st.seq.gather(1, index)))
        if self.stage is not None:  # the penalties' token counts
            self.stage.appended(toks, emitted)
        done = st.gen_len + count >= self._max_new
        done |= (first_eos < width) & (count > 0)
        st.finished |= done
        st.gen_len.add_(count)
        st.end += count
        return count

    def _update_live(self) -> None:
        """status row 1 (live) from finished: what the next poll reports and the next iteration feeds."""
        torch.logical_not(self.state.finished, out=self.state.live)

    def step(self) -> None:
        """One iteration at the current K: the draft and verify steps (after K's capture, two
        graph replays). Phases are tagged with K when they are the steps' running cost (eager,
        or replays): the warm-up and the capture are timed apart ("capture"). The common case
        (K settled: graphs captured, or eager) costs two dict / set lookups of host work
        (tests/engine/test_loop_host_work.py bounds it)."""
        k = self.k
        steps = self._steps_by_k[k]  # built when K was chosen (_prefill, _choose_k)
        phase, tag = None, k
        if k not in self._settled:
            if steps.graphs and not steps.ready():  # warm-up or capture of this K's graphs
                phase = "capture" if steps.graphs["verify"].next_call_captures else None
                tag = None
            else:
                self._settled.add(k)
                if self.schedule is not None:
                    self.schedule.mark_ready(k, graphs=bool(steps.graphs))
        if k:
            self.timer.mark(phase or "draft", tag)
            drafts, draft_logits = steps.draft()
        else:
            drafts, draft_logits = self._no_drafts, None
        self.timer.mark(phase or "target", tag)
        steps.verify(drafts, draft_logits)
        self.timer.mark(None)

    def _choose_k(self, snapshot, issued: int) -> None:
        """The adaptive schedule's K for the next iteration, from the polled counters and the
        phases the device has finished (schedule.py); K shrinks to the tokens left."""
        schedule = self.schedule
        if snapshot is not None and snapshot.counters is not None:
            schedule.observe_counters(snapshot.counters)
            self._last_snapshot = snapshot
        schedule.observe_phases(self.timer.drain())
        remaining = None
        last = self.__dict__.get("_last_snapshot")
        if last is not None:  # the longest live row as of that poll, less what the iterations since may have made
            live = last.gen_len[: self.batch]
            remaining = self.max_new_tokens - int(live.min()) if live.size else None
        self.k = schedule.choose(remaining)
        if self.k_leader is not None:  # tensor parallel: rank 0's choice on every rank (distributed/k_leader.py)
            settled = self.k_leader.settle(issued, self.k)
            schedule.follow(self.k, settled)
            self.k = settled
        if self.k not in self._steps_by_k:
            self.steps  # built at the first use of this K  # noqa: B018

    # -- the loop ------------------------------------------------------------------------
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, params=_DEFAULT, max_new_tokens=_DEFAULT,
                 eos_token_ids=_DEFAULT, pad_token_id=_DEFAULT, streamer=_DEFAULT, stage=_DEFAULT,
                 stopping_criteria=_DEFAULT) -> torch.Tensor:
        """input_ids [B, P] (left padded, B <= rows), attention_mask [B, P] -> tokens [B, P + new]
        (pad after EOS). The keyword arguments override the constructor's for this call; stage: a
        logits_stage.StageRequest (logits processors / penalties) or None; stopping_criteria: a
        stopping.CallLimits with host-side criteria (transformers' other than max length and EOS)."""
        t0 = time.perf_counter()
        try:
            self._prefill(input_ids, attention_mask, params=params, max_new_tokens=max_new_tokens,
                          eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, streamer=streamer, stage=stage,
                          stopping_criteria=stopping_criteria)
            poller = self._start_polls(input_ids)
            iterations = 0
            # Every unfinished row gains >= 1 token per iteration: max_new_tokens - 1 iterations suffice.
            while iterations < self.max_new_tokens - 1:
                snapshot = poller.wait(iterations)
                if snapshot is not None and self._take_snapshot(snapshot, iterations):
                    break
                if self.schedule is not None:
                    self._choose_k(snapshot, iterations)
                self.step()
                iterations += 1
                poller.issue(iterations)
            return self._finish(poller, iterations, t0)
        finally:
            self.calls += 1

    def _start_polls(self, input_ids: torch.Tensor) -> RunAheadPoller:
        """The decoder's poller (one that copies row 0 of the tokens when streaming, every row when
        host-side stopping criteria run), reset for this call: its pinned ring and events are made
        once per decoder."""
        streaming = self.streamer is not None
        if streaming:
            self.streamer.put(input_ids.cpu())
            self._streamed = 0
        copies = "all" if self._stops is not None else "row0" if streaming else None
        pollers = self.__dict__.setdefault("_pollers", {})
        poller = pollers.get(copies)
        if poller is None:
            seq = {"all": self.state.seq, "row0": self.state.seq[:1], None: None}[copies]
            counters = self.stats.positions if self.schedule is not None else None  # the schedule's acceptance
            poller = pollers[copies] = RunAheadPoller(self.state.status, self.run_ahead, events=self.events, seq=seq,
                                                      counters=counters, lockstep=getattr(self.target, "lockstep_polls", False))
        poller.reset()
        poller.issue(0)
        return poller

    def _take_snapshot(self, snapshot: Snapshot, issued: int) -> bool:
        """A read poll (taken after snapshot.iteration iterations; ``issued`` issued so far): the
        host-side stopping criteria over the rows' new tokens (stopping.py: rows they end are cut
        and marked finished on the device); stream row 0's new tokens; True when every row has
        finished; else give the compacting runners a bound on every row's committed length: the
        poll's longest row plus K+1 tokens (the most one iteration can add to a row) per iteration
        issued since the poll. The bound holds when compact() runs: it is queued on the stream
        after those iterations."""
        if self._stops is not None:
            ended = self._stops.check(snapshot.seq, snapshot.gen_len, snapshot.live)
            if ended:  # fed nothing from the next iteration on (an in-place write between iterations)
                rows = torch.tensor(ended, dtype=torch.long, device="cpu").to(self.device, non_blocking=True)
                self.state.finished.index_fill_(0, rows, True)
                self.state.status[1].index_fill_(0, rows, 0)
        if self.streamer is not None:
            self._stream(self._visible(0, int(snapshot.gen_len[0])), snapshot.seq[0])
        # Every row ended by the criteria: each has made the step its criteria checked (HostStops
        # checks a step once every unfinished row has reached it), so each has its final length.
        if snapshot.done or (self._stops is not None and self._stops.all_done):
            return True
        if self._compacting:
            bound = self.prompt_width + int(snapshot.gen_len.max()) + (self.k_max + 1) * (issued - snapshot.iteration)
            for runner in self._compacting:
                runner.compact(bound)
        return False

    def _visible(self, row: int, gen_len: int) -> int:
        """Row ``row``'s length as the caller sees it: cut where the stopping criteria end it."""
        return gen_len if self._stops is None else self._stops.length(row, gen_len)

    def _finish(self, poller: RunAheadPoller, iterations: int, t0: float) -> torch.Tensor:
        gen_len = self.state.gen_len.cpu()  # the one sync at the end
        poller.finish()
        if self._stops is not None:  # the tokens made since the last poll read, from the device
            seq = self.state.seq[: self.batch].cpu().numpy()
            self._stops.check(seq, gen_len.numpy())
            gen_len = torch.tensor([self._visible(b, int(n)) for b, n in enumerate(gen_len[: self.batch].tolist())])
        if self.streamer is not None:
            self._stream(int(gen_len[0]), None)
            self.streamer.end()
        self.timer.finish()
        gen_len = gen_len[: self.batch]  # the call's rows (the others are a bucket's unused rows)
        new = int(gen_len.max()) if gen_len.numel() else 0
        needed = poller.first_done if poller.first_done is not None else iterations
        loop = dict(poller.report(), iterations_needed=needed)
        schedule = None if self.schedule is None else self.schedule.report()
        self.stats.finish(time.perf_counter() - t0, iterations, self.timer, gen_len, graphs=self.graph_report(), loop=loop,
                          schedule=schedule)
        out = self.state.seq[: self.batch, : self.prompt_width + new].clone()
        if self._stops is not None:  # pad after the token where a criterion ended the row
            after = torch.arange(new, device=self.device)[None, :] >= gen_len.to(self.device)[:, None]
            out[:, self.prompt_width:].masked_fill_(after, self.pad_token_id)
        return out

    def _stream(self, upto: int, row0) -> None:
        """Row 0's tokens up to gen_len ``upto`` to the streamer: from the poll's host copy of the
        row (row0, numpy) or, after the final sync, from the device."""
        if upto > self._streamed:
            start, stop = self.prompt_width + self._streamed, self.prompt_width + upto
            chunk = torch.from_numpy(row0[start:stop].copy()) if row0 is not None else self.state.seq[0, start:stop].cpu()
            self.streamer.put(chunk)
            self._streamed = upto

    def graph_report(self) -> dict:
        """What ran: mode, why eager (if so), calls served by each graph (or its static twin)
        in this call (over every K), graphs captured in this call."""
        if not self._steps_by_k:
            return dict(mode=self.graph_mode, note=self.graph_note, replays={}, captured=0)
        replays = {}
        for steps in self._steps_by_k.values():
            for name, count in steps.replays().items():
                replays[name] = replays.get(name, 0) + count
        before = self.__dict__.setdefault("_replays_before", {})
        this_call = {name: count - before.get(name, 0) for name, count in replays.items()}
        self._replays_before = dict(replays)
        return dict(mode=self.graph_mode, note=self.graph_note, replays=this_call,
                    captured=self._captured() - self._captured_before)
