"""The launches and grids of tree_verify's Triton backend as a plain-Python plan: the launcher
(triton.py) sizes and picks every launch from tree_plan(), and tree_verify_plan() reports the same
plan for any shape without a GPU (as kernels/verify/_triton_plan.py does for chains).

Launches, in order (each boundary a grid-wide dependency):
  select    the standardisation statistics of every node's target and draft row: verify's
            selection launches with K = N - 1 and no emission of their own (the streaming pass,
            + the finish when some row may use top-k / top-p / min-p)
  residual  sampled children (draft logits) when some row may sample: the nodes ordered by their
            number of children (residual_rows, one program per row), then the residual masses
            W_k of the sibling tests, one launch per k = 1 .. kmax - 1 (W_k depends on W_{k-1}),
            each over the nodes with more than k children only (_triton_residual.py); with
            residual_fused (RESIDUAL_FUSED) all of it in one launch, a grid barrier between steps
  walk      the greedy longest path and the rejection walk (a scan over the nodes, or, with
            walk_parallel, every node's test at once: _triton_walk.py); when every row is greedy
            it also writes the emitted token (the final node's argmax) and nothing follows
  emit      the emitted token's Gumbel-max over vocab chunks, merged by each row tile's last program
Without a caller's KernelWorkspace two zero fills come first: the counters (the selection's and
the residual and emission tickets, one fill) and the dummy drafts.
The modes are SamplingTensors.modes (known on the host, fixed for a generate() call, so a graph
captured for the call stays valid); None: unknown, every launch.
"""
from dataclasses import dataclass

import triton

from ..verify._triton_plan import LaunchPlan, host_modes, plan_launches, select_sequence

# Row tiles of the walk: [BLOCK_R, BLOCK_N] int32 tiles in registers (64 x 64 fp32/int32 = 16
# per thread at 8 warps); the interpreter pays per operation, so it takes whole batches.
WALK_ROWS = 16
WALK_ROWS_INTERPRETER = 4096
# The emission: [BLOCK_R, BLOCK_V] tiles of at most TILE values, rows split into vocab chunks so
# that a few programs per SM work at B = 1 (the interpreter: whole rows, few programs). The
# residual masses: PROGRAMS_PER_SM programs per SM over [BLOCK_V] blocks of the nodes that have
# siblings to test (ResidualGrid).
MAX_BLOCK_V, TILE, PROGRAMS_PER_SM = 1024, 2048, 4
MAX_BLOCK_V_INTERPRETER, TILE_INTERPRETER, INTERPRETER_PROGRAMS = 32768, 131072, 4
MAX_TENSOR = 1 << 20  # triton's TRITON_MAX_TENSOR_NUMEL
NUM_WARPS = 4
# The walk as every node's test at once and a chase down the accepted path (_triton_walk.py, one
# row per program, depth steps) instead of the scan (one dependent step per node: N - 1 at B = 1,
# each waiting on a load). The same tokens bit for bit. On an H200 (bench/bench_tree.py
# --kernels-only, B = 1, N = 64, V = 128256, graph replays): tree_verify 40.3 against 47.2 us
# greedy, 539.4 against 541.2 at T = 1; its tests passed there. Compiled kernels only: the
# interpreter keeps the scan (whole batches in one program; the parallel form's one row per
# program and [N, N] tiles made the tree tests run for over 20 minutes on the CPU instead of ~5).
WALK_PARALLEL = True
# The residual-mass launches skip per value what is the identity for all of an item's nodes (the
# division by T = 1, min-p's test without min-p; _triton_residual.py SKIP_IDENTITIES, as the chain
# emission's _triton_plan.EMIT_SKIP_IDENTITIES). Their per-value work is two standardised rows (q and
# p) of four IEEE divisions each, three of them identities at T = 1 without min-p; the launches
# took 234 of the 403 us of tree_verify at B = 8, N = 64, T = 1 on an H200 (bench/results/
# h200_2026-11-27b), per-value work at 15% occupancy. bench_tree.py --kernels-only times the tree
# with it flipped (tree_verify_us_skip_identities_flipped). H200 at e4f1563 (bench/results/
# h200_2026-11-28, graph replays): B = 1, N = 64, T = 1, V = 128256 tree_verify 82.6 against 95.1 us,
# the same tokens (the B = 8 rows were not timed).
RESIDUAL_SKIP_IDENTITIES = True
# The residual masses in one launch (_triton_residual.py residual_masses_fused_kernel: the rows'
# order and every k's masses, a grid barrier between them) instead of residual_rows + one launch
# per k. Why: on an H200 at 952d456 (bench/results/h200_2026-11-28c, B = 1, N = 64, T = 1, V =
# 128256, the default tree: kmax = 6) the 5 mass launches took 31.8 us and residual_rows 2.1 of the
# tree's 69.6 us of device time (82.4 us a replay: 9 launches), each mass launch ~6.4 us whatever
# its nodes (8, 4, 3, 2, 1): a launch's ramp and a chain of dependent loads, not bytes. Predicted
# (not measured: no GPU since): ~3-4 us a k inside one launch, tree_verify ~82 -> ~60 us. Timed on
# an H200 (2026-11-30, bench/results/h200_2026-11-30, ca9d900; bench_tree.py --kernels-only's
# tree_verify_us_residual_fused_flipped): 94.1 us against 86.4 with the launches, the same tokens:
# slower, so off. The prediction missed; not profiled (the grid barriers' spins against the 5
# launches' ramps is the next question, for `bash bench/run_gpu.sh ncu`).
# FUSED_PROGRAMS_PER_SM programs of NUM_WARPS warps per SM are resident at once whatever the
# kernel's registers (a thread holds at most 255: 2 x 128 threads x 255 <= 65536 registers an SM
# on sm_70 and later), which the barrier needs; FUSED_BLOCK_V keeps each program's chunk at ~2
# blocks at B = 1 with half the programs of the launches. The interpreter runs one program (its
# programs run one after another: a second would wait forever at the first barrier).
RESIDUAL_FUSED = False
FUSED_PROGRAMS_PER_SM, FUSED_BLOCK_V = 2, 2048
# The fused launch is cooperative (Triton's launch_cooperative_grid: cuLaunchKernelEx with
# CU_LAUNCH_ATTRIBUTE_COOPERATIVE, which CUDA documents as valid for launches and graph nodes): the
# driver refuses a grid whose programs cannot all be resident at once (e.g. an MPS client limited
# to fewer SMs) with an error, where a plain launch would reach the spin limit below and count its
# programs as given up. The interpreter ignores the option. Not yet run on a GPU (eager or
# captured: test_tree_residual's gpu tests).
FUSED_COOPERATIVE = True
# The fused launch's sync words after the tiles' tickets: barrier arrivals, exit ticket, failure count
FUSED_SYNC_WORDS = 3
# grid_barrier's bound on the polls of one program at one barrier (each an L2 round trip, ~0.5-1
# us: 65536 take tens of ms, far above a k's work even at B = 64, N = 64, V = 128256, ~0.1 ms a
# program): a guard against a grid that is not resident, never reached otherwise; a program that
# gives up counts itself in the last sync word (kernels/_triton_sync.py, _triton_residual.py)
FUSED_SPIN_LIMIT = 1 << 16


def walk_parallel_warps(block_n: int) -> int:
    """Warps of the parallel walk's program: its [BLOCK_N, BLOCK_N] tiles at ~8 values per thread.
    sm_90a (Triton's ptxas, N = 64): 4 warps held 255 registers (the top-b form spilling 1.9 KB),
    8 warps 126 (top-b: 255, 36 B spilled), 16 warps 86 (top-b: 128, 32 B)."""
    return max(1, min(16, block_n * block_n // 256))


@dataclass(frozen=True)
class VocabTiling:
    """[block_r, block_v] tiles over rows split into nchunk vocab chunks of chunk values:
    grid (tiles, nchunk)."""
    block_r: int
    block_v: int
    tiles: int
    chunk: int
    nchunk: int

    @property
    def grid(self) -> tuple[int, int]:
        return self.tiles, self.nchunk


@dataclass(frozen=True)
class ResidualGrid:
    """residual_mass_kernel's launches: programs (a 1-D grid) shared by the nodes with siblings to
    test, in tiles of block_s nodes over [block_v] vocab blocks; block_b: the rows' counts read at
    once; block_c: the chunk parts a tile's last program adds at once. fused: one
    residual_masses_fused_kernel launch instead (programs all resident at once)."""
    programs: int
    block_s: int
    block_v: int
    block_b: int
    block_c: int
    fused: bool = False

    @property
    def grid(self) -> tuple[int]:
        return (self.programs,)

    def tiles(self, batch: int, n: int) -> int:
        """The most tiles a launch may have (every (row, node) pair a slot): its tickets."""
        return triton.cdiv(batch * n, self.block_s)

    def parts(self, batch: int, n: int) -> int:
        """Scratch floats for one launch's parts: block_s per item, items = T * max(1, P // T) <=
        max(P, T) for T tiles."""
        return max(self.programs, self.tiles(batch, n)) * self.block_s


def _block_v(vocab: int, block_v: int | None, interpreting: bool) -> int:
    """The vocab block of the residual and emission kernels: block_v (tests) or the whole
    vocabulary up to MAX_BLOCK_V (the interpreter: MAX_BLOCK_V_INTERPRETER)."""
    return block_v or min(triton.next_power_of_2(vocab), MAX_BLOCK_V_INTERPRETER if interpreting else MAX_BLOCK_V)


def _residual_grid(batch: int, n: int, vocab: int, block_v: int | None, num_chunks: int | None, num_sms: int,
                   interpreting: bool, fused: bool = False) -> ResidualGrid:
    """PROGRAMS_PER_SM programs per SM, one node per tile: whatever the number of nodes with
    siblings, their vocabularies are split over all the programs. The interpreter:
    INTERPRETER_PROGRAMS programs over tiles of TILE_INTERPRETER values (it pays per operation:
    one node per tile made the 4000-row statistical tests take 3 minutes each).
    num_chunks (tests): num_chunks * batch programs, about num_chunks chunks per node when each
    row has one node with siblings. fused: FUSED_PROGRAMS_PER_SM programs per SM over
    FUSED_BLOCK_V blocks (num_chunks within that bound), one program under the interpreter."""
    if fused:
        block_v = block_v or (None if interpreting else min(FUSED_BLOCK_V, triton.next_power_of_2(vocab)))
    block_v = _block_v(vocab, block_v, interpreting)
    block_b = triton.next_power_of_2(batch)
    # a tile's slots find their rows in a [block_s, block_b] comparison: within Triton's largest tensor
    block_s = max(1, min(TILE_INTERPRETER // block_v, MAX_TENSOR // block_b)) if interpreting else 1
    block_s = min(block_s, triton.next_power_of_2(batch * n))
    if num_chunks is not None:
        programs = max(1, num_chunks * batch)
    else:
        programs = INTERPRETER_PROGRAMS if interpreting else PROGRAMS_PER_SM * num_sms
    if fused:  # every program resident at once (the barrier waits for all of them)
        programs = 1 if interpreting else min(programs, FUSED_PROGRAMS_PER_SM * num_sms)
    return ResidualGrid(programs, block_s, block_v, block_b, min(triton.next_power_of_2(programs), 512), fused)


@dataclass(frozen=True)
class TreePlan:
    stats: LaunchPlan  # verify's selection plan over the N target and N - 1 draft rows
    kmax: int  # the most children a node may have (max_children, or N - 1)
    residual_launches: int  # one per sibling after the first: 0 without sampled children
    residual: ResidualGrid | None  # the residual masses' programs (and residual_rows before them)
    walk_block_r: int  # rows per walk program (1 for the parallel walk)
    walk_warps: int
    walk_parallel: bool  # _triton_walk.py's walk_parallel_kernel instead of the scan
    emits: bool  # False: every row greedy, the walk writes the emitted token
    emit: VocabTiling | None  # over the B rows' final nodes
    batch: int
    n: int
    skip_identities: bool = False  # the residual launches' SKIP_IDENTITIES (RESIDUAL_SKIP_IDENTITIES)

    @property
    def residual_fused(self) -> bool:
        return bool(self.residual_launches) and self.residual.fused

    @property
    def residual_tickets(self) -> int:
        """The tiles' tickets (shared by every k), and with the fused launch its three sync words
        after them (residual_masses_fused_kernel's sync)."""
        if not self.residual_launches:
            return 0
        return self.residual.tiles(self.batch, self.n) + (FUSED_SYNC_WORDS if self.residual.fused else 0)

    @property
    def emit_tickets(self) -> int:
        return self.emit.tiles if self.emits else 0


def _tiling(rows: int, vocab: int, block_v: int | None, num_chunks: int | None, num_sms: int,
            interpreting: bool) -> VocabTiling:
    """[BLOCK_R, BLOCK_V] tiles over rows of vocab entries, the vocab split so that a few
    programs per SM work (chunks are multiples of block_v)."""
    block_v = _block_v(vocab, block_v, interpreting)
    budget = TILE_INTERPRETER if interpreting else TILE
    block_r = max(1, min(triton.next_power_of_2(rows), budget // block_v))
    tiles = triton.cdiv(rows, block_r)
    if num_chunks is None:
        programs = INTERPRETER_PROGRAMS if interpreting else PROGRAMS_PER_SM * num_sms
        num_chunks = triton.cdiv(programs, tiles)
    num_chunks = max(1, min(num_chunks, triton.cdiv(vocab, block_v)))
    chunk = triton.cdiv(triton.cdiv(vocab, num_chunks), block_v) * block_v
    return VocabTiling(block_r, block_v, tiles, chunk, triton.cdiv(vocab, chunk))


def tree_plan(batch: int, n: int, vocab: int, has_draft: bool, *, modes: frozenset | None, max_children: int | None,
              num_sms: int, interpreting: bool, block_v: int | None = None,
              num_chunks: int | None = None, walk_parallel: bool | None = None,
              skip_identities: bool | None = None, stream_sums: bool | None = None,
              residual_fused: bool | None = None, stats_chunks: int | None = None) -> TreePlan:
    """The plan for target logits [batch, n, vocab] (draft logits [batch, n, vocab] when
    has_draft; n > 1 for them to count). block_v / num_chunks override the vocab splits (tests);
    walk_parallel: the walk's form (None: WALK_PARALLEL on compiled kernels, the scan under the
    interpreter); skip_identities: the residual launches' identity skips (None:
    RESIDUAL_SKIP_IDENTITIES); stream_sums: the statistics' streaming sums where every row is greedy
    (None: verify's STREAM_GREEDY_ARGMAX_ONLY; the walk reads a greedy row's argmax alone);
    residual_fused: the residual masses in one launch (None: RESIDUAL_FUSED); stats_chunks: the
    statistics' vocab chunks a row (None: num_chunks, else verify's split; bench_tree.py sweeps it: on an H200,
    2026-11-30, B = 1 N = 64, 4 chunks took the sampled tree 80.3 us against the split's 9 chunks' 86.4 and the
    greedy one 31.0 against its 8's 30.3 -- one shape, no rule written from it)."""
    k = n - 1
    has_draft = has_draft and k > 0
    stats = plan_launches(batch, k, vocab, has_draft, num_sms=num_sms, interpreting=interpreting, modes=modes,
                          emits=False, block_v=block_v, num_chunks=num_chunks if stats_chunks is None else stats_chunks,
                          stream_sums=stream_sums)
    kmax = k if max_children is None else min(max_children, k)
    may_sample = modes is None or bool(modes - {"greedy"})
    residual_launches = kmax - 1 if has_draft and kmax > 1 and may_sample else 0
    fused = RESIDUAL_FUSED if residual_fused is None else bool(residual_fused)
    residual = (_residual_grid(batch, n, vocab, block_v, num_chunks, num_sms, interpreting, fused)
                if residual_launches else None)
    walk_parallel = (WALK_PARALLEL and not interpreting) if walk_parallel is None else bool(walk_parallel)
    if walk_parallel:
        walk_block_r, walk_warps = 1, walk_parallel_warps(triton.next_power_of_2(n))
    else:
        walk_block_r = min(triton.next_power_of_2(batch), WALK_ROWS_INTERPRETER if interpreting else WALK_ROWS)
        walk_warps = 8 if walk_block_r * triton.next_power_of_2(n) >= 1024 else NUM_WARPS
    emits = modes != {"greedy"}
    emit = _tiling(batch, vocab, block_v, num_chunks, num_sms, interpreting) if emits else None
    skip_identities = RESIDUAL_SKIP_IDENTITIES if skip_identities is None else bool(skip_identities)
    return TreePlan(stats, kmax, residual_launches, residual, walk_block_r, walk_warps, walk_parallel, emits, emit,
                    batch, n, skip_identities)


def tree_kernel_sequence(plan: TreePlan, workspace: bool = False) -> list[str]:
    """The graph nodes of one tree_verify_triton call, in order; workspace: the caller's
    KernelWorkspace (the engine's tree loop), which leaves out the two zero fills."""
    fills = [] if workspace else ["zero fill: counters", "zero fill: dummy drafts"]
    walk = "walk_parallel" if plan.walk_parallel else "walk"
    if plan.residual_fused:
        residual = ["residual_masses_fused"]
    else:
        residual = ["residual_rows"] + ["residual_mass"] * plan.residual_launches if plan.residual_launches else []
    return fills + select_sequence(plan.stats) + residual + [walk] + (["emit"] if plan.emits else [])


def tree_verify_plan(batch: int, n: int, vocab: int, has_draft: bool = True, modes=("plain",),
                     max_children: int | None = None, num_sms: int = 132, workspace: bool = False,
                     walk_parallel: bool | None = None, residual_fused: bool | None = None) -> dict:
    """The GPU plan of tree_verify_triton for this shape, these sampling modes (as verify_plan:
    a subset of sampling_params.MODES, "T=1" for "plain"; None = unknown) and this bound on a
    node's children: launches in order and the grids, from the code the launcher sizes them with.
    passes_over_logits: reads of all B x N x V target (and draft) logits: the statistics read
    every row once; residual launch k reads the rows of the nodes with more than k children, at
    most (N - 1) // (k + 1) of a tree's N nodes (each has k + 1 of the N - 1 children or more:
    counted as a bound); the emission reads one node's rows per tree."""
    modes = host_modes(modes)
    plan = tree_plan(batch, n, vocab, has_draft, modes=modes, max_children=max_children, num_sms=num_sms,
                     interpreting=False, walk_parallel=walk_parallel, residual_fused=residual_fused)
    kernels = tree_kernel_sequence(plan, workspace)
    return {
        "launches": len(kernels),
        "kernels": kernels,
        "passes_over_logits_at_most": (1.0 + sum((n - 1) // (k + 1) for k in range(1, plan.residual_launches + 1)) / n
                                       + (1 / n if plan.emits else 0.0)),
        "grids": {"select": plan.stats.select_grid,
                  "finish": plan.stats.finish_grid if plan.stats.large_vocab and plan.stats.finish else None,
                  "residual_rows": (batch,) if plan.residual_launches and not plan.residual_fused else None,
                  "residual_mass": plan.residual.grid if plan.residual_launches and not plan.residual_fused else None,
                  "residual_masses_fused": plan.residual.grid if plan.residual_fused else None,
                  ("walk_parallel" if plan.walk_parallel else "walk"): (triton.cdiv(batch, plan.walk_block_r),),
                  "emit": plan.emit.grid if plan.emits else None},
        "residual_launches": plan.residual_launches,
    }
