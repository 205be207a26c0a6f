"""Compile the Triton tree_verify kernels for an sm_90 (H100) target without a GPU (the CPU
interpreter never runs Triton's compiler). Run as a script (TRITON_INTERPRET unset before triton
is imported); prints one line per kernel and exits non-zero on the first failure."""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import _compile_verify_kernels as compiler  # noqa: E402  (beside this script: sys.path[0])

from specdec_fast.kernels.tree_verify import _triton_kernels as tree  # noqa: E402
from specdec_fast.kernels.tree_verify import _triton_residual as residual  # noqa: E402
from specdec_fast.kernels.tree_verify import _triton_walk as walk  # noqa: E402
from specdec_fast.kernels.tree_verify._triton_plan import walk_parallel_warps  # noqa: E402

INT_POINTERS = ("parents_ptr", "tokens_ptr", "seed_ptr", "offset_ptr", "tkey_ptr")  # int64
INT32_POINTERS = ("amax_ptr", "order_ptr", "count_ptr", "ticket_ptr", "sync_ptr", "node_i_ptr", "path_ptr", "out_ptr", "num_accepted_ptr", "final_ptr", "removed_ptr",
                  "num_removed_ptr", "q_idx_ptr", "r_idx_ptr", "r_any_ptr")


def main() -> int:
    compiler.POINTER_TYPES.update({name: "*i64" for name in INT_POINTERS})
    compiler.POINTER_TYPES.update({name: "*i32" for name in INT32_POINTERS})
    for logits_type, n, vocab, has_draft in (("*bf16", 16, 1000, True), ("*fp32", 64, 32000, False)):
        block_n = 1 << (n - 1).bit_length()
        walk_warps = 8 if 16 * block_n >= 1024 else 4  # as kernels/tree_verify/triton.py launches it
        jobs = [
            (residual.residual_rows_kernel, dict(N=n, BLOCK_N=block_n, BLOCK_K=block_n), 4),
            *[(residual.residual_mass_kernel, dict(N=n, V=vocab, BLOCK_S=1, BLOCK_V=1024, BLOCK_B=1, BLOCK_C=512,
                                                   FENCE=True, SKIP_IDENTITIES=skip), 4) for skip in (False, True)],
            (residual.residual_masses_fused_kernel, dict(N=n, V=vocab, BLOCK_N=block_n, BLOCK_K=block_n, BLOCK_S=1,
                                                         BLOCK_V=2048, BLOCK_B=1, BLOCK_C=256, FENCE=True,
                                                         SKIP_IDENTITIES=True, SPIN_LIMIT=1 << 16), 4),
            *[(tree.walk_kernel, dict(N=n, V=vocab, HAS_DRAFT_LOGITS=has_draft, BLOCK_R=16, BLOCK_N=block_n,
                                      GREEDY_BONUS=bonus), walk_warps) for bonus in (False, True)],
            (walk.walk_parallel_kernel, dict(N=n, V=vocab, HAS_DRAFT_LOGITS=has_draft, BLOCK_N=block_n,
                                             GREEDY_BONUS=False), walk_parallel_warps(block_n)),
            (tree.emit_kernel, dict(N=n, V=vocab, CHUNK=2048, HAS_DRAFT_LOGITS=has_draft, BLOCK_R=2, BLOCK_V=1024,
                                    BLOCK_C=64, FENCE=True), 4),
        ]
        for fn, constexprs, num_warps in jobs:
            compiler.compile_kernel(fn, logits_type, constexprs, num_warps)
            print(f"compiled {fn.__name__} {logits_type} N={n} V={vocab} {constexprs}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
