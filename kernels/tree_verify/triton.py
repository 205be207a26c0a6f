"""Triton backend of tree_verify: no host sync, grids from static shapes (CUDA-graph capturable).

The launches and their grids are _triton_plan.py's (tree_plan; tree_verify_plan reports them):
the statistics of every node's rows (kernels/verify's selection launches, select_stats, with
K = N - 1 and no -1 among the dummy drafts, so every position is computed: _node_stats below is
the only code that knows their interface), with sampled children (some row sampling) the list of
each row's nodes with siblings and one residual-mass launch per sibling after the first over them,
the walk, and the emission (none when every row is greedy: the walk writes the final node's
argmax); with residual_fused the residual steps are one launch. Every ticket comes from the
selection's zero fill, or from the caller's KernelWorkspace (no fill).
N and V are constexpr: one compiled variant per (tree size, model vocabulary).
"""
import torch
import triton

from .._backend import triton_interpreting
from ..rng import STREAM_TOKEN
from ..sampling_params import SamplingTensors
from ..verify.triton import _num_sms, _vocab_contiguous, run_launches, select_stats
from . import _triton_kernels as kernels
from . import _triton_residual as residual
from ._triton_plan import FUSED_COOPERATIVE, FUSED_SPIN_LIMIT, FUSED_SYNC_WORDS, NUM_WARPS, TreePlan, tree_plan
from ._triton_walk import walk_parallel_kernel


def _node_stats(target, draft, params: SamplingTensors, plan: TreePlan, workspace=None):
    """(m, s2, s3, tkey, amax) [B * NPOS] of kernels/verify's statistics -- target position n at
    index b * NPOS + n, draft position n at b * NPOS + N + n (n <= N - 2; the last node has no
    children, so its draft row is never needed); draft None: target positions only -- and the
    tickets: zeros [residual tickets + emission tickets] from the same fill (or the workspace)."""
    batch, n, _ = target.shape
    width = max(n - 1, 1)  # no -1 among the dummy drafts: every position is computed
    dummy_drafts = (torch.zeros((batch, width), dtype=torch.int32, device=target.device) if workspace is None
                    else workspace.zeros(batch * width, target.device).view(batch, width))
    stats, _, tickets = select_stats(target, target if draft is None else draft, dummy_drafts, params, plan.stats,
                                     extra_counters=plan.residual_tickets + plan.emit_tickets, workspace=workspace)
    return stats, tickets


def _residual_masses(target, draft, parents, params: SamplingTensors, plan: TreePlan, stats, tickets, fence: bool):
    """mass [B * N, N] float32: mass[b * N + n, k] = W_k of node n of row b for k = 1 .. kmax - 1
    where n has more than k children and row b samples (the walk reads no other entry; the rest
    is left unwritten). stats: _node_stats's; tickets: plan.residual_tickets zeros (zeros again
    after the launches; with the fused launch the last of them counts programs that gave up at a
    barrier: zero unless the grid was not resident at once). Launches: residual_rows and one
    per k, or the fused one (plan.residual_fused)."""
    batch, n, vocab = target.shape
    device = target.device
    mass = torch.empty((batch * n, n), dtype=torch.float32, device=device)
    if not plan.residual_launches:
        return mass
    grid = plan.residual
    order = torch.empty((batch, n), dtype=torch.int32, device=device)
    count = torch.empty((plan.kmax, batch), dtype=torch.int32, device=device)
    lam_next = torch.empty((batch * n,), dtype=torch.float32, device=device)
    part = torch.empty((grid.parts(batch, n),), dtype=torch.float32, device=device)
    if grid.fused:
        tiles = grid.tiles(batch, n)
        residual.residual_masses_fused_kernel[grid.grid](
            parents, target, draft, order, count, params.temperature, params.min_p, *stats, mass, lam_next, part,
            tickets[:tiles], tickets[tiles:tiles + FUSED_SYNC_WORDS], batch, plan.kmax, plan.stats.npos, parents.stride(0),
            target.stride(0), target.stride(1), draft.stride(0), draft.stride(1),
            N=n, V=vocab, BLOCK_N=triton.next_power_of_2(n), BLOCK_K=triton.next_power_of_2(plan.kmax),
            BLOCK_S=grid.block_s, BLOCK_V=grid.block_v, BLOCK_B=grid.block_b, BLOCK_C=grid.block_c,
            FENCE=fence, SKIP_IDENTITIES=plan.skip_identities, SPIN_LIMIT=FUSED_SPIN_LIMIT, num_warps=NUM_WARPS,
            launch_cooperative_grid=FUSED_COOPERATIVE,
        )
        return mass
    residual.residual_rows_kernel[(batch,)](
        parents, params.temperature, order, count, batch, plan.kmax, parents.stride(0),
        N=n, BLOCK_N=triton.next_power_of_2(n), BLOCK_K=triton.next_power_of_2(plan.kmax), num_warps=NUM_WARPS,
    )
    for k in range(1, plan.kmax):  # W_k depends on W_{k-1}: one launch each
        residual.residual_mass_kernel[grid.grid](
            target, draft, order, count, params.temperature, params.min_p, *stats, mass, lam_next, part, tickets,
            k, batch, plan.stats.npos, target.stride(0), target.stride(1), draft.stride(0), draft.stride(1),
            N=n, V=vocab, BLOCK_S=grid.block_s, BLOCK_V=grid.block_v, BLOCK_B=grid.block_b, BLOCK_C=grid.block_c,
            FENCE=fence, SKIP_IDENTITIES=plan.skip_identities, num_warps=NUM_WARPS,
        )
    return mass


def _launch(target, draft, tokens, parents, params: SamplingTensors, block_v, num_chunks, max_children,
            workspace=None, walk_parallel=None, skip_identities=None, stream_sums=None, residual_fused=None,
            stats_chunks=None):
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
    interpreting = triton_interpreting()
    plan = tree_plan(batch, n, vocab, has_draft, modes=params.modes, max_children=max_children,
                     num_sms=_num_sms(device), interpreting=interpreting, block_v=block_v, num_chunks=num_chunks,
                     walk_parallel=walk_parallel, skip_identities=skip_identities, stream_sums=stream_sums,
                     residual_fused=residual_fused, stats_chunks=stats_chunks)
    stats, tickets = _node_stats(target, draft if has_draft else None, params, plan, workspace)
    residual_tickets, emit_tickets = tickets[:plan.residual_tickets], tickets[plan.residual_tickets:]
    npos = plan.stats.npos
    p = params
    strides = (target.stride(0), target.stride(1), draft.stride(0), draft.stride(1))
    block_n = triton.next_power_of_2(n)
    fence = not interpreting
    mass = _residual_masses(target, draft, parents, p, plan, stats, residual_tickets, fence)
    final = torch.empty((batch,), **i32)
    lam = torch.empty((batch,), dtype=torch.float32, device=device)
    removed = torch.empty((batch, n), **i32)
    num_removed = torch.empty((batch,), **i32)
    if plan.walk_parallel:
        walk_parallel_kernel[(batch,)](
            target, draft, tokens, parents, p.temperature, p.min_p, p.seed, p.offset, *stats, mass,
            path, out, num_accepted, final, lam, removed, num_removed,
            npos, plan.kmax, *strides, tokens.stride(0), parents.stride(0),
            N=n, V=vocab, HAS_DRAFT_LOGITS=has_draft, BLOCK_N=block_n, GREEDY_BONUS=not plan.emits,
            num_warps=plan.walk_warps,
        )
    else:
        node_f = torch.empty((3, batch, n), dtype=torch.float32, device=device)  # walk scratch (see walk_kernel)
        node_i = torch.empty((4, batch, n), **i32)
        kernels.walk_kernel[(triton.cdiv(batch, plan.walk_block_r),)](
            target, draft, tokens, parents, p.temperature, p.min_p, p.seed, p.offset, *stats, mass, node_f, node_i,
            path, out, num_accepted, final, lam, removed, num_removed,
            batch, npos, *strides, tokens.stride(0), parents.stride(0),
            N=n, V=vocab, HAS_DRAFT_LOGITS=has_draft, BLOCK_R=plan.walk_block_r, BLOCK_N=block_n,
            GREEDY_BONUS=not plan.emits, num_warps=plan.walk_warps,
        )
    if not plan.emits:  # every row greedy: the walk wrote the final node's argmax
        return out, path, num_accepted

    tiling = plan.emit
    f32 = dict(dtype=torch.float32, device=device)
    q_val, r_val = torch.empty((batch, tiling.nchunk), **f32), torch.empty((batch, tiling.nchunk), **f32)
    q_idx, r_idx, r_any = (torch.empty((batch, tiling.nchunk), **i32) for _ in range(3))
    kernels.emit_kernel[tiling.grid](
        target, draft, p.temperature, p.min_p, p.seed, p.offset, *stats,
        num_accepted, final, lam, removed, num_removed, q_val, q_idx, r_val, r_idx, r_any, emit_tickets, out,
        batch, npos, tiling.nchunk, STREAM_TOKEN, *strides,
        N=n, V=vocab, CHUNK=tiling.chunk, HAS_DRAFT_LOGITS=has_draft, BLOCK_R=tiling.block_r, BLOCK_V=tiling.block_v,
        BLOCK_C=triton.next_power_of_2(tiling.nchunk), FENCE=fence, num_warps=NUM_WARPS,
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
    walk_parallel: bool | None = None,
    skip_identities: bool | None = None,
    stream_sums: bool | None = None,
    residual_fused: bool | None = None,
    stats_chunks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """target_logits [B, N, V], draft_logits [B, N, V] or None, tokens / parents [B, N] int32/int64
    -> tokens int32 [B, N], path int32 [B, N], num_accepted int32 [B]. Inputs are validated by
    kernels.tree_verify.tree_verify; block_v / num_chunks override the vocab split (tests).
    max_children: a bound on any node's children in any row (None: N - 1); sampled children cost
    one residual-mass launch per sibling after the first, up to the bound. workspace: a caller's
    KernelWorkspace (kernels/_workspace.py): no zero fills (two per call without). walk_parallel:
    the walk's form (None: _triton_plan.WALK_PARALLEL; the same tokens either way).
    skip_identities: the residual launches skip the per-value identities of their nodes (None:
    _triton_plan.RESIDUAL_SKIP_IDENTITIES; the same tokens either way). stream_sums: False streams
    only the max and the argmax where every row is greedy (None: verify's
    _triton_plan.STREAM_GREEDY_ARGMAX_ONLY; the same tokens either way). residual_fused: the
    residual masses in one launch (None: _triton_plan.RESIDUAL_FUSED; the same tokens either way).
    stats_chunks: the statistics pass's vocab chunks a row (None: num_chunks, else verify's split;
    the same tokens either way)."""
    return run_launches(_launch, target_logits, draft_logits, tokens, parents, params, block_v, num_chunks,
                        max_children, workspace, walk_parallel, skip_identities, stream_sums, residual_fused,
                        stats_chunks, workspace=workspace)
