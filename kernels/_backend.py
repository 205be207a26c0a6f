"""Choosing a kernel backend: "triton" on CUDA, "cpp" on CPU when it builds, else "torch";
and the one normal form of a device that every stored or compared device goes through."""
import os

import torch

from ._cpp_build import load_cpu_ops

BACKENDS = ("triton", "cpp", "torch")


def canonical_device(device) -> torch.device:
    """``device`` (str, int or torch.device) as the torch.device a tensor created there reports:
    a CUDA device without an index gets the current one ("cuda" -> cuda:0), so a stored device
    compares equal to ``tensor.device`` (which always carries the index). Other types unchanged."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return torch.device("cuda", index)
    return device


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend, device: torch.device, cpp_op: str) -> str:
    """The backend to run on ``device``. ``cpp_op`` names the torch.ops.specdec_fast op that
    the C++ backend must provide. Raises ValueError for a backend that cannot run there."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}")
    if backend is None:
        if device.type == "cuda":
            return "triton" if triton_available() else "torch"
        return "cpp" if cpp_op_available(cpp_op) else "torch"
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package (pip install triton)")
        if device.type != "cuda" and not triton_interpreting():
            raise ValueError("backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported")
    if backend == "cpp":
        if device.type != "cpu":
            raise ValueError(f"backend='cpp' runs on CPU tensors, got tensors on {device}")
        if not cpp_op_available(cpp_op):
            raise ValueError(f"backend='cpp' is unavailable: the C++ op {cpp_op!r} did not build (see the warning)")
    return backend


def cpp_op_available(name: str) -> bool:
    return load_cpu_ops() and hasattr(torch.ops.specdec_fast, name)
