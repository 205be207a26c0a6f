"""SpeculativeDecoder: the decoding loop (DESIGN.md section 1), free of host syncs.

One iteration: drafter.propose(K) -> target.score(K+1 tokens per row, one forward) ->
chain_verify -> commit both caches -> append the emitted tokens to the device output buffer,
update the device-side lengths and finished flags. The host learns about them only through a
poll: a non-blocking copy into pinned memory (CUDA) every ``poll_every`` iterations, read one
poll later, so the GPU always has queued work. K = 0 is plain decoding through the same code.

CUDA graphs (cuda_graphs=None|True|False|"static"): the draft step (drafter.propose: K draft
forwards + sampling) and the verify step (target.score(K+1) + chain_verify + both commits +
the append) are two StepGraphs (graphs.py), captured after ``graph_warmup`` eager iterations
and replayed from then on; the poll, the streamer and compact() stay outside. Two graphs rather
than one per iteration so that the phase timer's events sit between the replays and still time
the draft and the target separately (the cost ratio c); the extra launch is one per iteration.
Both share one memory pool and one capture stream: they are captured and replayed in the same
order (draft, verify) on one stream, so the verify graph may reuse the draft graph's freed
temporaries, while the draft graph's outputs (the verify graph's inputs) stay referenced by the
draft StepGraph. Supported: CUDA, graph-safe runners (PagedRunner: in-place state, static
shapes) and drafters, Triton kernels (the torch references read lengths on the host). "static"
runs the same graph code path eagerly on any device, checking every graph-safety rule
(graphs.py): the CPU-checkable twin. Graphs belong to one decoder (one generate call): each
call captures its own (the runners' buffers are sized per call).
"""
import dataclasses
import time
from dataclasses import dataclass

import torch

from .graphs import StepGraph, state_tensors
from .kernels._backend import resolve_backend
from .kernels.verify import prepared_impls
from .kernels.sampling_params import SamplingTensors
from .stats import PhaseTimer, StatsRecorder

# cuda_graphs=None: opt-in for now. The capture path has only run on CPU (fake torch.cuda graph API +
# the "static" twin); flip to True once tests/engine/test_cuda_graphs_gpu.py has passed on a GPU.
GRAPHS_BY_DEFAULT = False
GRAPH_MODES = ("eager", "static", "cuda_graphs")


def static_unsupported_reason(target, drafter) -> str | None:
    """Why the graph code path cannot run these runners / drafter at all (any device), or None."""
    if not getattr(target, "graph_safe", False):
        return f"the target runner {type(target).__name__} keeps state that is not static (runner='paged' is)"
    if drafter is not None and not getattr(drafter, "graph_safe", False):
        return f"the drafter {type(drafter).__name__} (or its runner) keeps state that is not static"
    return None


def graph_unsupported_reason(target, drafter, backend, device: torch.device) -> str | None:
    """Why the draft and verify steps cannot be captured as CUDA graphs here, or None."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the model is on {device.type}"
    reason = static_unsupported_reason(target, drafter)
    if reason is not None:
        return reason
    try:
        chosen = {op: resolve_backend(backend, device, op) for op in ("chain_verify", "sample")}
        for runner in (target, getattr(drafter, "runner", None)):
            if runner is not None:
                chosen[f"{type(runner).__name__} attention"] = resolve_backend(getattr(runner, "backend", None), device,
                                                                               "paged_attention")
    except ValueError as exc:
        return str(exc)
    slow = [f"{op}: {b}" for op, b in chosen.items() if b != "triton"]
    return f"the kernels must be the Triton ones ({', '.join(slow)})" if slow else None


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
    cuda_graphs: None (CUDA graphs where supported, see graph_unsupported_reason; else eager,
    graph_note says why), True (ValueError if unsupported), False (eager), "static" (the graph
    code path run eagerly with its checks; any device, graph-safe runners). graph_warmup: eager
    iterations before the capture (>= 1 for PagedRunner: its index cache is built on first use).
    """

    def __init__(self, target, drafter, *, k: int, params: SamplingTensors, max_new_tokens: int,
                 eos_token_ids=None, pad_token_id: int = 0, backend=None, poll_every: int | None = None,
                 streamer=None, cuda_graphs=None, graph_warmup: int = 1):
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
        self._verify_impl = prepared_impls(backend, self.device)[0]  # resolves (and checks) the backend once
        self.stats = StatsRecorder(self.k, self.device)
        self.timer = PhaseTimer(self.device)
        self.graph_mode, self.graph_note = self._resolve_graphs(cuda_graphs)
        if isinstance(graph_warmup, bool) or not isinstance(graph_warmup, int) or graph_warmup < 0:
            raise ValueError(f"graph_warmup must be an int >= 0, got {graph_warmup!r}")
        self.graph_warmup = graph_warmup
        self._draft, self._verify = self._draft_step, self._verify_step

    def _resolve_graphs(self, cuda_graphs):
        """(mode in GRAPH_MODES, why eager where cuda_graphs=None found graphs unsupported)."""
        if isinstance(cuda_graphs, str):
            if cuda_graphs != "static":
                raise ValueError(f"cuda_graphs must be None, True, False or 'static', got {cuda_graphs!r}")
            reason = static_unsupported_reason(self.target, self.drafter)
            if reason is not None:
                raise ValueError(f"cuda_graphs='static' cannot run: {reason}")
            return "static", None
        if cuda_graphs is not None and cuda_graphs is not True and cuda_graphs is not False:
            raise ValueError(f"cuda_graphs must be None, True, False or 'static', got {cuda_graphs!r}")
        if cuda_graphs is False:
            return "eager", "cuda_graphs=False"
        reason = graph_unsupported_reason(self.target, self.drafter, self.backend, self.device)
        if reason is None and (cuda_graphs or GRAPHS_BY_DEFAULT):
            return "cuda_graphs", None
        if cuda_graphs is True:
            raise ValueError(f"cuda_graphs=True cannot run: {reason}")
        return "eager", reason or "off by default"

    def graph_state(self) -> dict:
        """name -> tensor: everything the draft and verify steps may read or write that outlives a
        step (graphs.state_tensors from the decoder, the runners and the drafter, whatever their class)."""
        drafter = self.drafter
        return state_tensors({"decoder": self, "target": self.target, "drafter": drafter,
                              "drafter.runner": getattr(drafter, "runner", None)})

    def _build_graphs(self) -> None:
        """The draft and verify StepGraphs (after the prefill: their state exists)."""
        capture = self.graph_mode == "cuda_graphs"
        common = dict(capture=capture, warmup=self.graph_warmup, state=self.graph_state,
                      pool=torch.cuda.graph_pool_handle() if capture else None,
                      stream=torch.cuda.Stream() if capture else None)
        self._draft = StepGraph(self._draft_step, name="draft", **common) if self.k else None
        self._verify = StepGraph(self._verify_step, name="verify", **common)

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
        tokens, accepted = self._chain_verify(logits[:, None, :], None, torch.zeros(batch, 0, dtype=torch.long, device=dev))
        self._append(tokens, accepted)
        if self.drafter is not None:
            self.drafter.start(self.state)
        self._no_drafts = torch.zeros(batch, 0, dtype=torch.long, device=dev)
        if self.graph_mode != "eager":
            self._build_graphs()

    def _chain_verify(self, target_logits, draft_logits, drafts):
        params = dataclasses.replace(self.params, offset=self.state.gen_len)
        return self._verify_impl(target_logits, draft_logits, drafts, params)

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
    def _draft_step(self):
        """drafter.propose(K) -> (drafts [B, K], draft_logits [B, K, V] or None)."""
        drafts, draft_logits = self.drafter.propose(self.k)
        return drafts, draft_logits

    def _verify_step(self, drafts: torch.Tensor, draft_logits) -> None:
        """target.score(K+1) -> chain_verify -> commit both caches -> append. Every effect is an
        in-place update of the state (graph safe); returns nothing."""
        st = self.state
        target_in = torch.cat([st.last_token()[:, None], drafts.clamp(min=0)], 1)
        target_logits = self.target.score(target_in).float()
        tokens, accepted = self._chain_verify(target_logits, draft_logits, drafts)
        self.target.commit(accepted.long() + 1)
        self._append(tokens, accepted)
        if self.k:
            self.drafter.commit(accepted, drafts)

    def step(self) -> None:
        """One iteration; no host sync (after the capture, two graph replays)."""
        capturing = self.graph_mode != "eager" and self._verify.next_call_captures
        self.timer.mark("capture" if capturing else "draft")
        drafts, draft_logits = self._draft() if self.k else (self._no_drafts, None)
        self.timer.mark("capture" if capturing else "target")
        self._verify(drafts, draft_logits)
        self.timer.mark(None)

    def graph_report(self) -> dict:
        """What ran: mode, why eager (if so), calls served by each graph (or its static twin)."""
        replays = {}
        if self.graph_mode != "eager":
            replays = {g.name: g.replays for g in (self._draft, self._verify) if g is not None}
        return dict(mode=self.graph_mode, note=self.graph_note, replays=replays)

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
        self.stats.finish(time.perf_counter() - t0, iteration, self.timer, gen_len, graphs=self.graph_report())
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
