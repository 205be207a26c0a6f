"""Triton backend of tree_verify: no host sync, grids from static shapes (CUDA-graph capturable).

Launches (each boundary a grid-wide dependency):
  0-2. the standardisation statistics of every node's target and draft row: kernels/verify's
       selection launches (select_stats: a zero fill -- none with a caller's KernelWorkspace, the
       engine's, which also holds the dummy drafts and the tickets below --, the streaming pass, the finish when some
       row may use top-k / top-p / min-p: SamplingTensors.modes, known on the host), with
       K = N - 1 and no -1 among the (dummy) drafts, so every position is computed (_node_stats
       below is the only code that knows their interface)
  3.   residual_mass (sampled children only): the residual masses W_k each sibling test needs,
       one launch per k = 1 .. max_children - 1 (W_k depends on W_{k-1}), each over vocab chunks
  4.   walk: one row tile per program, an ascending scan over the N nodes
  5-6. emit_partial / emit_final: Gumbel-max of the emitted token at the final node, vocab
       chunks merged in order (as in kernels/verify/triton.py)
N and V are constexpr: one compiled variant per (tree size, model vocabulary).
"""
import torch
import triton

from .._backend import triton_interpreting
from ..rng import STREAM_TOKEN
from ..sampling_params import SamplingTensors
from ..verify.triton import _num_sms, _vocab_contiguous, plan_for, run_launches, select_stats
from . import _triton_kernels as kernels

# Row tiles of the walk: [BLOCK_R, BLOCK_N] int32 tiles in registers (64 x 64 fp32/int32 = 16
# per thread at 8 warps); the interpreter pays per operation, so it takes whole batches.
WALK_ROWS = 16
WALK_ROWS_INTERPRETER = 4096
# The residual-mass and emission kernels: [BLOCK_R, BLOCK_V] tiles of at most TILE values, rows
# split into vocab chunks so that a few programs per SM work at B = 1 (the interpreter: whole
# rows, few programs).
MAX_BLOCK_V, TILE, PROGRAMS_PER_SM = 1024, 2048, 4
MAX_BLOCK_V_INTERPRETER, TILE_INTERPRETER, INTERPRETER_PROGRAMS = 32768, 131072, 4
NUM_WARPS = 4


def _tile(vocab: int, rows: int, block_v: int | None) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_V) for rows of vocab entries."""
    interpreting = triton_interpreting()
    block_v = block_v or min(triton.next_power_of_2(vocab), MAX_BLOCK_V_INTERPRETER if interpreting else MAX_BLOCK_V)
    budget = TILE_INTERPRETER if interpreting else TILE
    return max(1, min(triton.next_power_of_2(rows), budget // block_v)), block_v


def _split_vocab(vocab: int, row_tiles: int, device, block_v: int, num_chunks: int | None) -> tuple[int, int]:
    """(chunk size, number of chunks) covering the vocab; the chunk size is a multiple of block_v."""
    if num_chunks is None:
        programs = INTERPRETER_PROGRAMS if triton_interpreting() else PROGRAMS_PER_SM * _num_sms(device)
        num_chunks = triton.cdiv(programs, row_tiles)
    num_chunks = max(1, min(num_chunks, triton.cdiv(vocab, block_v)))
    chunk = triton.cdiv(triton.cdiv(vocab, num_chunks), block_v) * block_v
    return chunk, triton.cdiv(vocab, chunk)


def _node_stats(target, draft, params: SamplingTensors, block_v, num_chunks, workspace=None):
    """(m, s2, s3, tkey, amax) [B * NPOS] and NPOS: kernels/verify's statistics of target position
    n (index b * NPOS + n) and draft position n (b * NPOS + N + n, n <= N - 2; the last node has
    no children, so its draft row is never needed). draft None: target positions only."""
    batch, n, vocab = target.shape
    k = n - 1
    has_draft = draft is not None and k > 0
    width = max(k, 1)  # no -1 among the dummy drafts: every position is computed
    dummy_drafts = (torch.zeros((batch, width), dtype=torch.int32, device=target.device) if workspace is None
                    else workspace.zeros(batch * width, target.device).view(batch, width))
    plan = plan_for(batch, k, vocab, has_draft, target.device, dict(block_v=block_v, num_chunks=num_chunks),
                    params.modes, emits=False)  # no finishing launch when no row truncates
    stats, _, _ = select_stats(target, draft if has_draft else target, dummy_drafts, params, plan, workspace=workspace)
    return stats, plan.npos


def _launch(target, draft, tokens, parents, params: SamplingTensors, block_v, num_chunks, max_children,
            workspace=None):
    batch, n, vocab = target.shape
    device = target.device
    i32 = dict(dtype=torch.int32, device=device)
    out = torch.empty((batch, n), **i32)
    path = torch.empty((batch, n), **i32)
    num_accepted = torch.empty((batch,), **i32)
    if batch == 0:
        return out, path, num_accepted
    target = _vocab_contiguous(target)
    has_draft = draft is not None and n > 1
    draft = _vocab_contiguous(draft) if has_draft else target
    tokens, parents = tokens.contiguous(), parents.contiguous()
    stats, npos = _node_stats(target, draft if has_draft else None, params, block_v, num_chunks, workspace)
    p = params
    strides = (target.stride(0), target.stride(1), draft.stride(0), draft.stride(1))
    block_n = triton.next_power_of_2(n)

    mass = torch.empty((batch * n, n), dtype=torch.float32, device=device)
    kmax = n - 1 if max_children is None else min(max_children, n - 1)
    if has_draft and kmax > 1:  # W_k for k = 1 .. kmax - 1: one launch each, vocab split over programs
        block_r, bv = _tile(vocab, batch * n, block_v)
        tiles = triton.cdiv(batch * n, block_r)
        chunk, nchunk = _split_vocab(vocab, tiles, device, bv, num_chunks)
        lam_next = torch.empty((batch * n,), dtype=torch.float32, device=device)
        part = torch.empty((batch * n, nchunk), dtype=torch.float32, device=device)
        tickets = (torch.zeros((tiles, kmax), **i32) if workspace is None
                   else workspace.counters(tiles * kmax, device).view(tiles, kmax))  # reset by their last programs
        for k in range(1, kmax):
            kernels.residual_mass_kernel[(tiles, nchunk)](
                target, draft, parents, p.temperature, p.min_p, *stats, mass, lam_next, part, tickets,
                k, batch * n, npos, nchunk, kmax, *strides, parents.stride(0),
                N=n, V=vocab, CHUNK=chunk, BLOCK_R=block_r, BLOCK_V=bv, BLOCK_N=block_n,
                BLOCK_C=triton.next_power_of_2(nchunk), FENCE=not triton_interpreting(), num_warps=NUM_WARPS,
            )

    final = torch.empty((batch,), **i32)
    lam = torch.empty((batch,), dtype=torch.float32, device=device)
    removed = torch.empty((batch, n), **i32)
    num_removed = torch.empty((batch,), **i32)
    node_f = torch.empty((3, batch, n), dtype=torch.float32, device=device)  # walk scratch (see walk_kernel)
    node_i = torch.empty((4, batch, n), **i32)
    block_r = min(triton.next_power_of_2(batch), WALK_ROWS_INTERPRETER if triton_interpreting() else WALK_ROWS)
    kernels.walk_kernel[(triton.cdiv(batch, block_r),)](
        target, draft, tokens, parents, p.temperature, p.min_p, p.seed, p.offset, *stats, mass, node_f, node_i,
        path, out, num_accepted, final, lam, removed, num_removed,
        batch, npos, *strides, tokens.stride(0), parents.stride(0),
        N=n, V=vocab, HAS_DRAFT_LOGITS=has_draft, BLOCK_R=block_r, BLOCK_N=block_n,
        num_warps=8 if block_r * block_n >= 1024 else NUM_WARPS,
    )

    block_r, bv = _tile(vocab, batch, block_v)
    chunk, nchunk = _split_vocab(vocab, triton.cdiv(batch, block_r), device, bv, num_chunks)
    f32 = dict(dtype=torch.float32, device=device)
    q_val, r_val = torch.empty((batch, nchunk), **f32), torch.empty((batch, nchunk), **f32)
    q_idx, r_idx, r_any = (torch.empty((batch, nchunk), **i32) for _ in range(3))
    kernels.emit_partial_kernel[(triton.cdiv(batch, block_r), nchunk)](
        target, draft, p.temperature, p.min_p, p.seed, p.offset, *stats,
        num_accepted, final, lam, removed, num_removed, q_val, q_idx, r_val, r_idx, r_any,
        batch, npos, nchunk, STREAM_TOKEN, *strides,
        N=n, V=vocab, CHUNK=chunk, HAS_DRAFT_LOGITS=has_draft, BLOCK_R=block_r, BLOCK_V=bv, num_warps=NUM_WARPS,
    )
    block_r = min(triton.next_power_of_2(batch), 4096 if triton_interpreting() else 64)
    kernels.emit_final_kernel[(triton.cdiv(batch, block_r),)](
        p.temperature, num_accepted, lam, q_val, q_idx, r_val, r_idx, r_any, out,
        batch, nchunk, N=n, BLOCK_R=block_r, BLOCK_C=triton.next_power_of_2(nchunk), num_warps=NUM_WARPS,
    )
    return out, path, num_accepted


def tree_verify_triton(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    params: SamplingTensors,
    *,
    block_v: int | None = None,
    num_chunks: int | None = None,
    max_children: int | None = None,
    workspace=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """target_logits [B, N, V], draft_logits [B, N, V] or None, tokens / parents [B, N] int32/int64
    -> tokens int32 [B, N], path int32 [B, N], num_accepted int32 [B]. Inputs are validated by
    kernels.tree_verify.tree_verify; block_v / num_chunks override the vocab split (tests).
    max_children: a bound on any node's children in any row (None: N - 1); sampled children cost
    one residual-mass launch per sibling after the first, up to the bound. workspace: a caller's
    KernelWorkspace (kernels/_workspace.py): no zero fills (three per call without)."""
    return run_launches(_launch, target_logits, draft_logits, tokens, parents, params, block_v, num_chunks,
                        max_children, workspace, workspace=workspace)
