"""Compile the Triton verify kernels for an sm_90 (H100) target without a GPU: the CPU
interpreter never runs Triton's compiler, so this is what catches code that only the real
compiler rejects. Run as a script (TRITON_INTERPRET must be unset before triton is imported);
prints one line per kernel and exits non-zero on the first failure."""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from specdec_fast.kernels.verify import _triton_emit as emit  # noqa: E402
from specdec_fast.kernels.verify import _triton_kernels as stats  # noqa: E402

POINTER_TYPES = {
    "tokens_ptr": "*i64", "part_arg_ptr": "*i32", "amax_ptr": "*i32", "tkey_ptr": "*i64", "top_k_ptr": "*i32",
    "seed_ptr": "*i64", "offset_ptr": "*i64", "positions_ptr": "*i64", "q_idx_ptr": "*i32", "r_idx_ptr": "*i32",
    "r_any_ptr": "*i32", "num_accepted_ptr": "*i32", "out_ptr": "*i32",
}


def compile_kernel(fn, logits_type: str, constexprs: dict) -> None:
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ("target_ptr", "draft_ptr"):
            signature[name] = logits_type
        elif name.endswith("_ptr"):
            signature[name] = POINTER_TYPES.get(name, "*fp32")
        else:
            signature[name] = "i32"
    source = ASTSource(fn, signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def main() -> int:
    for logits_type, k, vocab, has_draft in (("*bf16", 3, 1000, True), ("*fp32", 0, 3000, False)):
        jobs = [
            (stats.partial_stats_kernel, dict(V=vocab, K=k, CHUNK=2048, BLOCK_R=2, BLOCK_V=1024, BLOCK_K=4)),
            (stats.thresholds_kernel, dict(V=vocab, K=k, BLOCK_R=2, BLOCK_V=1024, BLOCK_K=4, BLOCK_C=8)),
            (emit.emit_partial_kernel, dict(V=vocab, K=k, CHUNK=2048, HAS_DRAFT_LOGITS=has_draft,
                                            USE_POSITIONS=not has_draft, BLOCK_R=2, BLOCK_V=1024, BLOCK_K=4)),
            (emit.emit_final_kernel, dict(K=k, BLOCK_R=64, BLOCK_K=4, BLOCK_K1=8, BLOCK_C=8)),
        ]
        for fn, constexprs in jobs:
            compile_kernel(fn, logits_type, constexprs)
            print(f"compiled {fn.__name__} {logits_type} K={k} V={vocab}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
