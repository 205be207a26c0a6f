"""Compile the Triton verify kernels for an sm_90 (H100) target without a GPU: the CPU
interpreter never runs Triton's compiler, so this is what catches code that only the real
compiler rejects. Run as a script (TRITON_INTERPRET must be unset before triton is imported);
prints one line per kernel (with its registers and spills where Triton reports them, and a hash
of its PTX instructions) and exits non-zero on the first failure. The constexprs come from the
launch plan of real shapes; with penalties, the penalised variants (kernels/penalties/triton.py).

--grid: every kernel the launcher would run over a grid of shapes (K 1..8 x logits dtype x B x V x
draft logits x penalties x host modes, GRID_* below; each distinct compilation once), reporting
every failure instead of stopping at the first; --quick: a deterministic slice of that grid that
still has every K, dtype, B, V, draft / penalty / mode setting and the shapes that once failed
(tests/kernels/test_verify_triton_compiles.py); --jobs N: compile in N processes. Triton's
compiler has failed on some of these shapes and not on their neighbours
(kernels/verify/_triton_emit.py: the K = 1 ratio test), hence a grid rather than a few shapes."""
import argparse
import hashlib
import itertools
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90 import compile_sm90  # noqa: E402
from specdec_fast.kernels.verify import _triton_plan as plans  # noqa: E402
from specdec_fast.kernels.verify._triton_emit import emit_kernel, emit_penalised_kernel  # noqa: E402
from specdec_fast.kernels.verify._triton_select_finish import (select_finish_kernel,  # noqa: E402
                                                               select_finish_penalised_kernel)
from specdec_fast.kernels.verify._triton_select_rungs import (select_rungs_kernel,  # noqa: E402
                                                              select_rungs_penalised_kernel)
from specdec_fast.kernels.verify._triton_select_small import (select_small_vocab_kernel,  # noqa: E402
                                                              select_small_vocab_penalised_kernel)
from specdec_fast.kernels.verify._triton_select_stream import (select_stream_kernel,  # noqa: E402
                                                               select_stream_penalised_kernel)

POINTER_TYPES = {
    "tokens_ptr": "*i64", "amax_ptr": "*i32", "tkey_ptr": "*i64", "top_k_ptr": "*i32", "seed_ptr": "*i64",
    "offset_ptr": "*i64", "positions_ptr": "*i64", "q_idx_ptr": "*i32", "r_idx_ptr": "*i32", "r_any_ptr": "*i32",
    "num_accepted_ptr": "*i32", "out_ptr": "*i32", "part_i_ptr": "*i32", "fill_ptr": "*i32", "ticket_ptr": "*i32",
    "paths_ptr": "*i32", "rungs_ptr": "*fp32", "row_ticket_ptr": "*i32", "counts_ptr": "*i32", "pen_tokens_ptr": "*i64",
}
PENALISED = {select_stream_kernel: select_stream_penalised_kernel, select_finish_kernel: select_finish_penalised_kernel,
             select_small_vocab_kernel: select_small_vocab_penalised_kernel, emit_kernel: emit_penalised_kernel,
             select_rungs_kernel: select_rungs_penalised_kernel}


def ptx_hash(ptx: str) -> str:
    """Hash of the PTX instructions: without debug lines (.loc / .file, the debug sections), which
    name source files and lines and so move when code moves without changing what runs."""
    body = ptx.split(".section")[0]
    lines = [line for line in body.splitlines() if line.strip() and not re.match(r"\s*(\.loc|\.file|//|\$L__)", line)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def compile_kernel(fn, logits_type: str, constexprs: dict, num_warps: int, options: dict | None = None,
                   ints: dict | None = None):
    """fn compiled for sm_90. ints None: no argument marked aligned or divisible (what this script
    has always compiled); a dict of int arguments' values: every pointer marked 16-byte aligned and
    those ints that are multiples of 16 marked divisible, as the JIT specialises at run time
    (bench/verify_stream_ptx.py reads registers and loads of that code)."""
    types = {name: logits_type if name in ("target_ptr", "draft_ptr") else POINTER_TYPES.get(name, "*fp32")
             for name in fn.arg_names if name.endswith("_ptr")}
    return compile_sm90(fn, constexprs, types, num_warps=num_warps, options=options, specialise=ints)


def jobs(logits_type: str, batch: int, k: int, vocab: int, has_draft: bool, modes, penalties: bool = False):
    """The kernels the launcher runs for this shape and these host modes (kernel_sequence):
    (kernel, num_warps, constexprs, compile options)."""
    for fn, num_warps, constexprs in _jobs(logits_type, batch, k, vocab, has_draft, modes):
        if penalties:  # the drafts (W = K, P0 = 0), or sample's prefix of 3 (W = P0 = 3, K = 0)
            yield PENALISED[fn], num_warps, dict(constexprs, W=k or 3, P0=0 if k else 3), dict(enable_fp_fusion=False)
        else:
            yield fn, num_warps, constexprs, {}


def _jobs(logits_type: str, batch: int, k: int, vocab: int, has_draft: bool, modes):
    plan = plans.plan_launches(batch, k, vocab, has_draft, num_sms=132, interpreting=False, modes=modes)
    block_k = triton.next_power_of_2(max(k, 1))
    greedy = dict(GREEDY_TOKENS=plan.greedy_tokens, HAS_DRAFT_LOGITS=plan.has_draft,
                  BLOCK_K1=triton.next_power_of_2(k + 1), FENCE=True)
    if plan.large_vocab:
        sample = dict(CAP=plan.cap, SAMPLE=plan.sample, SAMPLE_RUN=plan.sample_run, SAMPLE_GROUP=plan.sample_group,
                      SAMPLE_SUB=plan.sample_sub)
        if plan.rungs_launch:
            yield select_rungs_kernel, plans.STREAM_NUM_WARPS, dict(V=vocab, K=k, BLOCK_K=block_k,
                                                                   **dict(sample, SAMPLE_SUB=plan.rungs_sub))
        yield select_stream_kernel, plans.STREAM_NUM_WARPS, dict(
            V=vocab, K=k, CHUNK=plan.select_chunk, BLOCK_V=plan.select_block_v, BLOCK_K=block_k,
            BLOCK_C=triton.next_power_of_2(plan.select_chunks), **sample,
            LANES=plan.stream_lanes, SELECTS=plan.selects, UNROLL=plan.stream_unroll, RUNGS_GIVEN=plan.rungs_launch,
            SUMS=plan.stream_sums, **greedy)
        if plan.finish:
            # CHUNK and BLOCK_C as kernels/verify/triton.py launches it (its own chunks: the streaming
            # launch's CHUNK until 2026-11-29, a kernel that never ran; same code, another trip count)
            yield select_finish_kernel, plans.FINISH_NUM_WARPS, dict(
                V=vocab, K=k, CHUNK=plan.finish_chunk, BLOCK_V=plan.finish_block_v, BLOCK_K=block_k,
                BLOCK_C=triton.next_power_of_2(max(plan.select_chunks, plan.finish_chunks)), CAP=plan.cap,
                BLOCK_S=plan.sweep_block, FENCE=True, SEARCH_TILE=plan.finish_search_tile)
    else:
        yield select_small_vocab_kernel, plans.SMALL_NUM_WARPS, dict(
            V=vocab, K=k, BLOCK_R=plan.select_block_r, BLOCK_VF=plan.select_block_v, BLOCK_K=block_k, **greedy)
    if plan.greedy_tokens:
        return
    yield emit_kernel, plans.EMIT_NUM_WARPS, dict(
        V=vocab, K=k, CHUNK=plan.emit_chunk, HAS_DRAFT_LOGITS=has_draft and k > 0, USE_POSITIONS=k == 0,
        BLOCK_R=plan.emit_block_r, BLOCK_V=plan.emit_block_v, BLOCK_K=block_k,
        BLOCK_K1=triton.next_power_of_2(k + 1), BLOCK_C=triton.next_power_of_2(plan.emit_chunks), FENCE=True,
        LANES=plan.emit_lanes, SKIP_IDENTITIES=plan.emit_skip_identities, EXP_KEYS=plan.emit_exp_keys)


# (logits dtype, B, K, V, draft logits, host modes, penalties): verify at B = 1 and 64, the draft
# sampler, a small vocabulary (modes unknown: every launch); the greedy variants (the selection
# writes the tokens; at B = 64 the argmax-only stream 4 blocks a step); the penalised kernels of the verify
# and the sampler.
SHAPES = (
    ("*bf16", 1, 4, 128256, True, None, False), ("*bf16", 64, 4, 128256, True, None, False),
    ("*fp32", 1, 0, 128256, False, None, False), ("*fp16", 8, 3, 1000, False, None, False),
    ("*bf16", 1, 4, 128256, True, frozenset({"greedy"}), False), ("*fp32", 1, 0, 128256, False, frozenset({"greedy"}), False),
    ("*bf16", 64, 4, 128256, True, frozenset({"greedy"}), False),
    ("*fp16", 8, 3, 1000, True, frozenset({"greedy"}), False),
    ("*bf16", 1, 4, 128256, True, None, True), ("*fp32", 1, 0, 128256, False, None, True),
    ("*fp16", 8, 3, 1000, True, None, True), ("*bf16", 1, 4, 128256, True, frozenset({"greedy"}), True),
)


GRID_TYPES = ("*fp16", "*bf16", "*fp32")
GRID_BATCHES = (1, 3, 8, 64)
GRID_VOCABS = (33, 1000, 32000, 128256)
GRID_KS = tuple(range(1, 9))
GRID_MODES = (None, frozenset({"greedy"}))
# Shapes whose emit_penalised_kernel Triton 3.6 once failed to compile for sm_90 (K = 1: "'arith.addi' op
# requires the same encoding for all operands and results" in TritonGPURemoveLayoutConversions), and one that
# an attempted workaround broke: always in the quick slice.
KNOWN_HARD = (("*fp16", 3, 1, 33, True, None, True), ("*fp32", 3, 1, 33, True, None, True),
              ("*fp16", 3, 1, 33, False, None, True), ("*bf16", 8, 1, 32000, True, None, True),
              ("*fp32", 1, 1, 128256, True, None, True))


# Variants beside the plans' kernels, V = 128256: (label, kernels, constexprs, shapes (logits dtype, B, K,
# draft logits, penalties)[, host modes (None: unknown)]).
VARIANTS = (
    # the emission's per-lane pass (the plans' choice where a program streams more than one block), plain and
    # penalised, and the draft sampler's (K = 0: no draft logits), where it has several steps per chunk
    ("lanes", (emit_kernel, emit_penalised_kernel), dict(LANES=True),
     (("*bf16", 64, 4, True, False), ("*bf16", 64, 4, True, True), ("*fp32", 64, 0, False, False))),
    # the emission without its identity skips (_triton_plan.EMIT_SKIP_IDENTITIES, on by default since an H200
    # timed it on 2026-11-28: bench_verify_latency.py's "emit_skip_identities" way flips it): the verify at
    # B = 1 and 64 (per-lane), plain
    ("no_skips", (emit_kernel,), dict(SKIP_IDENTITIES=False), (("*bf16", 1, 4, True, False), ("*bf16", 64, 4, True, False))),
    # the finishing kernels with the earlier threshold search (_triton_plan.FINISH_SEARCH_TILE = 0; 1024 by default
    # since 2026-11-28: bench_verify_latency.py's "search_tile" way), plain and penalised, and the sampler's; and
    # the fused search's 2048-value tile (timed, not chosen; still an override), plain
    ("search0", (select_finish_kernel, select_finish_penalised_kernel), dict(SEARCH_TILE=0),
     (("*bf16", 1, 4, True, False), ("*bf16", 1, 4, True, True), ("*fp32", 1, 0, False, False))),
    ("search2048", (select_finish_kernel,), dict(SEARCH_TILE=2048), (("*bf16", 1, 4, True, False),)),
    # the greedy streaming pass with its sums (_triton_plan.STREAM_GREEDY_ARGMAX_ONLY off; on, the pass without
    # them, since an H200 timed it on 2026-11-28: bench_stream_lanes.py's "lanes_argmax_only" / "block_argmax_only"
    # variants against "lanes" / "block_loop"): the verify at B = 1 (the block loop) and 64 (per lane), plain and
    # penalised, and the draft sampler's (K = 0), one block a step as that stream took; and the argmax-only stream
    # one block a step
    # (_triton_plan.STREAM_ARGMAX_UNROLL = 1; 4 where a lane takes two steps of 4 since an H200 timed it on
    # 2026-11-28: bench_stream_lanes.py's "lanes_argmax_only" against "lanes_argmax_only_unroll4"), the verify at B = 64
    ("sums", (select_stream_kernel, select_stream_penalised_kernel), dict(SUMS=True, UNROLL=1),
     (("*bf16", 1, 4, True, False), ("*bf16", 64, 4, False, False), ("*bf16", 64, 4, False, True),
      ("*fp32", 1, 0, False, False)),
     frozenset({"greedy"})),
    ("unroll1", (select_stream_kernel,), dict(UNROLL=1), (("*bf16", 64, 4, True, False),), frozenset({"greedy"})),
    # the finishing launch's second pass in blocks of 2048 (the streaming block, B = 64's before an H200 timed
    # 8192 faster there: _triton_plan.FINISH_GATHER_BLOCK_V, 2026-11-30) and 4096 values (bench_verify_latency's
    # "finish_gather_*" ways), B = 64 as its plan gives each (one chunk a row: 129024 values in 2048-value blocks,
    # 131072 in larger ones)
    ("gather2048", (select_finish_kernel,), dict(BLOCK_V=2048, CHUNK=129024), (("*bf16", 64, 4, True, False),)),
    ("gather4096", (select_finish_kernel,), dict(BLOCK_V=4096, CHUNK=131072), (("*bf16", 64, 4, True, False),)),
    # the draft sampler's emission with probability-weighted keys (_triton_plan.EMIT_SAMPLER_EXP_KEYS off: the
    # kernels before 2026-11-30), B = 1 (the block loop) and 64 (per lane)
    ("prob_keys", (emit_kernel,), dict(EXP_KEYS=False), (("*fp32", 1, 0, False, False), ("*bf16", 64, 0, False, False))),
)


def grid_shapes(quick=False):
    """(logits dtype, B, K, V, draft logits, host modes, penalties) of the grid; quick: one (dtype, B, V)
    per (K, draft, penalties, modes) cell, rotating so that each dtype, B and V still appears, plus
    KNOWN_HARD."""
    if quick == "known-hard":  # the reported shapes alone (CI's regression check)
        yield from KNOWN_HARD
        return
    if not quick:
        yield from ((t, b, k, v, d, m, p) for t, b, v, k, d, p, m in itertools.product(
            GRID_TYPES, GRID_BATCHES, GRID_VOCABS, GRID_KS, (True, False), (False, True), GRID_MODES))
        return
    yield from KNOWN_HARD
    for n, (k, d, p, m) in enumerate(itertools.product(GRID_KS, (True, False), (False, True), GRID_MODES)):
        yield (GRID_TYPES[n % 3], GRID_BATCHES[(n // 3) % 4], k, GRID_VOCABS[(n // 2 + k) % 4], d, m, p)


def _compile_job(job):
    name, logits_type, constexprs, num_warps, options = job
    fn = {kernel.__name__: kernel for kernel in (*PENALISED, *PENALISED.values())}[name]
    try:
        compile_kernel(fn, logits_type, constexprs, num_warps, options)
        return None
    except Exception as error:  # noqa: BLE001 - reported with its shape, the grid goes on
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"


def grid(quick: bool, workers: int, emit_lanes: bool = False) -> int:
    """Compile each distinct kernel of the grid once; print one line per failure and a summary.
    emit_lanes: the emission kernels alone, with the per-lane pass (_triton_emit.py LANES)."""
    todo = {}
    for shape in grid_shapes(quick):
        for fn, num_warps, constexprs, options in jobs(*shape):
            if emit_lanes:
                if fn not in (emit_kernel, emit_penalised_kernel):
                    continue
                constexprs = dict(constexprs, LANES=True)
            key = (fn.__name__, shape[0], num_warps, tuple(sorted(constexprs.items())))
            todo.setdefault(key, ((fn.__name__, shape[0], constexprs, num_warps, options), shape))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(_compile_job, [job for job, _ in todo.values()]))
    failures = 0
    for (key, (_, shape)), error in zip(todo.items(), results):
        if error is not None:
            failures += 1
            print(f"FAILED {key[0]} shape={shape}: {error}", flush=True)
    names = sorted({key[0] for key in todo})
    counts = ", ".join(f"{name} {sum(key[0] == name for key in todo)}" for name in names)
    print(f"grid: {len(todo)} kernels compiled, {failures} failed ({counts})", flush=True)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="store_true", help="compile the grid of shapes (GRID_*)")
    parser.add_argument("--quick", action="store_true", help="with --grid: the deterministic slice")
    parser.add_argument("--known-hard", action="store_true", help="with --grid: only KNOWN_HARD")
    parser.add_argument("--jobs", type=int, default=1, help="with --grid: compiling processes")
    parser.add_argument("--emit-lanes", action="store_true", help="with --grid: the emission kernels with LANES")
    args = parser.parse_args()
    if args.grid:
        return grid("known-hard" if args.known_hard else args.quick, args.jobs, args.emit_lanes)
    for logits_type, batch, k, vocab, has_draft, modes, penalties in SHAPES:
        for fn, num_warps, constexprs, options in jobs(logits_type, batch, k, vocab, has_draft, modes, penalties):
            kernel = compile_kernel(fn, logits_type, constexprs, num_warps, options)
            meta = getattr(kernel, "metadata", None)
            extra = f" shared={getattr(meta, 'shared', '?')}" if meta is not None else ""
            tag = "" if modes is None else f" modes={'+'.join(sorted(modes))}"
            print(f"compiled {fn.__name__} {logits_type} B={batch} K={k} V={vocab}{tag}{extra} "
                  f"ptx={ptx_hash(kernel.asm['ptx'])}", flush=True)
    for label, kernels, extra, shapes, *modes in VARIANTS:
        for logits_type, batch, k, has_draft, penalties in shapes:
            for fn, num_warps, constexprs, options in jobs(logits_type, batch, k, 128256, has_draft, *(modes or (None,)),
                                                           penalties):
                if fn in kernels:
                    kernel = compile_kernel(fn, logits_type, dict(constexprs, **extra), num_warps, options)
                    print(f"compiled {fn.__name__}+{label} {logits_type} B={batch} K={k} V=128256 "
                          f"ptx={ptx_hash(kernel.asm['ptx'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
