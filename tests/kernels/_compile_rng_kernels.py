"""Compile the Triton row-seed kernel (kernels/rng/triton.py) for an sm_90 (H100) target without a
GPU, and check with Triton's real JIT binder (not the interpreter's) that every int64 seed maps
to one specialisation key. Run as a script (TRITON_INTERPRET unset before triton is imported)."""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from specdec_fast.kernels.rng.triton import _derive_row_seeds_kernel as kernel  # noqa: E402
from specdec_fast.engine.triton_launches import launch_of  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90 import TARGET  # noqa: E402


def main() -> int:
    assert type(kernel).__name__ == "JITFunction", type(kernel)
    out = torch.empty(8, dtype=torch.int64)
    keys = {launch_of(kernel, (out, seed, 8), {"BLOCK": 8}, (1,)).key for seed in (0, 1, 16, -1, 2**40, -(2**63))}
    assert len(keys) == 1, keys
    print("one key for every seed")
    source = ASTSource(kernel, {"out_ptr": "*i64", "seed": "i64", "batch": "i32", "BLOCK": "constexpr"},
                       constexprs={(3,): 128})
    triton.compile(source, target=TARGET, options={"num_warps": 4})
    print("compiled _derive_row_seeds_kernel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
