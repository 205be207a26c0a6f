"""When the decoding loop runs its draft and verify steps as CUDA graphs, and the callables it
calls for them (the step functions themselves, or StepGraphs around them: graphs.py).

Modes (GRAPH_MODES):
    "eager"        the step functions are called directly.
    "cuda_graphs"  each step is a StepGraph(capture=True): ``warmup`` eager calls on a side
                   stream, then one capture, then replays. CUDA, graph-safe runners and drafter
                   (runners/base.py ``graph_safe``), Triton kernels (the torch references read
                   lengths on the host).
    "static"       StepGraph(capture=False): the same graph code path run eagerly on any device,
                   checking every graph-safety rule (the CPU-checkable twin, for tests); the C++
                   or Triton kernels (the torch references read lengths on the host).

generate(cuda_graphs=None) follows GRAPHS_BY_DEFAULT: True since the whole suite passed on an
H100 (bench/results/h100_2026-11-23/gpu_tests_112bf69.log: 1312 passed, 0 failed, including
tests/engine/test_cuda_graphs_gpu.py and the capture table over K 1-8 x batch {1,3,8,32,64}, which
had failed at K=5 / K=7 on the first H100 run). Where graphs cannot run (CPU, a runner or drafter
that is not graph safe, non-Triton kernels) None means eager, with the reason in stats.graph_note.
A runner whose ``graphs_by_default`` is False (the tensor-parallel one: NCCL inside the graphs,
not run on a multi-GPU machine yet) captures only with cuda_graphs=True.
"""
from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels._backend import resolve_backend
from .graphs import StepGraph, state_tensors

GRAPHS_BY_DEFAULT = True
GRAPH_MODES = ("eager", "static", "cuda_graphs")


def static_unsupported_reason(target, drafter) -> str | None:
    """Why the graph code path cannot run these runners / drafter at all (any device), or None."""
    if not getattr(target, "graph_safe", False):
        return f"the target runner {type(target).__name__} keeps state that is not static (runner='paged' is)"
    if drafter is not None and not getattr(drafter, "graph_safe", False):
        # A drafter that is never graph safe says why (drafters/cross_tokenizer.py: host work).
        return getattr(drafter, "graph_note", None) or f"the drafter {type(drafter).__name__} (or its runner) keeps state that is not static"
    return None


def _kernels(target, drafter, backend, device: torch.device) -> dict:
    """The kernel backend each step's op resolves to here (op -> "triton" / "cpp" / "torch");
    ValueError where one cannot run."""
    chosen = {op: resolve_backend(backend, device, op) for op in ("chain_verify", "sample")}
    for runner in (target, getattr(drafter, "runner", None)):
        if runner is not None:
            chosen[f"{type(runner).__name__} attention"] = resolve_backend(getattr(runner, "backend", None), device,
                                                                           "paged_attention")
    return chosen


def graph_unsupported_reason(target, drafter, backend, device: torch.device) -> str | None:
    """Why the draft and verify steps cannot be captured as CUDA graphs here, or None."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the model is on {device.type}"
    reason = static_unsupported_reason(target, drafter)
    if reason is not None:
        return reason
    try:
        chosen = _kernels(target, drafter, backend, device)
    except ValueError as exc:
        return str(exc)
    slow = [f"{op}: {b}" for op, b in chosen.items() if b != "triton"]
    return f"the kernels must be the Triton ones ({', '.join(slow)})" if slow else None


def static_kernels_reason(target, drafter, backend, device: torch.device) -> str | None:
    """Why the graph code path's checks would stop these kernels mid-call, or None: the torch
    references read lengths on the host (nonzero, .item()), which the static twin refuses as a
    graph would; the C++ and Triton kernels do not (found by the sampling fuzzing round:
    backend='torch' with cuda_graphs='static' passed the checks, then raised GraphSafetyError
    in the first draft step)."""
    try:
        chosen = _kernels(target, drafter, backend, device)
    except ValueError as exc:
        return str(exc)
    host = [f"{op}: torch" for op, b in chosen.items() if b == "torch"]
    return (f"the torch reference kernels read lengths on the host ({', '.join(host)}); use backend='cpp' or "
            "'triton'") if host else None


def resolve_graph_mode(cuda_graphs, target, drafter, backend, device: torch.device) -> tuple[str, str | None]:
    """cuda_graphs (None | True | False | "static") -> (mode in GRAPH_MODES, why eager or None).
    None: CUDA graphs where supported and GRAPHS_BY_DEFAULT, else eager with the reason;
    True / "static": ValueError when unsupported."""
    if isinstance(cuda_graphs, str):
        if cuda_graphs != "static":
            raise ValueError(f"cuda_graphs must be None, True, False or 'static', got {cuda_graphs!r}")
        reason = static_unsupported_reason(target, drafter) or static_kernels_reason(target, drafter, backend, device)
        if reason is not None:
            raise ValueError(f"cuda_graphs='static' cannot run: {reason}")
        return "static", None
    if cuda_graphs is not None and cuda_graphs is not True and cuda_graphs is not False:
        raise ValueError(f"cuda_graphs must be None, True, False or 'static', got {cuda_graphs!r}")
    if cuda_graphs is False:
        return "eager", "cuda_graphs=False"
    reason = graph_unsupported_reason(target, drafter, backend, device)
    if reason is None and cuda_graphs is None and not getattr(target, "graphs_by_default", True):
        return "eager", getattr(target, "graphs_note", "the target runner asks for cuda_graphs=True to capture")
    if reason is None and (cuda_graphs or GRAPHS_BY_DEFAULT):
        return "cuda_graphs", None
    if cuda_graphs is True:
        raise ValueError(f"cuda_graphs=True cannot run: {reason}")
    return "eager", reason or "off by default (graph_policy.GRAPHS_BY_DEFAULT)"


@dataclass
class StepCallables:
    """What the loop calls for one iteration: ``draft() -> (drafts [B, K], draft_logits [B, K, V]
    or None)`` (None when K = 0) and ``verify(drafts, draft_logits) -> None``; ``graphs``: the
    StepGraphs behind them by name (empty in eager mode)."""

    draft: Callable | None
    verify: Callable
    graphs: dict

    def replays(self) -> dict:
        return {name: graph.replays for name, graph in self.graphs.items()}

    def calls(self) -> int:
        """Calls made so far (the verify step's: every iteration calls it)."""
        return self.graphs["verify"].calls if self.graphs else 0

    def ready(self) -> bool:
        """Every graph captured (or its static twin's capture call made)."""
        return bool(self.graphs) and all(graph.ready for graph in self.graphs.values())

    def captured(self) -> list:
        """Names of the graphs captured so far."""
        return [name for name, graph in self.graphs.items() if graph.ready]

    def check_reuse(self) -> None:
        """Before a later call replays these graphs: every state tensor they captured is still
        where it was (StepGraph.check_reuse)."""
        for graph in self.graphs.values():
            graph.check_reuse()


def graph_memory(mode: str):
    """(pool, stream) for the StepGraphs of one decoder (every K's): a private memory pool and a
    capture stream under CUDA graphs, (None, None) otherwise."""
    if mode != "cuda_graphs":
        return None, None
    return torch.cuda.graph_pool_handle(), torch.cuda.Stream()


def step_callables(mode: str, draft_step, verify_step, state_roots: dict, warmup: int, pool=None,
                   stream=None) -> StepCallables:
    """The draft / verify callables for ``mode``: the step functions themselves (eager) or
    StepGraphs around them sharing one memory pool and one capture stream (captured and replayed
    in the same order, draft then verify, so the verify graph may reuse the draft graph's freed
    temporaries while the draft graph's outputs, the verify graph's inputs, stay referenced by
    the draft StepGraph). state_roots: name -> object whose tensors outlive a step (the decoder,
    runners, drafter), searched by graphs.state_tensors at capture time."""
    if mode == "eager":
        return StepCallables(draft_step, verify_step, {})
    capture = mode == "cuda_graphs"
    if capture and pool is None:
        pool, stream = graph_memory(mode)
    common = dict(capture=capture, warmup=warmup, state=lambda: state_tensors(state_roots), pool=pool, stream=stream)
    graphs = {}
    if draft_step is not None:
        graphs["draft"] = StepGraph(draft_step, name="draft", **common)
    graphs["verify"] = StepGraph(verify_step, name="verify", **common)
    return StepCallables(graphs.get("draft"), graphs["verify"], graphs)
