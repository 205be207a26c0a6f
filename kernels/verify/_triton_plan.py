"""Grid and tile sizes of the Triton verify step, as a plain-Python plan: the launcher in
triton.py sizes every launch from plan_launches(), and verify_plan() reports the same plan
(launches, passes over the logits, programs per row) for any shape without a GPU.

The plan depends on static shapes and on the sampling modes known on the host
(SamplingTensors.modes: fixed for a generate() call, so a CUDA graph captured for the call
stays valid): launches that cannot do work for those modes are left out (kernel_sequence).
"""
from dataclasses import dataclass

import triton

from ..sampling_params import MODES, TRUNCATIONS

# Candidate region per row and per kind (top set, gathered interval, swept): values beyond it
# are counted but not kept. 4096: the top set of a top-k <= 256 (~8 k values, room for the
# sample's error), and the intervals between rungs (~0.4 of the values above them) down to
# ~8k values; the finishing search over a [1, CAP] tile is ~17 reduction steps per threshold
# (8 warps: 16 values per thread, ~230 registers).
CAP = 4096
# Row sample that places the rungs: SAMPLE values in runs of SAMPLE_RUN neighbours; the
# maxima of groups of SAMPLE_GROUP are its candidate thresholds (_triton_sample.py).
SAMPLE = 1024
SAMPLE_RUN = 32
SAMPLE_GROUP = 16  # 64 candidate thresholds
SAMPLE_SUB = 32  # [64, 32] compares per step: 8 per thread at 8 warps
# Rungs placed once per row by their own launch (_triton_select_rungs.py) where a row has at least
# RUNGS_LAUNCH_MIN_CHUNKS streaming programs and the streaming grid is more than one wave of its
# selecting programs (STREAM_SELECT_PROGRAMS_PER_SM resident: 128 registers x 256 threads, 25%
# occupancy, Nsight Compute); else each streaming program places them itself. H200, K = 4,
# V = 128256, graph replays (bench/results/h200_2026-11-27c/verify_latency_nvidia_h200.json), with
# the launch against without: the B = 1 verify (567 programs) 72.4 / 87.0 us at top_k = 50, 98.2 /
# 112.0 at top_p = 0.9, 60.7 / 74.8 at min_p = 0.05; B = 8 162 / 207, 377 / 419, 162 / 206; B = 64
# (2 programs a row) 934 / 983 at top_k; the B = 8 and 64 samplers 4-43 us faster; but the B = 1
# sampler (one row, 63 programs: one wave, the rungs placed in parallel) 1.1-1.3 us slower.
RUNGS_LAUNCH_MIN_CHUNKS = 2
STREAM_SELECT_PROGRAMS_PER_SM = 2
# Sample values the rungs launch compares at a time ([64, RUNGS_SAMPLE_SUB] per step; the rungs are
# the same for any value: exact integer counts). Its one program a row took 9.1 us on an H200 at
# B = 1 (32 dependent steps of SAMPLE_SUB = 32, each loading its values). 256 (4 steps, 64 values a
# thread at 8 warps) was timed on an H200 at e4f1563 (bench/results/h200_2026-11-28, graph replays,
# K = 4, V = 128256, the reference's tokens) and was no faster: verify 1.01-1.05x the time of 32 in
# 10 of 12 rows (B = 1 top_k = 50 73.2 against 71.1 us), the sampler 0.99-1.04x. Kept at SAMPLE_SUB.
RUNGS_SAMPLE_SUB = SAMPLE_SUB
# Selection, large vocabularies: the streaming launch takes one row chunk per program,
# BLOCK_V values per step (4 KiB of bf16) at 8 warps (lean: 77-109 registers at sm_90, two or
# three programs per SM: it must keep occupancy); the finishing launch one row per program at
# 8 warps (its [CAP] tiles take 201-228 registers).
LARGE_BLOCK_V = 2048
STREAM_NUM_WARPS = 8
# Blocks per step of the per-lane streaming loop (_stream_chunk_lanes): UNROLL 16-byte loads per
# thread in flight. From sm_90a code compiled on the CPU (Triton 3.6's ptxas; python
# bench/verify_stream_ptx.py -> bench/results/verify_stream_ptx_sm90.json): the loop issues one
# ld.global.v4 per thread per step. With the top-k / top-p / min-p code compiled in, the kernel held
# 170-179 registers at B = 64: one program (8 warps) per SM, 4 KB in flight per SM, 22% of the
# roofline by Little's law at 0.8 us (the H100 measured 20%, greedy 246 us). Compiled out where no
# row uses them (LaunchPlan.selects): 57-62 registers, four programs, 16 KB, 90% by the same model;
# UNROLL 2: 64-78 registers, 24-32 KB. A model, not a measurement: 1 until a GPU run of
# bench/bench_stream_lanes.py (which times every variant side by side) shows 2 or 4 faster.
STREAM_UNROLL = 1
# Where every row is greedy (the chain's streaming launch writes the tokens, _triton_greedy.py;
# tree_verify's walk reads a greedy row's argmax alone: _triton_common.standardised), the stream
# keeps only the max and the argmax per lane: no exp, no running sum (select_stream's SUMS). The
# H200's Nsight Compute read of the B = 64 greedy streaming pass (bench/results/h200_2026-11-27b,
# 60 registers, four programs an SM): 53.7% of issue slots busy, the ALU pipe at 45.8%, 2.42
# instructions a cycle, DRAM at 36%: instruction-bound, not memory-bound. Compiled here for sm_90a
# (bench/verify_stream_ptx.py, B = 64, greedy, per-lane loop): 74 PTX lines a step of 8 values a
# thread (one 16-byte load) against 163, no ex2 against 8, 57 registers against 62 (four programs
# an SM either way). Predicted: the B = 64 greedy verify from ~95 us (H200) to the loads' own limit
# (16 KB in flight an SM: ~60% of the roofline by Little's law at 0.8 us), ~55-60 us; B = 1 (one
# block a program, latency-bound) about unchanged. The same argmax bit for bit (the same compares
# in the same order). Measured on an H200 at 3bf3b96 (bench/results/h200_2026-11-28b, K = 4, V = 128256,
# graph replays, bench_stream_lanes.py: each loop without its sums against the same loop with them, the
# reference's tokens): B = 64 greedy verify 78.0 against 96.1 us per lane (35% -> 44% of the roofline;
# predicted 55-60 us: a miss, the pass is not at the loads' limit yet), the block loop 79.1 / 104.4;
# B = 1 12.8 / 13.4 in the block loop (B = 1's; predicted unchanged: 0.6 us saved); the samplers
# 0.83-0.94x; tree_verify's greedy N = 64 B = 1 0.80x. On since then: with it on, tests/kernels and
# test_tree_gpu.py passed on CUDA (918; the PTX hash test aside, re-recorded) and the 144 `gpu` tests.
STREAM_GREEDY_ARGMAX_ONLY = True
# Blocks per step of the per-lane loop in the stream without its sums (STREAM_UNROLL for the others), taken where
# a lane streams at least STREAM_ARGMAX_MIN_STEPS steps of them (else halved until it does, or until it divides the
# lane's blocks). Compiled for sm_90a (bench/verify_stream_ptx.py, B = 64, greedy): 2 blocks a step 64 registers
# (four programs an SM, 32 KB of loads in flight), 4 blocks 79 (three programs, 48 KB), one block 57 (four, 16 KB).
# Measured on an H200 at 952d456 (bench/results/h200_2026-11-28c, bench_stream_lanes.py, K = 4, V = 128256, graph
# replays, the reference's tokens): the B = 64 verify (576 rows, 32 blocks a lane) 77.2 us with one block a step,
# 66.9 with 2, 62.0 with 4 (45% -> 56% of the roofline; predicted ~60); the B = 64 sampler (64 rows, 4 blocks a
# lane) 18.6 / 17.9 / 19.1: four blocks in a single step are slower (three programs an SM put its 1024 programs in
# three waves against two), hence the two steps. B = 1 takes the block loop (one block a program) and is
# unchanged; lanes forced at one block a lane: 13.0 / 13.2 / 13.2 (no step to unroll). Not measured: lanes of 8
# and 16 blocks (B = 16 / 32 verify), which take 4 blocks a step by this rule (two and four steps).
STREAM_ARGMAX_UNROLL = 4
STREAM_ARGMAX_MIN_STEPS = 2
# A block's time at 1 / 2 / 4 blocks a step, relative to one (the B = 64 verify above: 77.2 / 66.9 / 62.0 us over
# lanes of 32 blocks). Rounding a lane up to whole steps streams masked blocks too (V = 50257, B = 64: lanes of 13
# blocks would take 16 at 4 a step): the plan takes the blocks a step whose rounded lane costs least by these.
STREAM_ARGMAX_STEP_COST = {1: 1.0, 2: 0.866, 4: 0.80}
# The emission's pass keeps per-lane maxima (_triton_emit.py LANES) where a program streams more
# than one block, as the streaming pass does (plan_launches). H200 (bench/bench_stream_lanes.py,
# K = 4, V = 128256, graph replays, bench/results/h200_2026-11-27): B = 64 T = 1, 14 blocks a
# program: verify 257.3 against 275.1 us, sample 94.3 against 103.4; B = 1, one block a program:
# 29.0 / 17.7 against 28.5 / 18.2 (within the run's noise); the same tokens in every row.
FINISH_NUM_WARPS = 8
# The finishing search (_triton_select_finish.py _search_region): 0, largest_key_reaching over the
# [1, CAP] tile (4-way, three reductions a step); N > 0, largest_key_fused (one [WAYS, C] reduction
# a step, int32 keys and counts): 8-way over a [1, N] tile where the interval holds at most N values
# (the top set's mass pass too), else 4-way over [1, CAP]. From the H200's Nsight Compute reading (B = 1, top_k = 50,
# bench/results/h200_2026-11-27c): the finishing launch took 31.4 us, 62 k cycles, of which one
# program a row spends ~45 k alone after its row's other programs, at 11 cycles per issued
# instruction; its search step compiles (sm_90a, ptxas here) to 362 instructions a thread with 9
# barriers, 11-12 steps, over a top set of 96-952 values in a 4096-value tile (the interpreter's
# plan on the bench's logits). 1024 (4 values a thread; compiled: 221 instructions and 3 barriers a
# step for counts, ~8 steps) and 2048 (309; top-p intervals of up to 2048 values in it too) were
# timed against 0 on an H200 at e4f1563 (bench/results/h200_2026-11-28, graph replays, K = 4,
# V = 128256, B = 1 / 8 / 64 x T=1 / top_k=50 / top_p=0.9 / min_p=0.05, verify and sampler, the
# reference's tokens in every row): 1024, B = 1 top_k = 50 verify 59.8 against 71.1 us (sampler 43.4
# against 55.8), B = 8 157.5 / 161.6 (59.9 / 70.4), B = 64 834.4 / 875.8, top_p and min_p 0.96-0.99x,
# no row slower than 1.006x; 2048 faster for the B = 1 top_p sampler (58.3 against 61.9 us for 1024)
# and slower for the top_k rows (63.6 against 59.8): 1024 saved 116 us over the 24 timings, 2048
# 109. Predicted 31 -> ~20 us for the B = 1 top_k finishing launch; the verify lost 11 us.
FINISH_SEARCH_TILE = 1024
# The vocab block of the finishing launch's second pass (_triton_select_finish._chunk_pass: gather a
# row's interval, or min-p's chunk masses); None: the streaming launch's block (2048). A prepared
# candidate, off until a GPU times it (bench_verify_latency's "finish_gather_4096" / "_8192" ways).
# Why: the H200 measured B = 64 top_p = 0.9 at 2230 us against 791 for top_k = 50 (570 of its 576
# distributions on that pass, one program a row, 4.36 waves); compiled here for sm_90a
# (bench/verify_stream_ptx.py finish_rows) the program holds 215 registers at 8 warps (one an SM)
# and its gather loop one 16-byte load a thread, 7 bar.sync and 8 atomics a step of 2048 values:
# 4 KB in flight an SM, latency-bound. 4096: the same 213 registers, 2 loads and 9 bar.sync a step
# (twice the bytes in flight, 36% fewer barriers a value); 8192: 255 registers (no spills), 4 loads,
# 15 bar.sync. Predicted: the pass's time roughly halved at 4096 where latency bounds it.
# Timed on an H200 (2026-11-30, bench/results/h200_2026-11-30, ca9d900's kernels; CUDA graph replays, the
# reference's tokens in every row): at B = 64, 8192 took top_p = 0.9's verify from 2257.8 to 2162.5 us
# (0.958x; its sampler 1.004x) and left T=1 / top_k / min_p within 0.2-0.6% (1.002-1.006x on the samplers);
# 4096 gave 2191.8 (0.971x) there and 1.00-1.03x slower B = 1 rows (its 11 chunks a row against 13). The
# prediction missed: a 4% gain, not a halving -- the pass is not the loads' latency alone (its barriers and
# atomics a step remain). On where it was timed, at least FINISH_GATHER_MIN_BATCH rows of drafts (B = 1 / 8
# were not timed with 8192; their finishing chunks would change).
FINISH_GATHER_BLOCK_V = 8192
FINISH_GATHER_MIN_BATCH = 64
SWEEP_BLOCK = 2048  # fallback sweeps: one program streams a whole row
# Selection, small vocabularies (V <= CAP): whole rows in a [BLOCK_R, next_pow2(V)] tile.
SMALL_TILE = 4096
SMALL_NUM_WARPS = 8
# Emission: a [BLOCK_R, BLOCK_V] tile of at most TILE values per step (1024: 168 registers at
# B = 64 instead of 227 for 2048, three programs per SM; the Philox noise makes it compute-bound).
EMIT_MAX_BLOCK_V = 1024
# A batch of one row takes blocks of 256: its emission is 126 programs of one 1024-value block at
# V = 128256 (6% occupancy on an H200, Nsight Compute: one latency-bound chain a program), 501 of one
# 256-value block instead. H200 at e4f1563 (bench/results/h200_2026-11-28, K = 4, V = 128256, graph
# replays, the reference's tokens), with the identity skips below on both sides: B = 1 verify 22.3
# against 24.2 us at T = 1, 65.2 / 66.6 top_k = 50, 91.1 / 93.4 top_p = 0.9, 54.1 / 57.8 min_p = 0.05;
# the sampler 0.6-2.7% faster. Not at B = 8 (chunks of two blocks a program: T = 1 verify 56.8 against
# 53.6) nor B = 64 (1.05-1.51x slower). B = 2..7 were not timed (1024 there), nor other vocabularies
# (256 at B = 1 too: the same one block a program, fewer programs still at V = 32000: 32 of 1024).
EMIT_ONE_ROW_BLOCK_V = 256
EMIT_TILE = 1024
EMIT_NUM_WARPS = 4
# The emission skips, per program, the per-value work that is the identity for all its rows
# (_triton_common.py identity_skips: the division by T where every row has T = 1, min-p's test where
# none has min-p). Compiled here for sm_90a (no GPU), B = 64, K = 4, V = 128256: of the pass's 2443
# instructions a step (8 values a thread), the division 254 and min-p's test 292, 22%, at a
# compute-bound launch (Nsight Compute on the H200: 169 us of the B = 64 T = 1 verify's 255, 39%
# of issue slots busy, 272 lane-instructions a logit; bench/results/h200_2026-11-27b). Predicted:
# that emission ~15-20% faster; the B = 1 one a few us at most (latency-bound). The same tokens
# (identities on finite and -inf logits; tests/kernels/test_verify_emit_skips.py). Measured on an
# H200 at e4f1563 (bench/results/h200_2026-11-28, K = 4, V = 128256, graph replays): every one of the
# 24 rows faster, the reference's tokens: B = 64 T = 1 verify 235.6 against 255.0 us (the prediction's
# ~225), sampler 82.2 / 94.2; B = 8 T = 1 53.6 / 61.2; B = 1 T = 1 24.2 / 28.4 (more than predicted);
# the top-k / top-p / min-p rows 0.96-0.99x (their emission is a smaller part).
EMIT_SKIP_IDENTITIES = True
# The draft sampler's (K = 0) Gumbel-max keys in ratio form weigh each value's noise by exp(std - m), the
# probability before its division by the row's sum (argmax(prob / E) = argmax(exp(std - m) / E): the sum is a
# row constant), where the verify's weigh it by the probability that its residual needs anyway. Why: an H200
# (2026-11-30, bench/results/h200_2026-11-30, ca9d900) timed the sampler 1.03 / 1.08 / 1.13x slower at B = 1 /
# 8 / 64 T=1 than at 952d456 (15.6 / 22.0 / 75.2 us against 15.2 / 20.3 / 66.5; top-k / top-p / min-p 1.00-1.06x)
# while the verify got faster or stayed (B = 64 T=1 201.7 against 216.0): the ratio form (5ed9a3c) put an IEEE
# division a value (the probability) into the sampler's keys, which the log form had left to the residual's
# branch. Compiled for sm_90a here (tests/kernels/_compile_verify_kernels.py's constexprs), the B = 64 sampler's
# per-lane emission holds 104 registers (4 programs of 4 warps an SM) against 96 (5) at 952d456 and 96 with
# exp keys, its loop 1031 PTX lines against 1285 at 952d456 and 1030. Predicted: the sampler back to 952d456's
# times or below (B = 64 ~66 us, B = 8 ~20); the verify unchanged (exp keys there: the same 168 registers and
# 21 more PTX lines a step, so not taken). Not yet timed (bench_verify_latency's "emit_prob_keys" way flips it).
EMIT_SAMPLER_EXP_KEYS = True
# Programs to aim for per launch: a few per SM, so that B = 1 spreads each row over tens of
# SMs (132 SMs on an H100: 63 programs per row for the 9 distributions of K = 4 with drafts).
SELECT_PROGRAMS_PER_SM = 8
EMIT_PROGRAMS_PER_SM = 4
# The finishing launch holds one program per SM (its registers); it splits rows only as far as
# that fills the device (B = 1: 13-15 chunks gather a row's interval; B = 64: one program a row).
FINISH_PROGRAMS_PER_SM = 1
# The CPU interpreter pays per operation, not per element, and runs programs one after
# another: big tiles, few programs (tests force small ones through the overrides).
INTERPRETER = dict(large_block_v=32768, sweep_block=32768, small_tile=131072, emit_max_block_v=32768,
                   emit_one_row_block_v=32768, emit_tile=131072, programs=4, sample=SAMPLE, sample_sub=SAMPLE, rungs_sub=SAMPLE)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the launcher needs; rows = B * NPOS distributions."""

    batch: int
    k: int
    vocab: int
    has_draft: bool
    npos: int
    rows: int
    large_vocab: bool
    cap: int
    sample: int
    sample_run: int
    sample_group: int
    sample_sub: int
    # selection (large: streaming grid (rows, select_chunks), then finishing grid (rows,);
    # small: grid (cdiv(rows, select_block_r),))
    select_block_r: int
    select_block_v: int
    select_chunk: int
    select_chunks: int
    sweep_block: int
    finish_chunk: int
    finish_chunks: int
    # emission launch: grid (cdiv(batch, emit_block_r), emit_chunks)
    emit_block_r: int
    emit_block_v: int
    emit_chunk: int
    emit_chunks: int
    # from the host-known modes: the finishing launch runs (large vocabularies; some row may use
    # top-k / top-p / min-p), and the selection launch writes the tokens (every row greedy, and
    # the caller emits: chain_verify / sample; no emission launch then)
    finish: bool = True
    greedy_tokens: bool = False
    # the streaming launch keeps per-lane statistics for rows without rungs (_stream_chunk_lanes)
    stream_lanes: bool = True
    # the penalised variants of the same kernels (kernels/penalties/triton.py: same grids, plus
    # one int32 count read per logit)
    penalties: bool = False
    # blocks per step of the per-lane streaming loop (STREAM_UNROLL; select_chunk is a multiple)
    stream_unroll: int = 1
    # the streaming kernel is compiled with the top-k / top-p / min-p code (SELECTS): where some
    # row may use them (= finish), unless forced on for a comparison (the code it compiles out
    # held 170-179 registers at B = 64 against 57-62 without: verify_stream_ptx_sm90.json)
    selects: bool = True
    # the emission's pass with per-lane maxima (_triton_emit.py LANES)
    emit_lanes: bool = False
    # the rungs are placed by their own launch before the streaming one (grid (rows,),
    # _triton_select_rungs.py), not by every streaming program (RUNGS_LAUNCH_MIN_CHUNKS), comparing
    # rungs_sub sample values at a time (RUNGS_SAMPLE_SUB)
    rungs_launch: bool = False
    rungs_sub: int = SAMPLE_SUB
    # the finishing launch's threshold search (FINISH_SEARCH_TILE): 0, or the small tile of the fused search
    finish_search_tile: int = 0
    # the emission skips the per-value identities of its rows (EMIT_SKIP_IDENTITIES)
    emit_skip_identities: bool = False
    # the streaming pass keeps its sums (False: the argmax alone, every row greedy;
    # STREAM_GREEDY_ARGMAX_ONLY)
    stream_sums: bool = True
    # the finishing launch's vocab block on its second pass (FINISH_GATHER_BLOCK_V; finish_chunk is a
    # multiple); 0: select_block_v
    finish_block_v: int = 0
    # the emission's Gumbel-max keys weigh the noise by exp(std - m), not the probability (EMIT_SAMPLER_EXP_KEYS)
    emit_exp_keys: bool = False

    @property
    def select_grid(self) -> tuple:
        """Streaming launch (large vocabularies; the finishing launch is (rows,)), or the whole
        selection (small vocabularies)."""
        if self.large_vocab:
            return (self.rows, self.select_chunks)
        return (triton.cdiv(self.rows, self.select_block_r),)

    @property
    def finish_grid(self) -> tuple:
        return (self.rows, self.finish_chunks)

    @property
    def emit_grid(self) -> tuple:
        return (triton.cdiv(self.batch, self.emit_block_r), self.emit_chunks)


def _split(vocab: int, row_programs: int, target_programs: int, block_v: int, num_chunks: int | None) -> tuple[int, int]:
    """(chunk, number of chunks): chunks are multiples of block_v, enough of them that
    row_programs * chunks reaches target_programs when rows are few."""
    max_chunks = triton.cdiv(vocab, block_v)
    if num_chunks is None:
        num_chunks = triton.cdiv(target_programs, row_programs)
    num_chunks = max(1, min(num_chunks, max_chunks))
    chunk = triton.cdiv(triton.cdiv(vocab, num_chunks), block_v) * block_v
    return chunk, triton.cdiv(vocab, chunk)


def _finish_block(finish_block_v: int | None, select_block_v: int, interpreting: bool, batch: int) -> int:
    """The finishing launch's block on its second pass: finish_block_v (a power of 2 >= 16), else
    FINISH_GATHER_BLOCK_V on a GPU at batch >= FINISH_GATHER_MIN_BATCH, else the streaming block (the
    interpreter's large tiles)."""
    if finish_block_v is not None:
        if isinstance(finish_block_v, bool) or not isinstance(finish_block_v, int) or finish_block_v < 16 \
                or finish_block_v & (finish_block_v - 1):
            raise ValueError(f"finish_block_v must be a power of 2 >= 16, got {finish_block_v!r}")
        return finish_block_v
    if FINISH_GATHER_BLOCK_V and not interpreting and batch >= FINISH_GATHER_MIN_BATCH:
        return FINISH_GATHER_BLOCK_V
    return select_block_v


# plan_launches' overrides of its own choices (each None: the plan's), which the launchers
# (triton.py: chain_verify_triton / sample_triton) take as keywords: tests force small splits and
# paths with them, the benchmarks their side-by-side ways.
PLAN_OVERRIDES = ("block_v", "num_chunks", "cap", "stream_lanes", "stream_unroll", "selects", "emit_lanes",
                  "rungs_launch", "rungs_sub", "emit_block_v", "finish_search_tile", "emit_skip_identities", "emit_exp_keys",
                  "stream_sums", "finish_block_v")


def plan_launches(batch: int, k: int, vocab: int, has_draft: bool, *, num_sms: int, interpreting: bool,
                  modes: frozenset | None = None, emits: bool = True, block_v: int | None = None,
                  num_chunks: int | None = None, cap: int | None = None,
                  stream_lanes: bool | None = None, penalties: bool = False,
                  stream_unroll: int | None = None, selects: bool | None = None,
                  emit_lanes: bool | None = None, rungs_launch: bool | None = None,
                  rungs_sub: int | None = None, emit_block_v: int | None = None,
                  finish_search_tile: int | None = None, emit_skip_identities: bool | None = None,
                  stream_sums: bool | None = None, finish_block_v: int | None = None,
                  emit_exp_keys: bool | None = None) -> LaunchPlan:
    """The launch plan for target logits [batch, k+1, vocab] (draft logits [batch, k, vocab]
    when has_draft). modes: the sampling modes rows may use (a subset of sampling_params.MODES,
    known on the host), None when unknown (every launch). emits: the caller emits tokens
    (chain_verify / sample); False for statistics only (tree_verify emits on its own).
    block_v / num_chunks / cap override the vocab split and the candidate region (tests force
    the multi-chunk and candidate paths on small inputs with them). stream_lanes: the streaming
    loop of rows without rungs, per-lane statistics (True) or block reductions per step (False);
    None: per-lane where a program streams more than one block. penalties: the penalised kernels
    (same grids and launches). stream_unroll: blocks per step of the per-lane loop (None:
    STREAM_UNROLL, or for the stream without its sums STREAM_ARGMAX_UNROLL lowered until a lane
    takes STREAM_ARGMAX_MIN_STEPS steps and, unless num_chunks is given, to the one whose chunk rounded
    up to whole steps costs least by STREAM_ARGMAX_STEP_COST, the chunk then rounded), lowered to the
    largest power of 2 that divides a chunk's blocks. selects: True compiles the streaming kernel with its top-k / top-p / min-p code even where no row uses
    them (the earlier kernel, for side-by-side timing); None: exactly where some row may.
    emit_lanes: the emission's per-lane pass (None: where an emission program streams more than
    one block). rungs_launch: the rungs placed by their own launch (None: where the streaming
    kernel has the selection code, a row has at least RUNGS_LAUNCH_MIN_CHUNKS programs and the
    grid is more than one wave of them; ignored without that code); rungs_sub: the sample values
    that launch compares at a time (None: RUNGS_SAMPLE_SUB; a power of 2 up to the sample);
    emit_block_v: the emission's vocab block alone (None: block_v, else the default:
    EMIT_ONE_ROW_BLOCK_V for a batch of one row, EMIT_MAX_BLOCK_V otherwise; smaller blocks give a
    small batch more emission programs). finish_search_tile: the finishing
    launch's search (None: FINISH_SEARCH_TILE; 0 the earlier search, else the fused search and its
    small tile: raised to a power of 2, at most the candidate cap; below 256, threads of the
    8-warp program hold no value). emit_skip_identities: the emission skips the division by T and
    min-p's test where they are identities for all of a program's rows (None:
    EMIT_SKIP_IDENTITIES). finish_block_v: the finishing launch's vocab block on its second pass
    (None: FINISH_GATHER_BLOCK_V on a GPU at batch >= FINISH_GATHER_MIN_BATCH, else the streaming block; the finishing chunks are
    multiples of it). stream_sums: the streaming pass's sum-exp (None: kept unless every row
    is greedy and STREAM_GREEDY_ARGMAX_ONLY; False is taken only where every row is greedy, whose
    tokens need the argmax alone: the chain's greedy tokens, tree_verify's greedy walk, which
    standardises greedy rows by their argmax). emit_exp_keys: the emission's Gumbel-max keys weigh
    the noise by exp(std - m) instead of the probability (None: EMIT_SAMPLER_EXP_KEYS for the draft
    sampler, K = 0; the verify keeps the probability its residual needs). stream_lanes measured on an H100 (112bf69,
    bench/results/h100_2026-11-23/stream_lanes_112bf69.json, K = 4): per-lane 1.26-1.44x faster
    at B = 64 (V = 128256), 1.1x at B = 8; with one block per program (sample at B = 8: chunks of
    one block) it was 1.2-1.3x slower (not profiled; it spends a second exp per value there), at
    B = 1 equal."""
    cfg = INTERPRETER if interpreting else dict(large_block_v=LARGE_BLOCK_V, sweep_block=SWEEP_BLOCK,
                                                small_tile=SMALL_TILE, emit_max_block_v=EMIT_MAX_BLOCK_V,
                                                emit_one_row_block_v=EMIT_ONE_ROW_BLOCK_V,
                                                emit_tile=EMIT_TILE, programs=None, sample=SAMPLE,
                                                sample_sub=SAMPLE_SUB, rungs_sub=RUNGS_SAMPLE_SUB)
    npos = 2 * k + 1 if has_draft and k > 0 else k + 1
    rows = batch * npos
    cap = cap or CAP
    large = vocab > cap
    sample = min(cfg["sample"], triton.next_power_of_2(vocab))
    select_programs = cfg["programs"] or SELECT_PROGRAMS_PER_SM * num_sms
    finish_programs = cfg["programs"] or FINISH_PROGRAMS_PER_SM * num_sms
    emit_programs = cfg["programs"] or EMIT_PROGRAMS_PER_SM * num_sms
    if large:
        s_block_v = block_v or min(triton.next_power_of_2(vocab), cfg["large_block_v"])
        s_block_r = 1
        s_chunk, s_chunks = _split(vocab, rows, select_programs, s_block_v, num_chunks)
        f_block_v = _finish_block(finish_block_v, s_block_v, interpreting, batch)
        f_chunk, f_chunks = _split(vocab, rows, finish_programs, f_block_v, num_chunks)
    else:
        s_block_v = triton.next_power_of_2(vocab)
        s_block_r = max(1, min(triton.next_power_of_2(max(rows, 1)), cfg["small_tile"] // s_block_v))
        s_chunk, s_chunks = vocab, 1
        f_chunk, f_chunks, f_block_v = vocab, 1, s_block_v
    e_block_v = emit_block_v or block_v or min(triton.next_power_of_2(vocab),
                                               cfg["emit_one_row_block_v" if batch == 1 else "emit_max_block_v"])
    e_block_r = max(1, min(triton.next_power_of_2(max(batch, 1)), cfg["emit_tile"] // e_block_v))
    e_chunk, e_chunks = _split(vocab, triton.cdiv(max(batch, 1), e_block_r), emit_programs, e_block_v, num_chunks)
    # Without top-k / top-p / min-p the streaming launch finishes every row (their last programs).
    finish = large and (modes is None or bool(modes & TRUNCATIONS))
    # Greedy rows emit their argmax (_triton_greedy.py): the selection launch writes the tokens.
    greedy_tokens = emits and modes == {"greedy"}
    if stream_lanes is None:
        stream_lanes = large and s_chunk > s_block_v
    if emit_lanes is None:
        emit_lanes = e_chunk > e_block_v
    selects = finish or bool(selects)
    sums = not (modes == {"greedy"} and large and not selects
                and (STREAM_GREEDY_ARGMAX_ONLY if stream_sums is None else not stream_sums))
    unroll = (triton.next_power_of_2(max(1, stream_unroll or (STREAM_UNROLL if sums else STREAM_ARGMAX_UNROLL)))
              if stream_lanes else 1)
    if stream_unroll is None and not sums:
        # the argmax-only stream's own unroll: at most what lets a lane take STREAM_ARGMAX_MIN_STEPS steps; where the
        # number of lanes is not pinned, the one whose lane rounded up to whole steps costs least
        # (STREAM_ARGMAX_STEP_COST), the lanes then rounded (fewer, longer lanes: B = 128's one lane of 63 blocks
        # takes 64)
        while unroll > 1 and s_chunk < STREAM_ARGMAX_MIN_STEPS * unroll * s_block_v:
            unroll //= 2
        if num_chunks is None:
            blocks = s_chunk // s_block_v
            unroll = min((u for u in STREAM_ARGMAX_STEP_COST if u <= unroll),
                         key=lambda u: (triton.cdiv(blocks, u) * u * STREAM_ARGMAX_STEP_COST[u], u))
            s_chunk = triton.cdiv(s_chunk, unroll * s_block_v) * unroll * s_block_v
            s_chunks = triton.cdiv(vocab, s_chunk)
    while unroll > 1 and s_chunk % (s_block_v * unroll):
        unroll //= 2
    if rungs_launch is None:
        rungs_launch = s_chunks >= RUNGS_LAUNCH_MIN_CHUNKS and rows * s_chunks > STREAM_SELECT_PROGRAMS_PER_SM * num_sms
    rungs_launch = bool(rungs_launch) and large and selects
    rungs_sub = min(triton.next_power_of_2(rungs_sub or cfg["rungs_sub"]), sample)
    search_tile = FINISH_SEARCH_TILE if finish_search_tile is None else finish_search_tile
    if search_tile:
        search_tile = min(triton.next_power_of_2(search_tile), cap)
    return LaunchPlan(batch, k, vocab, has_draft and k > 0, npos, rows, large, cap, sample, min(SAMPLE_RUN, sample),
                      min(SAMPLE_GROUP, sample), min(cfg["sample_sub"], sample),
                      s_block_r, s_block_v, s_chunk, s_chunks, min(triton.next_power_of_2(vocab), cfg["sweep_block"]),
                      f_chunk, f_chunks, e_block_r, e_block_v, e_chunk, e_chunks, finish, greedy_tokens, stream_lanes,
                      penalties, unroll, selects, bool(emit_lanes), rungs_launch, rungs_sub, search_tile,
                      EMIT_SKIP_IDENTITIES if emit_skip_identities is None else bool(emit_skip_identities), sums,
                      f_block_v, EMIT_SAMPLER_EXP_KEYS and k == 0 if emit_exp_keys is None else bool(emit_exp_keys))


# verify_plan's mode names: sampling_params.MODES ("T=1" is accepted for "plain": any T > 0
# without top-k / top-p / min-p, the name of earlier reports).
MODE_ALIASES = {"T=1": "plain"}


def host_modes(modes) -> frozenset | None:
    """modes as plan_launches takes them: None (unknown) or a frozenset of MODES (aliases resolved)."""
    if modes is None:
        return None
    named = frozenset(MODE_ALIASES.get(m, m) for m in ((modes,) if isinstance(modes, str) else modes))
    unknown = named - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; choose from {MODES} (or None: unknown)")
    return named


def select_sequence(plan: LaunchPlan) -> list[str]:
    """The selection launches of a plan (select_stats), in order, without fills or the emission."""
    if plan.large_vocab:
        rungs = ["select_rungs"] if plan.rungs_launch else []
        return rungs + (["select_stream", "select_finish"] if plan.finish else ["select_stream"])
    return ["select_small_vocab"]


def kernel_sequence(plan: LaunchPlan, workspace: bool = False) -> list[str]:
    """The graph nodes of one call, in order (what triton._launch launches for this plan; with
    penalties, each kernel's penalised variant: "<name>_penalised"); workspace: the caller's
    KernelWorkspace (the engine's calls), which leaves out the zero fill."""
    kernels = select_sequence(plan) + ([] if plan.greedy_tokens else ["emit"])
    fill = [] if workspace else ["zero fill: counters"]
    return fill + [name + "_penalised" if plan.penalties else name for name in kernels]


def verify_plan(batch: int, k: int, vocab: int, has_draft: bool = True, modes=("plain",), num_sms: int = 132,
                penalties: bool = False, workspace: bool = False) -> dict:
    """The GPU plan of chain_verify_triton (k >= 1) or sample_triton (k = 0) for this shape and
    these sampling modes (the modes some row uses, as SamplingTensors.modes: a subset of
    sampling_params.MODES; None = unknown, every launch), from the same code that sizes the
    grids and picks the launches (plan_launches, kernel_sequence).

    passes_over_logits counts reads of all the logits (HBM-sized at large batch): the streaming
    pass reads every distribution once; the emission reads the emitted position's target (and
    draft) row. Reads that stay small are listed apart: the row sample of selecting rows (SAMPLE
    values read twice, from L2, by every streaming program of a row, or once by the rungs launch
    where the plan has it), the finishing reads (at most 3 CAP gathered values per
    distribution), the K + 1 ratio-test gathers. The exact fallback (one
    program sweeping its row when the sampled bounds miss) is a worst case per missed threshold,
    not counted: 1 + ~log2(values in the interval / CAP) passes over that row.

    penalties (some row uses one): the same launches and grids, each kernel's penalised variant,
    which reads the int32 count of every logit it reads (kernels/penalties/triton.py).
    count_reads_per_row: reads of a batch row's [V] count row per call (one per distribution
    streamed, one per emitted row): 4 V bytes each, from HBM at most once per call when L2 keeps
    the row for its 2K + 1 distributions (B = 1), up to count_reads_per_row x 4 V bytes when it
    does not (B = 64 at V = 128256: 33 MB of counts beside 148 MB of bf16 logits per pass).

    workspace: the call passes a KernelWorkspace (the engine's calls, through prepared_impls): its
    counters stay zero between calls, so no zero fill is launched; False (a plain call): a zero
    fill first."""
    modes = host_modes(modes)
    plan = plan_launches(batch, k, vocab, has_draft, num_sms=num_sms, interpreting=False, modes=modes,
                         penalties=penalties)
    selects = modes is None or bool(TRUNCATIONS & modes)
    # target (and draft) row of the emitted position; none when the selection writes the tokens
    emitted_rows = 0 if plan.greedy_tokens else 2 if plan.has_draft else 1
    kernels = kernel_sequence(plan, workspace)
    programs = {} if plan.greedy_tokens else {"emit": plan.emit_chunks / plan.emit_block_r}
    if plan.large_vocab:
        programs.update(select_stream=plan.select_chunks)
        if plan.rungs_launch:
            programs.update(select_rungs=1)
        if plan.finish:
            programs.update(select_finish=plan.finish_chunks)
    else:
        programs.update(select_small_vocab=1 / plan.select_block_r)
    sample_placements = 1 if plan.rungs_launch else plan.select_chunks  # programs a row that place its rungs
    sample_reads = 2 * plan.sample * sample_placements / vocab if (selects and plan.large_vocab) else 0.0
    return {
        "launches": len(kernels),
        "kernels": kernels,
        "passes_over_logits": 1.0 + emitted_rows / plan.npos,
        "count_reads_per_row": plan.npos + emitted_rows if penalties else 0,
        "selection_passes": 1.0,
        "emission_passes": emitted_rows / plan.npos,
        "sample_reads_per_row_from_l2": sample_reads,
        "finish_reads_per_row": 3 * plan.cap if (selects and plan.large_vocab) else 0,
        "programs_per_row": programs,
        "max_programs_per_row": max(programs.values()),
        "grids": {"select": plan.select_grid, "finish": plan.finish_grid if plan.large_vocab and plan.finish else None,
                  "emit": None if plan.greedy_tokens else plan.emit_grid},
        "large_vocab_path": plan.large_vocab,
        # the streaming kernel: compiled with the top-k / top-p / min-p code (170-179 registers at
        # B = 64 on sm_90a, 57-62 without: bench/results/verify_stream_ptx_sm90.json), and blocks
        # per step of its per-lane loop
        "stream_select_code": plan.selects if plan.large_vocab else None,
        "stream_unroll": plan.stream_unroll if plan.large_vocab else None,
        # the rungs placed once per row by their own launch (_triton_select_rungs.py)
        "rungs_launch": plan.rungs_launch,
        # the emission's pass keeps per-lane maxima (None: no emission launch)
        "emit_lanes": None if plan.greedy_tokens else plan.emit_lanes,
        "candidate_cap": plan.cap if plan.large_vocab else None,
        "distributions": plan.rows,
        "second_pass": ("over the rows whose top-p (without a top-k <= CAP / 16), top-k > CAP / 16 or "
                        "min-p (alone) threshold lies below the gathered top set: +1 pass over those rows, "
                        f"{plan.finish_chunks} programs per row, blocks of {plan.finish_block_v} values")
        if (selects and plan.large_vocab) else None,
        "fallback_passes_per_missed_threshold": "1 + ~log2(values in the interval / CAP), one program"
        if (selects and plan.large_vocab) else None,
    }
