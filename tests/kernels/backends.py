"""The backends every kernel test runs on, on this machine.

On CPU: torch (reference), cpp (csrc, must build here unless SPECDEC_FAST_NO_CPP=1) and
triton (through TRITON_INTERPRET=1). On CUDA: torch and triton.
"""
import os

import torch

ON_CUDA = torch.cuda.is_available()


def kernel_backends() -> list[str]:
    backends = ["torch", "triton"]
    if not ON_CUDA and os.environ.get("SPECDEC_FAST_NO_CPP") != "1":
        backends.append("cpp")
    return backends
