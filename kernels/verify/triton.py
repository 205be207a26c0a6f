"""Triton backend of chain_verify and sample: fused kernels, no host sync, CUDA-graph safe.

Four launches per call (_triton_kernels.py: 1-2, _triton_emit.py: 3-4), each boundary a
grid-wide dependency that one launch cannot express without inter-program atomics:
  1. partial_stats  grid (row tiles, NCHUNK): one pass over each vocab chunk of each (row,
                    distribution): online max / sum-exp / argmax partials.
  2. thresholds     grid (row tiles,): merge partials; top-k / top-p bisections and the
                    min-p normaliser, only in tiles where they are active.
  3. emit_partial   grid (row tiles, NCHUNK): ratio test (K vector steps), then one pass over
                    a vocab chunk of the emitted position: Gumbel-max candidates.
  4. emit_final     grid (row tiles,): merge candidates, write tokens.
NPOS = K+1 target positions (+ K draft positions when draft logits are given). Nothing of
size [B, K+1, V] is written: partials are [B*NPOS, NCHUNK] and [B, NCHUNK]. Merges read
partials in a fixed order (no atomics), so results are deterministic; tiles and chunks are
functions of the shapes only, so grids are too and the call is CUDA-graph capturable (no
host sync, no value-dependent Python branch). V, K and the chunk size are constexpr: one
compiled variant per (model vocabulary, K, batch bucket).
Cost of top-k / top-p: one program per tile of rows bisects over the whole row (up to 32
passes each over V, from L2); rows without them skip it. Everything else is 2 passes.
"""
import functools

import torch
import triton

from .._backend import triton_interpreting
from ..rng import STREAM_TOKEN
from ..sampling_params import SamplingTensors
from . import _triton_emit as emit
from . import _triton_kernels as stats

# Tile shapes (constexpr). Untuned placeholders until measured on a GPU: a [BLOCK_R, BLOCK_V]
# tile of at most TILE elements per vector step (2048 fp32 = 16 per thread at 4 warps), with
# BLOCK_V up to MAX_BLOCK_V so one row of a large vocabulary streams 4 KiB per step and small
# vocabularies pack several rows per tile. The CPU interpreter pays per operation, not per
# element, so it gets big tiles.
MAX_BLOCK_V = 1024
TILE = 2048
# Interpreter: whole rows of a 32k vocabulary in one tile (the single-tile path hoists the
# row out of the bisection loops); tests force the multi-block paths with block_v.
MAX_BLOCK_V_INTERPRETER = 32768
TILE_INTERPRETER = 131072
NUM_WARPS = 4
# Programs to aim for when splitting vocab rows into chunks: a few per SM on a GPU, so that
# B = 1 still spreads each row over many SMs. Under the interpreter programs run one after
# another and whole rows fit one tile, so rows stay whole unless a test asks for chunks.
PROGRAMS_PER_SM = 4
INTERPRETER_PROGRAMS = 4


@functools.lru_cache(maxsize=None)
def _target_programs(device: torch.device) -> int:
    if device.type == "cuda":
        return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_PROGRAMS


def _tile(vocab: int, rows: int, block_v: int | None) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_V) for rows of vocab entries."""
    interpreting = triton_interpreting()
    block_v = block_v or min(triton.next_power_of_2(vocab), MAX_BLOCK_V_INTERPRETER if interpreting else MAX_BLOCK_V)
    budget = TILE_INTERPRETER if interpreting else TILE
    return max(1, min(triton.next_power_of_2(rows), budget // block_v)), block_v


def _split_vocab(vocab: int, row_tiles: int, device, block_v: int, num_chunks: int | None) -> tuple[int, int]:
    """(chunk size, number of chunks) covering the vocab, enough programs in all to fill the
    device when rows are few; the chunk size is a multiple of block_v."""
    max_chunks = triton.cdiv(vocab, block_v)
    if num_chunks is None:
        num_chunks = triton.cdiv(_target_programs(device), row_tiles)
    num_chunks = max(1, min(num_chunks, max_chunks))
    chunk = triton.cdiv(triton.cdiv(vocab, num_chunks), block_v) * block_v
    return chunk, triton.cdiv(vocab, chunk)


def _vocab_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _run(*args):
    if not triton_interpreting():
        return _launch(*args)
    import numpy as np

    # The interpreter evaluates both sides of every select (e.g. exp overflow in lanes that
    # are then discarded) and numpy warns about them; the GPU path has no such warnings.
    with np.errstate(all="ignore"):
        return _launch(*args)


def _launch(target, draft, draft_tokens, params: SamplingTensors, positions, stream: int, block_v, num_chunks):
    """Launch the four kernels. target [B, K+1, V], draft [B, K, V] or None, draft_tokens [B, K],
    positions int64 [B] or None (None: noise at position j, the verify step)."""
    batch, k_plus_1, vocab = target.shape
    k = k_plus_1 - 1
    device = target.device
    tokens = torch.empty((batch, k_plus_1), dtype=torch.int32, device=device)
    num_accepted = torch.empty((batch,), dtype=torch.int32, device=device)
    if batch == 0:
        return tokens, num_accepted
    target = _vocab_contiguous(target)
    if k == 0:  # never read, but a [B, 0] tensor may have a null data pointer, which launchers reject
        draft_tokens = torch.empty((batch, 1), dtype=torch.int32, device=device)
    has_draft = draft is not None and k > 0
    draft = _vocab_contiguous(draft) if has_draft else target
    npos = 2 * k + 1 if has_draft else k + 1
    rows = batch * npos
    strides = (target.stride(0), target.stride(1), draft.stride(0), draft.stride(1))
    token_strides = (draft_tokens.stride(0), draft_tokens.stride(1)) if k else (0, 0)
    block_k = triton.next_power_of_2(max(k, 1))
    p = params
    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)

    # 1-2: statistics of every (row, position) distribution.
    block_r, bv = _tile(vocab, rows, block_v)
    chunk, nchunk = _split_vocab(vocab, triton.cdiv(rows, block_r), device, bv, num_chunks)
    part_m, part_s = torch.empty((rows, nchunk), **f32), torch.empty((rows, nchunk), **f32)
    part_arg = torch.empty((rows, nchunk), **i32)
    stats.partial_stats_kernel[(triton.cdiv(rows, block_r), nchunk)](
        target, draft, draft_tokens, p.temperature, part_m, part_s, part_arg,
        rows, npos, nchunk, *strides, *token_strides,
        V=vocab, K=k, CHUNK=chunk, BLOCK_R=block_r, BLOCK_V=bv, BLOCK_K=block_k, num_warps=NUM_WARPS,
    )
    m, s2, s3 = (torch.empty((rows,), **f32) for _ in range(3))
    tkey = torch.empty((rows,), dtype=torch.int64, device=device)
    amax = torch.empty((rows,), **i32)
    stats.thresholds_kernel[(triton.cdiv(rows, block_r),)](
        target, draft, draft_tokens, p.temperature, p.top_k, p.top_p, p.min_p,
        part_m, part_s, part_arg, m, s2, s3, tkey, amax,
        rows, npos, nchunk, *strides, *token_strides,
        V=vocab, K=k, BLOCK_R=block_r, BLOCK_V=bv, BLOCK_K=block_k,
        BLOCK_C=triton.next_power_of_2(nchunk), num_warps=NUM_WARPS,
    )

    # 3-4: ratio test and the emitted token of every row.
    block_r, bv = _tile(vocab, batch, block_v)
    chunk, nchunk = _split_vocab(vocab, triton.cdiv(batch, block_r), device, bv, num_chunks)
    q_val, r_val = torch.empty((batch, nchunk), **f32), torch.empty((batch, nchunk), **f32)
    q_idx, r_idx, r_any = (torch.empty((batch, nchunk), **i32) for _ in range(3))
    use_positions = positions is not None
    emit.emit_partial_kernel[(triton.cdiv(batch, block_r), nchunk)](
        target, draft, draft_tokens, p.temperature, p.min_p, p.seed, p.offset,
        positions if use_positions else p.offset,
        m, s2, s3, tkey, amax, q_val, q_idx, r_val, r_idx, r_any, num_accepted,
        batch, npos, nchunk, stream, *strides, *token_strides,
        V=vocab, K=k, CHUNK=chunk, HAS_DRAFT_LOGITS=has_draft, USE_POSITIONS=use_positions,
        BLOCK_R=block_r, BLOCK_V=bv, BLOCK_K=block_k, num_warps=NUM_WARPS,
    )
    block_r = min(triton.next_power_of_2(batch), 4096 if triton_interpreting() else 64)
    emit.emit_final_kernel[(triton.cdiv(batch, block_r),)](
        draft_tokens, q_val, q_idx, r_val, r_idx, r_any, num_accepted, tokens,
        batch, nchunk, *token_strides, tokens.stride(0),
        K=k, BLOCK_R=block_r, BLOCK_K=block_k, BLOCK_K1=triton.next_power_of_2(k_plus_1),
        BLOCK_C=triton.next_power_of_2(nchunk), num_warps=NUM_WARPS,
    )
    return tokens, num_accepted


def chain_verify_triton(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingTensors,
    *,
    block_v: int | None = None,
    num_chunks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """target_logits [B, K+1, V], draft_logits [B, K, V] or None, draft_tokens [B, K] int32/int64
    (-1 pads) -> tokens int32 [B, K+1], num_accepted int32 [B]. Inputs are validated by
    kernels.verify.chain_verify; block_v / num_chunks override the vocab split (tests, tuning)."""
    return _run(target_logits, draft_logits, draft_tokens, params, None, STREAM_TOKEN, block_v, num_chunks)


def sample_triton(
    logits: torch.Tensor,
    params: SamplingTensors,
    positions: torch.Tensor,
    stream: int,
    *,
    block_v: int | None = None,
    num_chunks: int | None = None,
) -> torch.Tensor:
    """logits [B, V], positions int64 [B] -> int32 [B]: one Gumbel-max draw per row from
    standardise(logits) with noise keyed by (seed, offset, position, stream)."""
    batch = logits.shape[0]
    no_drafts = torch.empty((batch, 0), dtype=torch.int32, device=logits.device)  # K = 0
    tokens, _ = _run(logits[:, None, :], None, no_drafts, params, positions, stream, block_v, num_chunks)
    return tokens[:, 0]
