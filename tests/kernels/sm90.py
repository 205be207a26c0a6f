"""Compile one Triton kernel for an H100 (sm_90a; SPECDEC_COMPILE_CAPABILITY for another GPU) on a
machine with no GPU: the one helper behind the ahead-of-time compile checks (aot_compile_*.py,
_compile_*_kernels.py) and the PTX reports (bench/verify_stream_ptx.py, bench/gemv_ptx.py). The
interpreter never runs Triton's compiler, so this is what sees typing, layouts, registers, shared
memory and ptxas. Import it only in a process whose TRITON_INTERPRET is unset before triton is
imported."""
import os

assert os.environ.get("TRITON_INTERPRET") != "1", "compile without TRITON_INTERPRET"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from specdec_fast.kernels._triton_compat import HAS_PDL, PDL_MIN_CAPABILITY  # noqa: E402

# SPECDEC_COMPILE_CAPABILITY (e.g. 80 for an A100, 86 / 89 for RTX 30xx / 40xx and L4 / L40, 75 for a
# T4): the same compile checks for another GPU generation (tests/kernels/test_other_gpu_compiles.py)
CAPABILITY = int(os.environ.get("SPECDEC_COMPILE_CAPABILITY", "90"))
TARGET = GPUTarget("cuda", CAPABILITY, 32)
# The most shared memory one block may use (CUDA's per-block opt-in limit, cudaDevAttrMaxSharedMemoryPerBlockOptin):
# the compile checks fail a kernel over it (Triton's compiler does not; its launch would)
SHARED_MEMORY_LIMIT = {75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448}
if os.environ.get("SPECDEC_COMPILE_SHARED_LIMIT"):  # a stand-in limit (test_other_gpu_compiles.py's control)
    SHARED_MEMORY_LIMIT[CAPABILITY] = int(os.environ["SPECDEC_COMPILE_SHARED_LIMIT"])
# The PDL forms compile for this target (the launchers never ask for them elsewhere: kernels/_triton_compat.py)
PDL_TARGET = HAS_PDL and (CAPABILITY // 10, CAPABILITY % 10) >= PDL_MIN_CAPABILITY


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
    kernel = triton.compile(source, target=TARGET, options=opts)
    limit = SHARED_MEMORY_LIMIT.get(CAPABILITY)
    if limit is not None and kernel.metadata.shared > limit:  # the launch would fail there: Triton's OutOfResources
        raise RuntimeError(f"{fn.__name__} {constexprs} num_warps={num_warps}: {kernel.metadata.shared} bytes of shared "
                           f"memory, over sm_{CAPABILITY}'s {limit} a block")
    return kernel
