"""Launch 1a of the verify step for large vocabularies (the plan's rungs_launch): each selecting
distribution's rungs (_triton_sample.py) placed ONCE, by one program, before the streaming
launch reads them (_triton_select_stream.py RUNGS_GIVEN).

Without this launch every streaming program of a row places the same rungs from the same
sample: SAMPLE x SAMPLE / SAMPLE_GROUP compares (65 k at 1024 / 16) per program, against a chunk
of 2048 values per program at B = 1. On an H200 (Nsight Compute, B = 1, K = 4, V = 128256,
bench/results/h200_2026-11-27c) the streaming launch took 34.2 us with top_k = 50 and 41.6 us
with top_p = 0.9 against 7.5 us at T = 1, executing about 7x the instructions: the sample's
compares, 63 times per row. The same rungs (same data, same code) in one program per row cost
one extra launch (9.1 us at B = 1 there); with it the streaming launch took 11.8 / 19.7 us and
the verify 72.4 / 98.2 us against 87.0 / 112.0 (bench/bench_verify_latency.py). The plan uses it
where a row has several streaming programs and they are more than a wave
(_triton_plan.RUNGS_LAUNCH_MIN_CHUNKS, STREAM_SELECT_PROGRAMS_PER_SM).

grid (R,), R = B * NPOS distributions: rows that gather (top-k / top-p / min-p on, read) write
their rungs fp32 [8] to rungs_ptr [R, 8]; the others write nothing (nothing reads them).
"""
import triton
import triton.language as tl

from ..penalties.triton import row_penalty
from ._triton_common import num_drafts_of_row, position_of, row_source, sampling_modes
from ._triton_sample import sample_rungs
from ._triton_select_stream import candidate_plan, small_top_k


@triton.jit
def select_rungs_kernel(
    target_ptr, draft_ptr, tokens_ptr,  # logits [B, K+1, V], [B, K, V] (target again when absent); drafts int [B, K]
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # [B]: fp32, int32, fp32, fp32
    rungs_ptr,  # fp32 [R, 8]
    NPOS, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
    V: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr,
    SAMPLE_RUN: tl.constexpr, SAMPLE_GROUP: tl.constexpr, SAMPLE_SUB: tl.constexpr,
):
    """grid (R,): see the module docstring. No penalties."""
    _select_rungs(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rungs_ptr, NPOS,
                  st_b, st_k, sd_b, sd_k, sx_b, sx_k, (tokens_ptr,), False, V, K, BLOCK_K, CAP, SAMPLE, SAMPLE_RUN,
                  SAMPLE_GROUP, SAMPLE_SUB)


@triton.jit
def select_rungs_penalised_kernel(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rungs_ptr,
    NPOS, st_b, st_k, sd_b, sd_k, sx_b, sx_k,
    counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb, s_pk,  # penalties
    V: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr,
    SAMPLE_RUN: tl.constexpr, SAMPLE_GROUP: tl.constexpr, SAMPLE_SUB: tl.constexpr,
    W: tl.constexpr, P0: tl.constexpr,
):
    """select_rungs_kernel with penalties (the arguments of
    _triton_select_stream.select_stream_penalised_kernel): the sample reads penalised logits, as
    the streaming pass does."""
    _select_rungs(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rungs_ptr, NPOS,
                  st_b, st_k, sd_b, sd_k, sx_b, sx_k,
                  (W, P0, counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb, s_pk),
                  True, V, K, BLOCK_K, CAP, SAMPLE, SAMPLE_RUN, SAMPLE_GROUP, SAMPLE_SUB)


@triton.jit
def _select_rungs(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rungs_ptr, NPOS,
                  st_b, st_k, sd_b, sd_k, sx_b, sx_k, pen_args, PENALTY: tl.constexpr, V: tl.constexpr,
                  K: tl.constexpr, BLOCK_K: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr,
                  SAMPLE_RUN: tl.constexpr, SAMPLE_GROUP: tl.constexpr, SAMPLE_SUB: tl.constexpr):
    """Program r: the streaming program's rung placement (_triton_select_stream._select_stream,
    the same inputs and calls), stored once."""
    r = tl.program_id(0)
    b = r // NPOS
    kb = num_drafts_of_row(tokens_ptr, b, sx_b, sx_k, K, BLOCK_K)
    t_off, d_off, t_lim, d_lim = row_source(r, NPOS, kb, st_b, st_k, sd_b, sd_k, V, K)
    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    min_p = tl.load(min_p_ptr + b)
    topk_on, topp_on, minp_on = sampling_modes(t, top_k, tl.load(top_p_ptr + b), min_p, t_lim + d_lim > 0, V)
    gather, _ = candidate_plan(topk_on, topp_on, minp_on, top_k, CAP)
    if gather:
        pen = pen_args
        if PENALTY:
            pen = row_penalty(pen_args, b, position_of(r, NPOS, K))
        rungs = sample_rungs(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, tl.where(t > 0, t, 1.0), pen,
                             PENALTY, top_k, min_p, minp_on, small_top_k(topk_on, top_k, CAP), V, CAP, SAMPLE, SAMPLE_RUN,
                             SAMPLE_GROUP, SAMPLE_SUB)
        tl.store(rungs_ptr + r * 8 + tl.arange(0, 8), rungs)
