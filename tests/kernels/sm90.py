"""Compile one Triton kernel for an H100 (sm_90a) on a machine with no GPU: the one helper behind
the ahead-of-time compile checks (aot_compile_*.py, _compile_*_kernels.py) and the PTX reports
(bench/verify_stream_ptx.py, bench/gemv_ptx.py). The interpreter never runs Triton's compiler, so
this is what sees typing, layouts, registers, shared memory and ptxas. Import it only in a process
whose TRITON_INTERPRET is unset before triton is imported."""
import os

assert os.environ.get("TRITON_INTERPRET") != "1", "compile without TRITON_INTERPRET"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def compile_sm90(fn, constexprs: dict, types: dict, *, num_warps: int, num_stages: int | None = None,
                 pdl: bool = False, options: dict | None = None, specialise: dict | None = None):
    """fn (a @triton.jit function) compiled for sm_90a -> Triton's compiled kernel (asm["ptx"], metadata).

    constexprs: argument name -> value; types: argument name -> Triton type ("*bf16", "fp32", ...)
    for the other arguments, "i32" where absent. pdl: the programmatic-dependent-launch form
    (launch_pdl). specialise: None marks nothing aligned or divisible; a dict of int arguments'
    values marks every pointer 16-byte aligned and those ints that are multiples of 16 divisible,
    as the JIT specialises at run time."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        signature[name] = types.get(name, "i32")
        if specialise is not None and (signature[name].startswith("*") or specialise.get(name, 1) % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
                       attrs=attrs or None)
    opts = {"num_warps": num_warps, **({} if num_stages is None else {"num_stages": num_stages}),
            **({"launch_pdl": True} if pdl else {}), **(options or {})}
    return triton.compile(source, target=TARGET, options=opts)
