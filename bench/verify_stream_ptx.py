"""The verify's streaming kernel as an H100 would run it, read on a machine without a GPU: compiled
for sm_90a by Triton's own compiler with the specialisation the JIT gives at run time (pointers
16-byte aligned, the 8B shape's strides multiples of 16), then Triton's bundled ptxas -v for
registers and spills, and the PTX of the streaming loop for its loads per step.

Per (B, host modes, variant) it records: registers, spills, the streaming loop's global loads per
step (and their width), ex2 per step, programs per SM that the registers allow (8 warps each),
and the bytes in flight per SM that follows (programs x 256 threads x loads x 16 B). The last
column is a MODEL, not a measurement: Little's law, bandwidth = bytes in flight x SMs / latency,
at an assumed 0.8 us DRAM latency and the H100's 132 SMs, capped by its 3.0 TB/s copy roofline;
it predicts, and a GPU run of bench/bench_stream_lanes.py decides.

    python bench/verify_stream_ptx.py [--out bench/results/verify_stream_ptx_sm90.json]
Run without TRITON_INTERPRET (it compiles; nothing runs on a device). Not a test.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import triton  # noqa: E402

from machine import versions  # noqa: E402
from specdec_fast.kernels.verify import _triton_plan as plans  # noqa: E402
from specdec_fast.kernels.verify._triton_select_stream import select_stream_kernel  # noqa: E402
from tests.kernels._compile_verify_kernels import compile_kernel, jobs as compile_jobs  # noqa: E402

K, V = 4, 128256
SMS, REGISTERS_PER_SM, MAX_WARPS_PER_SM = 132, 65536, 64
LATENCY_S, ROOFLINE_BYTES_PER_S = 0.8e-6, 3.0e12  # the model's assumptions (H100: measured copy 3.0 TB/s)
VARIANTS = {"default": {}, "with_select_code": dict(selects=True), "unroll2": dict(stream_unroll=2),
            "unroll4": dict(stream_unroll=4), "sums": dict(stream_sums=True)}
# "sums": greedy rows' stream with its sums, the default before STREAM_GREEDY_ARGMAX_ONLY turned on (2026-11-28);
# greedy rows' default and unroll variants are the argmax-only stream since


def ptxas_path() -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")


def compile_stream(batch: int, modes, overrides: dict):
    """(plan, compiled kernel) of the streaming launch, specialised as the JIT would at run time."""
    plan = plans.plan_launches(batch, K, V, True, num_sms=SMS, interpreting=False, modes=modes, **overrides)
    constexprs = dict(V=V, K=K, CHUNK=plan.select_chunk, BLOCK_V=plan.select_block_v, BLOCK_K=4,
                      BLOCK_C=triton.next_power_of_2(plan.select_chunks), CAP=plan.cap, SAMPLE=plan.sample,
                      SAMPLE_RUN=plan.sample_run, SAMPLE_GROUP=plan.sample_group, SAMPLE_SUB=plan.sample_sub,
                      FENCE=True, GREEDY_TOKENS=plan.greedy_tokens, HAS_DRAFT_LOGITS=True, BLOCK_K1=8,
                      LANES=plan.stream_lanes, SELECTS=plan.selects, UNROLL=plan.stream_unroll, SUMS=plan.stream_sums)
    ints = dict(NPOS=2 * K + 1, st_b=(K + 1) * V, st_k=V, sd_b=K * V, sd_k=V, sx_b=K, sx_k=1, so_b=K + 1,
                NCHUNK=plan.select_chunks)
    return plan, compile_specialised(select_stream_kernel, constexprs, ints, plans.STREAM_NUM_WARPS)


def compile_specialised(fn, constexprs: dict, ints: dict, num_warps: int):
    """fn compiled for sm_90a with pointers 16-byte aligned and the ints of ``ints`` that are
    multiples of 16 marked so (what the JIT's specialisation gives at run time)."""
    return compile_kernel(fn, "*bf16", constexprs, num_warps, ints=ints)


def programs_per_sm(regs: int, num_warps: int) -> int:
    """Programs of num_warps warps an SM holds with regs registers a thread (allocated in units of 8)."""
    allocated = -(-regs // 8) * 8
    return min(REGISTERS_PER_SM // (allocated * 32 * num_warps), MAX_WARPS_PER_SM // num_warps)


def model_fraction(in_flight: int | None) -> float | None:
    """The Little's-law MODEL: bytes in flight an SM x SMS / LATENCY_S, capped by the roofline, as a
    fraction of it (None without a loop to read)."""
    if not in_flight:
        return None
    return round(min(in_flight * SMS / LATENCY_S, ROOFLINE_BYTES_PER_S) / ROOFLINE_BYTES_PER_S, 3)


def emit_row(batch: int, lanes: bool = False) -> dict:
    """The emission kernel (T = 1 rows): registers, programs per SM, its loops' sizes. At B = 64 its
    streaming loop is far longer than the selection's per value (Philox noise, the ratio test,
    block reductions with barriers every step): the T = 1 minus greedy gap the H100 measured.
    lanes: the per-lane pass (_triton_emit.py LANES: one reduction per step, the rest after the loop)."""
    from specdec_fast.kernels.verify._triton_emit import emit_kernel

    plan = plans.plan_launches(batch, K, V, True, num_sms=SMS, interpreting=False, modes=frozenset({"plain"}))
    constexprs = dict(V=V, K=K, CHUNK=plan.emit_chunk, HAS_DRAFT_LOGITS=True, USE_POSITIONS=False,
                      BLOCK_R=plan.emit_block_r, BLOCK_V=plan.emit_block_v, BLOCK_K=4, BLOCK_K1=8,
                      BLOCK_C=triton.next_power_of_2(plan.emit_chunks), FENCE=True, LANES=lanes,
                      SKIP_IDENTITIES=plan.emit_skip_identities)
    ints = dict(st_b=(K + 1) * V, st_k=V, sd_b=K * V, sd_k=V, sx_b=K, sx_k=1, so_b=K + 1)
    kernel = compile_specialised(emit_kernel, constexprs, ints, plans.EMIT_NUM_WARPS)
    regs, spills = registers(kernel.asm["ptx"])
    found = loops(kernel.asm["ptx"])
    programs = programs_per_sm(regs, plans.EMIT_NUM_WARPS)
    grid = plan.emit_grid
    longest = max(found, key=lambda loop: loop["lines"], default={})
    return dict(B=batch, kernel="emit", mode="plain", lanes=lanes, registers=regs, spill_store_bytes=spills,
                programs_per_sm_by_registers=programs, grid=list(grid), waves=round(grid[0] * grid[1] / (programs * SMS), 2),
                chunk=plan.emit_chunk, block_v=plan.emit_block_v, loops=found,
                longest_loop_ptx_lines=longest.get("lines", 0), longest_loop_bar_sync=longest.get("bar_sync", 0))


def finish_row(batch: int, mode: str) -> dict:
    """The finishing kernel (rows with a truncation): registers, programs per SM, its grid and waves,
    and the loop that gathers a row's candidates on the second pass (its vector loads, barriers and
    atomics per step; the row's chunk over one program at B = 64). The H200 measured B = 64 top_p =
    0.9 at 2230 us against 791 for top_k = 50 (570 of 576 distributions on that second pass):
    bytes in flight per SM and the Little's-law bound are the same MODEL as the stream's rows,
    a floor that leaves out the barriers and atomics of each step."""
    from specdec_fast.kernels.verify._triton_select_finish import select_finish_kernel

    modes = frozenset({mode})
    plan = plans.plan_launches(batch, K, V, True, num_sms=SMS, interpreting=False, modes=modes)
    # the constexprs the compile check gives it, which are those kernels/verify/triton.py launches it with
    constexprs = next(cx for fn, _, cx, _ in compile_jobs("*bf16", batch, K, V, True, modes) if fn is select_finish_kernel)
    ints = dict(NPOS=2 * K + 1, st_b=(K + 1) * V, st_k=V, sd_b=K * V, sd_k=V, sx_b=K, sx_k=1,
                NCHUNK=plan.select_chunks, NFCHUNK=plan.finish_chunks)
    kernel = compile_specialised(select_finish_kernel, constexprs, ints, plans.FINISH_NUM_WARPS)
    regs, spills = registers(kernel.asm["ptx"])
    found = loops(kernel.asm["ptx"])
    programs = programs_per_sm(regs, plans.FINISH_NUM_WARPS)
    gather = max((loop for loop in found if loop["atomics"] and loop["ld_global"]), key=lambda loop: loop["lines"],
                 default=None)  # 16-byte loads where the chunks start aligned (B = 64: one chunk), else 2-byte ones
    width = 16 if gather and any(".v4" in k for k in gather["ld_kinds"]) else 2
    in_flight = programs * 32 * plans.FINISH_NUM_WARPS * width * gather["ld_global"] if gather else None
    grid = plan.finish_grid
    return dict(B=batch, kernel="select_finish", mode=mode, registers=regs, spill_store_bytes=spills,
                programs_per_sm_by_registers=programs, grid=list(grid),
                waves=round(grid[0] * grid[1] / (programs * SMS), 2), values_per_program=plan.finish_chunk,
                gather_loop=gather, bytes_in_flight_per_sm=in_flight,
                model_bandwidth_fraction_of_roofline=model_fraction(in_flight), loops=found)


def registers(ptx: str) -> tuple[int, int]:
    """(registers, spill store bytes) from Triton's ptxas -v for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        done = subprocess.run([ptxas_path(), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True, check=True)
    text = done.stdout + done.stderr
    return int(re.search(r"Used (\d+) registers", text).group(1)), int(re.search(r"(\d+) bytes spill stores", text).group(1))


def loops(ptx: str) -> list[dict]:
    """Every loop of the PTX (a label and a later branch back to it): global loads, their kinds,
    ex2, barriers and atomics in its body."""
    lines, labels, found = ptx.splitlines(), {}, []
    for i, line in enumerate(lines):
        label = re.match(r"^\$(L__BB\d+_\d+):", line.strip())
        if label:
            labels[label.group(1)] = i
        back = re.search(r"bra(?:\.uni)?\s+\$(L__BB\d+_\d+);", line)
        if back and back.group(1) in labels and labels[back.group(1)] < i:
            body = lines[labels[back.group(1)]:i + 1]
            loads = [b for b in body if "ld.global" in b]
            found.append(dict(ld_global=len(loads), ld_kinds=sorted({re.search(r"ld\.global[\w.]*", b).group(0)
                                                                      for b in loads}),
                              ex2=sum("ex2" in b for b in body), bar_sync=sum("bar.sync" in b for b in body),
                              atomics=sum("atom." in b for b in body), lines=len(body)))
    return found


def streaming_loop(found: list[dict]) -> dict | None:
    """The per-lane or block streaming loop: vector loads of the logits (and exps, but for the
    argmax-only stream, which has none), the largest such."""
    candidates = [loop for loop in found if any(".v4" in kind for kind in loop["ld_kinds"])]
    return max(candidates, key=lambda loop: loop["ld_global"], default=None)


def row(batch: int, mode: str, variant: str) -> dict:
    modes = frozenset({mode})
    plan, kernel = compile_stream(batch, modes, VARIANTS[variant])
    regs, spills = registers(kernel.asm["ptx"])
    loop = streaming_loop(loops(kernel.asm["ptx"]))
    programs = programs_per_sm(regs, plans.STREAM_NUM_WARPS)
    loads = loop["ld_global"] if loop else None
    in_flight = programs * 32 * plans.STREAM_NUM_WARPS * 16 * loads if loads else None
    values_per_step = plan.select_block_v * plan.stream_unroll // (32 * plans.STREAM_NUM_WARPS)
    return dict(B=batch, mode=mode, variant=variant, stream_lanes=plan.stream_lanes, unroll=plan.stream_unroll,
                selects=plan.selects, chunk=plan.select_chunk, block_v=plan.select_block_v, registers=regs,
                spill_store_bytes=spills, programs_per_sm_by_registers=programs, loop=loop,
                ex2_per_value=round(loop["ex2"] / values_per_step, 3) if loop else None,
                bytes_in_flight_per_sm=in_flight,
                model_bandwidth_fraction_of_roofline=model_fraction(in_flight))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "verify_stream_ptx_sm90.json"))
    args = ap.parse_args(argv)
    rows = []
    for batch in (1, 8, 64):
        for mode in ("greedy", "plain", "top_k"):
            for variant in VARIANTS:
                if mode == "top_k" and variant == "with_select_code":
                    continue  # top-k rows need the select code: the default already has it
                if mode != "greedy" and variant == "sums":
                    continue  # the sums are dropped for greedy rows only: elsewhere "sums" is the default
                r = row(batch, mode, variant)
                rows.append(r)
                loop = r["loop"] or {}
                print(f"B={batch:2d} {mode:6s} {variant:16s} lanes={r['stream_lanes']!s:5s} unroll={r['unroll']} "
                      f"loop={loop.get('lines')} lines ex2={loop.get('ex2')} "
                      f"regs={r['registers']:3d} spills={r['spill_store_bytes']} programs/SM={r['programs_per_sm_by_registers']} "
                      f"loads/step={loop.get('ld_global')} {','.join(loop.get('ld_kinds', []))} "
                      f"in flight/SM={r['bytes_in_flight_per_sm']} model={r['model_bandwidth_fraction_of_roofline']}",
                      flush=True)
    emits = [emit_row(batch, lanes) for batch in (1, 64) for lanes in (False, True)]
    for r in emits:
        print(f"emit B={r['B']:2d} lanes={r['lanes']!s:5s} regs={r['registers']} spills={r['spill_store_bytes']} "
              f"programs/SM={r['programs_per_sm_by_registers']} grid={r['grid']} waves={r['waves']} longest loop "
              f"{r['longest_loop_ptx_lines']} PTX lines, {r['longest_loop_bar_sync']} bar.sync", flush=True)
    finishes = [finish_row(batch, mode) for batch in (1, 64) for mode in ("top_k", "top_p")]
    for r in finishes:
        loop = r["gather_loop"] or {}
        print(f"finish B={r['B']:2d} {r['mode']:5s} regs={r['registers']} spills={r['spill_store_bytes']} "
              f"programs/SM={r['programs_per_sm_by_registers']} grid={r['grid']} waves={r['waves']} "
              f"values/program={r['values_per_program']} gather loop: {loop.get('ld_global')} "
              f"{','.join(loop.get('ld_kinds', []))} loads, {loop.get('bar_sync')} bar.sync, {loop.get('atomics')} "
              f"atomics a step; in flight/SM={r['bytes_in_flight_per_sm']} model={r['model_bandwidth_fraction_of_roofline']}",
              flush=True)
    result = dict(what="select_stream_kernel compiled for sm_90a on a CPU machine (no GPU): registers, streaming "
                       "loop loads, a Little's-law model of the bandwidth (not a measurement); emit_rows and "
                       "finish_rows: the emission and finishing kernels the same way",
                  shape=dict(K=K, V=V, logits="bf16", num_warps=plans.STREAM_NUM_WARPS),
                  model=dict(sms=SMS, latency_s=LATENCY_S, roofline_bytes_per_s=ROOFLINE_BYTES_PER_S,
                             registers_per_sm=REGISTERS_PER_SM),
                  ptxas=ptxas_path().split("site-packages/")[-1], versions=versions(),
                  command="python bench/verify_stream_ptx.py", rows=rows, emit_rows=emits, finish_rows=finishes)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
