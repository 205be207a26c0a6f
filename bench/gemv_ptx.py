"""The Triton skinny linear (kernels/linear/triton.py) as an H100 would run it, read on a machine
without a GPU: compiled for sm_90a with the JIT's run-time specialisation (pointers 16-byte
aligned, strides and sizes that are multiples of 16 marked so), then ptxas -v for registers and
spills, and the PTX of its K loop for its loads per step.

Per (projection of the 8B-shaped layer with the prologue the runner fuses into it, rows, tile
config): registers, spills, shared memory, the loop's global loads (and their width) and
cp.async copies per step, programs per SM that registers / shared memory / warps allow, the
launch's programs and waves, and bytes of weight in flight per SM. The last column feeds a
MODEL, not a measurement (Little's law at an assumed 0.8 us DRAM latency, 132 SMs, capped by the
3.0 TB/s copy roofline the H100 measured); bench/bench_gemv.py --gpu measures.

    python bench/gemv_ptx.py [--out bench/results/gemv_ptx_sm90.json]
Run without TRITON_INTERPRET (it compiles; nothing runs on a device). Not a test.
"""
import argparse
import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from machine import versions  # noqa: E402
from verify_stream_ptx import (LATENCY_S, MAX_WARPS_PER_SM, REGISTERS_PER_SM, ROOFLINE_BYTES_PER_S, SMS, loops,  # noqa: E402
                               ptxas_path, registers)

from specdec_fast.kernels.linear import triton as gemv  # noqa: E402
from tests.kernels.sm90 import compile_sm90  # noqa: E402

SHARED_PER_SM = 228 * 1024  # H100: 228 KB of shared memory per SM (227 KB usable per block)
# The 8B-shaped layer's products, the prologue / epilogue the runner's GEMV layer fuses into each
# (runners/paged_llama.py _decode_gemv): name -> (N, K, prologue, bias, residual).
LLAMA_8B_PRODUCTS = {
    "qkv": (6144, 4096, "rms_norm", False, False),
    "o": (4096, 4096, "none", False, True),
    "gate_up": (28672, 4096, "rms_norm", False, False),
    "down": (4096, 14336, "silu_mul", False, True),
    "down_silu_apart": (4096, 14336, "none", False, True),  # rows > SILU_FUSED_MAX_ROWS: silu_mul launched apart
    "lm_head": (128256, 4096, "rms_norm", False, False),
}


def compile_gemv(rows: int, n: int, k: int, prologue: str, bias: bool, residual: bool, config, dtype="bf16",
                 pdl: bool = False):
    """The kernel for this call, specialised as the JIT would (pointer alignment, divisibility);
    pdl: the programmatic-dependent-launch form (skinny_linear_triton(pdl=True))."""
    fn = gemv._skinny_linear_kernel
    grid, block_m, even_n, even_k, block_k = gemv._launch(rows, n, k, config)
    consts = dict(PROLOGUE=gemv.PROLOGUES.index(prologue), HAS_BIAS=bias, HAS_RES=residual, EVEN_N=even_n,
                  EVEN_K=even_k, DOT_F32=dtype == "fp32", BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=block_k,
                  PDL=pdl)
    width = 2 * k if prologue == "silu_mul" else k
    ints = dict(N=n, K=k, s_x=width, s_w=k, s_r=n, s_y=n)
    types = {name: f"*{dtype}" for name in fn.arg_names if name.endswith("_ptr")}
    kernel = compile_sm90(fn, consts, dict(types, eps="fp32"), num_warps=config.num_warps,
                          num_stages=config.num_stages, pdl=pdl, specialise=ints)
    return kernel, grid, block_m, block_k


def row(name: str, rows: int, config) -> dict:
    n, k, prologue, bias, residual = LLAMA_8B_PRODUCTS[name]
    kernel, grid, block_m, block_k = compile_gemv(rows, n, k, prologue, bias, residual, config)
    ptx = kernel.asm["ptx"]
    regs, spills = registers(ptx)
    loop = max(loops(ptx), key=lambda lp: lp["lines"], default={})
    body_cp_async = 0
    if loop:  # cp.async copies in the loop body (the pipelined path) are not ld.global
        lines = ptx.splitlines()
        body_cp_async = sum("cp.async" in line and "commit" not in line and "wait" not in line for line in lines)
    shared = kernel.metadata.shared
    threads = 32 * config.num_warps
    allocated = -(-regs // 8) * 8
    by_regs = REGISTERS_PER_SM // (allocated * threads)
    by_shared = SHARED_PER_SM // shared if shared else 99
    programs = max(0, min(by_regs, by_shared, MAX_WARPS_PER_SM // config.num_warps))
    total = grid[0] * grid[1]
    resident = min(total, programs * SMS)
    weight_tile = config.block_n * block_k * 2  # bytes of bf16 weight one program requests per step
    # per busy SM: the programs it holds at once (the grid spread over the SMs) x the tiles each has
    # requested (stages - 1 ahead under cp.async pipelining, else the one step's loads)
    busy_sms = min(SMS, total)
    in_flight = weight_tile * max(1, config.num_stages - 1) * min(programs, -(-total // SMS))
    model = min(in_flight * busy_sms / LATENCY_S, ROOFLINE_BYTES_PER_S)
    return dict(product=name, N=n, K=k, prologue=prologue, residual=residual, rows=rows, block_m=block_m,
                config=config.__dict__, block_k=block_k, registers=regs, spill_store_bytes=spills, shared_bytes=shared,
                programs_per_sm=programs, programs=total, waves=round(total / (programs * SMS), 2) if programs else None,
                resident_programs=resident, busy_sms=busy_sms, loop=loop, cp_async_in_ptx=body_cp_async,
                weight_bytes_in_flight_per_sm=in_flight,
                model_fraction_of_roofline=round(model / ROOFLINE_BYTES_PER_S, 3))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gemv_ptx_sm90.json"))
    ap.add_argument("--products", default=",".join(LLAMA_8B_PRODUCTS))
    args = ap.parse_args(argv)
    out = []
    for name in args.products.split(","):
        for rows, block in ((1, 1), (5, 16)):
            n = LLAMA_8B_PRODUCTS[name][0]
            default = gemv.default_config(rows, n, True)
            for config in [default] + [c for c in gemv.CONFIG_CANDIDATES[block] if c != default]:
                r = row(name, rows, config)
                out.append(r)
                lp = r["loop"]
                r["default"] = config == default
                print(f"{'*' if r['default'] else ' '}{name:8s} M={rows:2d} {config.block_n:3d}x{r['block_k']:4d} w={config.num_warps} s={config.num_stages} "
                      f"regs={r['registers']:3d} spills={r['spill_store_bytes']} smem={r['shared_bytes']:6d} "
                      f"prog/SM={r['programs_per_sm']:2d} programs={r['programs']:5d} waves={r['waves']} "
                      f"loop: {lp.get('ld_global')} {','.join(lp.get('ld_kinds', []))} cp.async={r['cp_async_in_ptx']} "
                      f"lines={lp.get('lines')} model={r['model_fraction_of_roofline']}", flush=True)
    result = dict(what="kernels/linear/triton.py _skinny_linear_kernel compiled for sm_90a on a CPU machine (no GPU): "
                       "registers, shared memory, the K loop's loads, a Little's-law model (not a measurement)",
                  model=dict(sms=SMS, latency_s=LATENCY_S, roofline_bytes_per_s=ROOFLINE_BYTES_PER_S,
                             registers_per_sm=REGISTERS_PER_SM, shared_per_sm=SHARED_PER_SM),
                  ptxas=ptxas_path().split("site-packages/")[-1], versions=versions(),
                  command="python bench/gemv_ptx.py", rows=out)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
