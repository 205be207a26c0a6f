"""The backends every kernel test runs on, on this machine: the one place that decides it.

Every kernel table builds its inputs on the ``device`` fixture (tests/conftest.py) and runs:
  GPU machine (device "cuda"): torch (the reference, on CUDA) and triton (compiled, on CUDA);
  elsewhere   (device "cpu"):  torch, triton (TRITON_INTERPRET=1) and cpp (csrc; it must build
                               here unless SPECDEC_FAST_NO_CPP=1).
cpp runs only where the test tensors are on the CPU: it takes no CUDA tensors.
"""
import os

import torch

ON_CUDA = torch.cuda.is_available()
TEST_DEVICE = "cuda" if ON_CUDA else "cpu"  # the value of the ``device`` fixture


def kernel_backends() -> list[str]:
    backends = ["torch", "triton"]
    if not ON_CUDA and os.environ.get("SPECDEC_FAST_NO_CPP") != "1":
        backends.append("cpp")
    return backends


def cpp_tested() -> bool:
    """Whether the cpp column runs here (what routing tests expect the automatic choice to take)."""
    return "cpp" in kernel_backends()
