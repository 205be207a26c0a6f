"""Triton backend of chain_verify and sample: fused kernels, no host sync, CUDA-graph safe.

The launches (verify_plan() in _triton_plan.py states them for any shape and modes without a
GPU; R = B x (2K+1) distributions with draft logits, B x (K+1) without); launches that cannot
do work for the sampling modes known on the host (SamplingTensors.modes) are left out:
launches 1a and 2 when no row uses top-k / top-p / min-p, launch 3 when every row is greedy
(launch 1 then writes the argmax chain's tokens, _triton_greedy.py); unknown modes: all of them
(1a where its plan has it: _triton_plan.rungs_launch).
  0. one zero fill: integer tickets and candidate counters -- none with a caller's workspace
     (kernels/_workspace.py: the kernels put every counter back to zero; the engine's way).
  1. select_stream (_triton_select_stream.py), grid (R, chunks; 63 per row at B = 1, K = 4):
     ONE pass over all logits: max / sum-exp / argmax partials per chunk. Rows with top-k,
     top-p or min-p first read a 1024-value sample of their row and place rungs
     (_triton_sample.py; where the plan says so -- several chunks a row, more than a wave of
     programs: _triton_plan.rungs_launch -- launch 1a, select_rungs (_triton_select_rungs.py,
     grid (R,)), places them once per row before this launch instead), then, in the same
     pass, gather their top set (~8 k values for
     k <= CAP / 16, else ~CAP / 4; integer atomics pick the slots) and count the exact count
     and mass at or above six rungs. Rows without those modes are merged and finished by
     their last program (integer ticket).
  2. select_finish (_triton_select_finish.py), grid (R, chunks; one program per SM in all),
     selecting rows only: every program merges its row's partials and locates, from the exact
     counts and masses at
     the rungs, the interval holding each threshold; if it is not the top set, the chunks
     gather it (a second pass over that row only) or sum min-p by chunks; the last program
     (integer ticket) searches the gathered values in registers (_triton_search.py).
  3. emit (_triton_emit.py), grid (B tiles, chunks): the ratio test, then one pass over the
     emitted position only (Gumbel-max, noise drawn only in tiles that can still win); the
     last program of each row tile merges the chunks and writes the tokens.
Vocabularies of at most CAP values take one selection kernel instead (_triton_select_small.py:
whole rows in registers). Passes over the logits: 1 (+ the emitted position's target and
draft rows: 2 of 2K+1 distributions), + 1 over the rows whose top-p / larger top-k / deep
min-p lies below the top set. The previous design bisected top-k and top-p with ONE program
per row tile and up to 64 passes over the vocabulary (5-9 ms at B = 1 on an H100).

Why this shape (H100: 132 SMs, ~3 TB/s HBM, ~2-4 us per kernel node in a graph):
- B = 1: the 2.3 MB of logits sit in L2 and latency rules: at most five graph nodes, each row spread
  over tens of programs, last-program merges instead of extra launches, and the expensive
  finish (CAP-value searches, ~230 registers) in its own launch so the streaming pass keeps
  its occupancy (80-116 registers);
- B = 64: bandwidth rules (148 MB, ~49 us per pass): statistics and the candidates of small
  top-k / peaked top-p in one pass instead of a pass per radix digit or bisection step;
- determinism: merges read partials in a fixed order; gathered candidates arrive in
  scheduling order, and everything summed over them is summed in fixed point (int64), so any
  order gives the same bits; tickets and slots are integer atomics; no float atomics;
- graph capture: grids depend on shapes and the host-known modes only (both fixed for a
  generate() call, whose graphs are captured per call); no host sync; every value-dependent
  choice (which rows select, where a threshold lies, the fallback) is made on the device.
The exact fallback (an interval holding a threshold with more than CAP values; top-p below
a top-k of more than CAP / 16) is a few passes over that row by its last program
(_triton_sweeps.py): slower, rare on random and peaked logits, tested by forcing a tiny CAP.
"""
import functools

import torch
import triton

from .._backend import triton_interpreting
from ..rng import STREAM_TOKEN
from ..sampling_params import SamplingTensors
from ._triton_emit import emit_kernel, emit_penalised_kernel
from ._triton_plan import (EMIT_NUM_WARPS, FINISH_NUM_WARPS, PLAN_OVERRIDES, SMALL_NUM_WARPS, STREAM_NUM_WARPS,
                           plan_launches, verify_plan)
from ._triton_select_finish import select_finish_kernel, select_finish_penalised_kernel
from ._triton_select_rungs import select_rungs_kernel, select_rungs_penalised_kernel
from ._triton_select_small import select_small_vocab_kernel, select_small_vocab_penalised_kernel
from ._triton_select_stream import select_stream_kernel, select_stream_penalised_kernel
from .._workspace import KernelWorkspace

__all__ = ["chain_verify_triton", "sample_triton", "verify_plan", "select_stats", "plan_for", "KernelWorkspace"]


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _vocab_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def run_launches(launch, *args, workspace: KernelWorkspace | None = None):
    """launch(*args), the launcher of one call's kernels (this module's, tree_verify's). The
    interpreter evaluates both sides of every select (e.g. exp overflow in lanes that are then
    discarded) and numpy warns about them: silenced there (the GPU path has no such warnings).
    A call that raises between its launches discards the workspace's buffers: a launch that ran
    may have left counters for one that did not."""
    try:
        if not triton_interpreting():
            return launch(*args)
        import numpy as np

        with np.errstate(all="ignore"):
            return launch(*args)
    except BaseException:
        if workspace is not None:
            workspace.discard()
        raise


def _run(*args):
    return run_launches(_launch, *args, workspace=args[-1])


def penalty_args(penalties, tokens: torch.Tensor, width: int, first: int) -> tuple | None:
    """What a penalised kernel takes after its penalty-free arguments (kernels/penalties/triton.py):
    (positional args, keyword args), or None when no row may use a penalty (penalties None or
    penalties.active empty: the penalty-free kernels, today's launches). tokens int [B, >= 1]:
    the generated tokens the state lacks, of which the first ``width`` are real columns and
    position i sees the first first + i (chain: the drafts, first 0; sample: the prefix, first =
    width). The penalised launches compile without fused multiply-adds (enable_fp_fusion=False)
    so that z - f * count rounds twice, as the reference and the C++ op do."""
    if penalties is None or not penalties.active:
        return None
    counts = penalties.counts
    return ((counts, penalties.repetition, penalties.frequency, penalties.presence, tokens, counts.stride(0),
             tokens.stride(0), tokens.stride(1)),
            dict(W=width, P0=first, enable_fp_fusion=False))


def select_stats(target, draft, draft_tokens, params: SamplingTensors, plan, extra_counters: int = 0,
                 greedy_out: tuple | None = None, pen: tuple | None = None, workspace: KernelWorkspace | None = None):
    """Launches 0-2 (the zero fill and the selection kernels) for plan = plan_launches(...):
    the standardisation statistics of every distribution. target [B, K+1, V] and draft
    [B, K, V] (the target itself when there are no draft logits) with unit vocab stride,
    draft_tokens [B, K] (-1 pads: positions past a row's first -1 are not computed).
    Returns (stats, paths, extra): stats = (m, s2, s3 fp32, tkey int64, amax int32), each
    [B * NPOS] (the glossary in _triton_common.py; distribution b * NPOS + pos: target position
    pos <= K, draft position pos - K - 1 above), paths int32 [B * NPOS] (how each distribution's
    thresholds were settled) and ``extra`` int32 zeros [extra_counters] from the same fill (the
    caller's own tickets: one fill launch in all). plan.greedy_tokens (every row greedy): the
    selection launch also writes the tokens into greedy_out = (tokens int32 [B, K+1],
    num_accepted int32 [B]) (_triton_greedy.py). The finishing launch runs only when plan.finish.
    pen: penalty_args(...) (plan.penalties): the penalised variants of the same kernels.
    workspace: a KernelWorkspace whose counters the kernels keep at zero: no zero fill (launch 0);
    ``paths`` then comes from its scratch buffer and holds nothing meaningful."""
    if bool(pen) != plan.penalties:
        raise ValueError("pass pen = penalty_args(...) exactly when the plan has penalties")
    rows, npos, vocab, k = plan.rows, plan.npos, plan.vocab, plan.k
    pen_args, pen_kw = pen or ((), {})
    device = target.device
    strides = (target.stride(0), target.stride(1), draft.stride(0), draft.stride(1))
    token_strides = (draft_tokens.stride(0), draft_tokens.stride(1)) if k else (0, 0)
    block_k = triton.next_power_of_2(max(k, 1))
    p = params
    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    # Integer counters that must start at zero, in one fill: candidate fills [R, 2], streaming and
    # finishing tickets [R] each (large vocabularies), the paths diagnostics [R] (written, not
    # counted), the caller's extra, the batch rows' tickets [B] of the greedy tokens. With a
    # workspace the counters are its persistent zeros (the kernels leave them zero) and the paths
    # its scratch: no fill. (The layout without one is the one the recorded launch keys hold:
    # tests/kernels/penalty_off_launches.py; the keys carry each pointer's 16-byte alignment.)
    selection = 4 * rows if plan.large_vocab else 0
    greedy_rows = plan.batch if plan.greedy_tokens else 0
    if workspace is None:
        counters = torch.zeros(selection + rows + extra_counters + greedy_rows, **i32)
        paths = counters[selection:selection + rows]
        tail = counters[selection + rows:]
    else:
        counters = workspace.counters(selection + extra_counters + greedy_rows, device)
        paths = workspace.scratch(rows, device)
        tail = counters[selection:]
    extra, greedy_tickets = tail[:extra_counters], tail[extra_counters:]
    m, s2, s3 = (torch.empty((rows,), **f32) for _ in range(3))
    tkey = torch.empty((rows,), dtype=torch.int64, device=device)
    amax = torch.empty((rows,), **i32)
    common = (target, draft, draft_tokens, p.temperature, p.top_k, p.top_p, p.min_p)
    fence = not triton_interpreting()
    if plan.greedy_tokens:
        if greedy_out is None:
            raise ValueError("a plan with greedy_tokens writes the tokens: pass greedy_out=(tokens, num_accepted)")
        tokens, num_accepted = greedy_out
        greedy = (greedy_tickets, tokens, num_accepted, tokens.stride(0))
    else:
        greedy = (paths, paths, paths, 0)  # never read
    greedy_flags = dict(GREEDY_TOKENS=plan.greedy_tokens, HAS_DRAFT_LOGITS=plan.has_draft,
                        BLOCK_K1=triton.next_power_of_2(k + 1), FENCE=fence)
    if plan.large_vocab:
        part_f = torch.empty((rows, plan.select_chunks, 8), **f32)
        part_i = torch.empty((rows, plan.select_chunks, 8), **i32)
        candidates = torch.empty((rows, 3, plan.cap), **f32)
        rungs = torch.empty((rows, 8), **f32)
        fills, tickets, stream_tickets = counters[:2 * rows], counters[2 * rows:3 * rows], counters[3 * rows:4 * rows]
        sample = dict(CAP=plan.cap, SAMPLE=plan.sample, SAMPLE_RUN=plan.sample_run, SAMPLE_GROUP=plan.sample_group,
                      SAMPLE_SUB=plan.sample_sub)
        if plan.rungs_launch:  # the rungs once per row (else every streaming program places them)
            (select_rungs_penalised_kernel if pen else select_rungs_kernel)[(rows,)](
                *common, rungs, npos, *strides, *token_strides, *pen_args, **pen_kw, V=vocab, K=k, BLOCK_K=block_k,
                **dict(sample, SAMPLE_SUB=plan.rungs_sub), num_warps=STREAM_NUM_WARPS,
            )
        (select_stream_penalised_kernel if pen else select_stream_kernel)[plan.select_grid](
            *common, part_f, part_i, candidates, fills, rungs, stream_tickets, m, s2, s3, tkey, amax, *greedy[:3], npos,
            plan.select_chunks, *strides, *token_strides, greedy[3], *pen_args, **pen_kw, V=vocab, K=k,
            CHUNK=plan.select_chunk, BLOCK_V=plan.select_block_v, BLOCK_K=block_k,
            BLOCK_C=triton.next_power_of_2(plan.select_chunks), **sample, **greedy_flags, LANES=plan.stream_lanes,
            SELECTS=plan.selects, UNROLL=plan.stream_unroll, RUNGS_GIVEN=plan.rungs_launch, SUMS=plan.stream_sums,
            num_warps=STREAM_NUM_WARPS,
        )
        if plan.finish:  # some row may use top-k / top-p / min-p (the others are done already)
            minp_part = torch.empty((rows, plan.finish_chunks), dtype=torch.int64, device=device)
            (select_finish_penalised_kernel if pen else select_finish_kernel)[plan.finish_grid](
                *common, part_f, part_i, candidates, fills, rungs, minp_part, tickets, m, s2, s3, tkey, amax, paths,
                npos, plan.select_chunks, plan.finish_chunks, *strides, *token_strides, *pen_args, **pen_kw, V=vocab,
                K=k,
                CHUNK=plan.finish_chunk, BLOCK_V=plan.finish_block_v, BLOCK_K=block_k,
                BLOCK_C=triton.next_power_of_2(max(plan.select_chunks, plan.finish_chunks)), CAP=plan.cap,
                BLOCK_S=plan.sweep_block, FENCE=fence, SEARCH_TILE=plan.finish_search_tile, num_warps=FINISH_NUM_WARPS,
            )
    else:
        (select_small_vocab_penalised_kernel if pen else select_small_vocab_kernel)[plan.select_grid](
            *common, m, s2, s3, tkey, amax, *greedy[:3], rows, npos, *strides, *token_strides, greedy[3], *pen_args,
            **pen_kw, V=vocab, K=k, BLOCK_R=plan.select_block_r, BLOCK_VF=plan.select_block_v, BLOCK_K=block_k,
            **greedy_flags, num_warps=SMALL_NUM_WARPS,
        )
    return (m, s2, s3, tkey, amax), paths, extra


def plan_for(batch: int, k: int, vocab: int, has_draft: bool, device: torch.device, overrides: dict,
             modes: frozenset | None = None, emits: bool = True, penalties: bool = False):
    """plan_launches for this device (SM count; the interpreter's tiles) and the modes known on
    the host (SamplingTensors.modes); penalties: the penalised kernels."""
    return plan_launches(batch, k, vocab, has_draft, num_sms=_num_sms(device), interpreting=triton_interpreting(),
                         modes=modes, emits=emits, penalties=penalties, **overrides)


def _launch(target, draft, draft_tokens, params: SamplingTensors, positions, stream: int, overrides: dict,
            penalties=None, prefix_tokens=None, workspace=None):
    """target [B, K+1, V], draft [B, K, V] or None, draft_tokens [B, K], positions int64 [B] or
    None (None: noise at position j, the verify step) -> (tokens int32 [B, K+1], num_accepted int32 [B],
    paths int32 [B * NPOS]: how each distribution's thresholds were settled). penalties:
    PenaltyTensors or None; prefix_tokens int [B, W] or None (sample only, K = 0): the generated
    tokens in front of position 0 (the verify's position i sees the drafts before it instead).
    workspace: KernelWorkspace or None (select_stats)."""
    batch, k_plus_1, vocab = target.shape
    k = k_plus_1 - 1
    device = target.device
    tokens = torch.empty((batch, k_plus_1), dtype=torch.int32, device=device)
    num_accepted = torch.empty((batch,), dtype=torch.int32, device=device)
    if batch == 0:
        return tokens, num_accepted, torch.empty((0,), dtype=torch.int32, device=device)
    target = _vocab_contiguous(target)
    if k == 0:  # never read, but a [B, 0] tensor may have a null data pointer, which launchers reject
        draft_tokens = torch.empty((batch, 1), dtype=torch.int32, device=device)
    has_draft = draft is not None and k > 0
    draft = _vocab_contiguous(draft) if has_draft else target
    if prefix_tokens is not None and prefix_tokens.shape[1] > 0:  # sample(): the drafts so far
        pen = penalty_args(penalties, prefix_tokens, prefix_tokens.shape[1], prefix_tokens.shape[1])
    else:  # chain_verify: position i sees the drafts x_0..x_{i-1} (K = 0: none, never read)
        pen = penalty_args(penalties, draft_tokens, k, 0)
    plan = plan_for(batch, k, vocab, has_draft, device, overrides, params.modes, penalties=pen is not None)
    if plan.greedy_tokens:  # every row greedy: the selection launch writes the tokens
        _, paths, _ = select_stats(target, draft, draft_tokens, params, plan, greedy_out=(tokens, num_accepted),
                                   pen=pen, workspace=workspace)
        return tokens, num_accepted, paths
    stats, paths, emit_tickets = select_stats(target, draft, draft_tokens, params, plan, pen=pen, workspace=workspace,
                                              extra_counters=plan.emit_grid[0])  # a ticket per row tile
    pen_args, pen_kw = pen or ((), {})
    m, s2, s3, tkey, amax = stats
    npos = plan.npos
    strides = (target.stride(0), target.stride(1), draft.stride(0), draft.stride(1))
    token_strides = (draft_tokens.stride(0), draft_tokens.stride(1)) if k else (0, 0)
    block_k = triton.next_power_of_2(max(k, 1))
    p = params
    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    fence = not triton_interpreting()

    nchunk = plan.emit_chunks
    q_val, r_val = torch.empty((batch, nchunk), **f32), torch.empty((batch, nchunk), **f32)
    q_idx, r_idx, r_any = (torch.empty((batch, nchunk), **i32) for _ in range(3))
    use_positions = positions is not None
    (emit_penalised_kernel if pen else emit_kernel)[plan.emit_grid](
        target, draft, draft_tokens, p.temperature, p.min_p, p.seed, p.offset,
        positions if use_positions else p.offset,
        m, s2, s3, tkey, amax, q_val, q_idx, r_val, r_idx, r_any, emit_tickets,
        tokens, num_accepted, batch, npos, nchunk, stream, *strides, *token_strides, tokens.stride(0), *pen_args,
        **pen_kw, V=vocab, K=k, CHUNK=plan.emit_chunk, HAS_DRAFT_LOGITS=has_draft, USE_POSITIONS=use_positions,
        BLOCK_R=plan.emit_block_r, BLOCK_V=plan.emit_block_v, BLOCK_K=block_k,
        BLOCK_K1=triton.next_power_of_2(k_plus_1), BLOCK_C=triton.next_power_of_2(nchunk),
        FENCE=fence, LANES=plan.emit_lanes, SKIP_IDENTITIES=plan.emit_skip_identities, EXP_KEYS=plan.emit_exp_keys,
        num_warps=EMIT_NUM_WARPS,
    )
    return tokens, num_accepted, paths


def _plan_overrides(overrides: dict) -> dict:
    """The caller's plan overrides (PLAN_OVERRIDES, documented at plan_launches; None: the plan's
    own choice), as given; any other name is refused as Python refuses an unknown keyword."""
    unknown = sorted(set(overrides) - set(PLAN_OVERRIDES))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}: "
                        f"the plan overrides are {', '.join(PLAN_OVERRIDES)}")
    return overrides


def chain_verify_triton(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingTensors,
    penalties=None,
    *,
    return_paths: bool = False,
    workspace: KernelWorkspace | None = None,
    **overrides,
) -> tuple[torch.Tensor, torch.Tensor]:
    """target_logits [B, K+1, V], draft_logits [B, K, V] or None, draft_tokens [B, K] int32/int64
    (-1 pads), penalties: PenaltyTensors or None -> tokens int32 [B, K+1], num_accepted int32 [B].
    Inputs are validated by kernels.verify.chain_verify. overrides: keywords of
    _triton_plan.PLAN_OVERRIDES (block_v, num_chunks, cap, stream_lanes, stream_unroll, ...; None
    or left out: the plan's choice; each documented at _triton_plan.plan_launches) force a split,
    a loop or a launch of the plan (tests, tuning, the benchmarks' side-by-side ways).
    return_paths: also return int32 [B * NPOS], how each distribution's thresholds were settled
    (_triton_select_stream.py; 0 for small vocabularies). workspace: a KernelWorkspace owned by
    the caller (one per sequence of calls on one stream: kernels/_workspace.py): no zero fill per
    call; not with return_paths."""
    if return_paths and workspace is not None:
        raise ValueError("return_paths needs the per-call counters: pass no workspace")
    tokens, num_accepted, paths = _run(target_logits, draft_logits, draft_tokens, params, None, STREAM_TOKEN,
                                       _plan_overrides(overrides), penalties, None, workspace)
    return (tokens, num_accepted, paths) if return_paths else (tokens, num_accepted)


def sample_triton(
    logits: torch.Tensor,
    params: SamplingTensors,
    positions: torch.Tensor,
    stream: int,
    penalties=None,
    prefix_tokens: torch.Tensor | None = None,
    *,
    workspace: KernelWorkspace | None = None,
    **overrides,
) -> torch.Tensor:
    """logits [B, V], positions int64 [B] -> int32 [B]: one Gumbel-max draw per row from
    standardise(logits) with noise keyed by (seed, offset, position, stream). penalties:
    PenaltyTensors or None; prefix_tokens int [B, W] (-1 = not a token) or None: the row's
    generated tokens the counts do not hold yet (the drafts of this iteration so far).
    workspace and overrides: as chain_verify_triton's."""
    batch = logits.shape[0]
    no_drafts = torch.empty((batch, 0), dtype=torch.int32, device=logits.device)  # K = 0
    tokens, _, _ = _run(logits[:, None, :], None, no_drafts, params, positions, stream, _plan_overrides(overrides),
                        penalties, prefix_tokens, workspace)
    return tokens[:, 0]
