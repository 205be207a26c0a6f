"""Choosing a kernel backend: "triton" on CUDA (compute capability 8.0 or later), "cpp" on CPU
when it builds, else "torch";
and the one normal form of a device that every stored or compared device goes through."""
import functools
import os
import warnings

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


# The oldest Triton the kernels are checked against (on CPU: every kernel compiles for sm_90a, and
# the interpreter gives the references' tokens; Triton 3.3's interpreter lacks ops the kernels use).
# An older one (torch 2.7 and before pin theirs) leaves CUDA on the torch backend, with a warning.
MIN_TRITON = (3, 4)


def triton_version() -> tuple[int, int] | None:
    """(major, minor) of the installed triton, or None without one."""
    try:
        import triton
    except ImportError:
        return None
    parts = triton.__version__.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def _too_old_message(version) -> str:
    return (f"triton {version[0]}.{version[1]} is installed; specdec_fast's Triton kernels need triton >= "
            f"{MIN_TRITON[0]}.{MIN_TRITON[1]} (torch 2.8 or later brings one)")


@functools.cache
def _warn_too_old(version) -> None:
    warnings.warn(_too_old_message(version) + ": CUDA tensors run the torch backend (exact, slower)", stacklevel=3)


def triton_available() -> bool:
    """A triton the kernels run on is installed (>= MIN_TRITON; an older one warns once)."""
    version = triton_version()
    if version is None:
        return False
    if version < MIN_TRITON:
        _warn_too_old(version)
        return False
    return True


# The oldest GPU the Triton kernels run on: compute capability 8.0 (A100), Triton's own floor.
# Every kernel is compiled for sm_80, sm_86 and sm_89 as for sm_90a, within each target's shared
# memory per block (tests/kernels/sm90.py SPECDEC_COMPILE_CAPABILITY, bench/results/
# compile_other_gpus.md); for sm_75 (T4) the prefill attention tile needs 96 KB of shared memory
# against its 64 KB, and its tl.dot has no tensor-core path. Older GPUs run the torch backend.
MIN_CAPABILITY = (8, 0)


@functools.cache
def cuda_capability(index: int) -> tuple[int, int]:
    """(major, minor) of CUDA device ``index``, asked once (the backend choice, PDL)."""
    return tuple(torch.cuda.get_device_capability(index))


def _old_gpu_message(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on CUDA ``device`` (an AMD GPU under ROCm, or an NVIDIA GPU
    before MIN_CAPABILITY), or None (also where CUDA is not available: nothing to ask, and no CUDA
    tensor to run on)."""
    if not torch.cuda.is_available():
        return None
    if getattr(torch.version, "hip", None):  # ROCm's torch reports AMD GPUs as "cuda" devices
        return ("this is an AMD GPU (ROCm); specdec_fast's Triton kernels hold NVIDIA PTX (fences, the "
                "GEMV layer's prefetches) and have only been compiled for NVIDIA GPUs")
    index = canonical_device(device).index
    capability = cuda_capability(index)
    if capability >= MIN_CAPABILITY:
        return None
    return (f"{torch.cuda.get_device_name(index)} has compute capability {capability[0]}.{capability[1]}; "
            f"specdec_fast's Triton kernels need {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or later (an A100, "
            f"RTX 30xx, L4 or newer)")


@functools.cache
def _warn_old_gpu(message: str) -> None:
    warnings.warn(message + ": CUDA tensors run the torch backend (exact, slower)", stacklevel=3)


def triton_runs_on(device: torch.device) -> bool:
    """A CUDA device the Triton kernels run on (MIN_CAPABILITY; an older GPU warns once)."""
    message = _old_gpu_message(device)
    if message is not None:
        _warn_old_gpu(message)
    return message is None


def default_backend_reason(device: torch.device) -> tuple[str, str]:
    """(the backend backend=None takes on ``device``, why), without warnings or a build: what
    `specdec-fast env` prints. On CPU: "cpp" when its library is built (or will build at the first
    call), "torch" when SPECDEC_FAST_NO_CPP=1 turns it off."""
    if device.type == "cuda":
        version = triton_version()
        if version is None:
            return "torch", "no triton installed (pip install triton)"
        if version < MIN_TRITON:
            return "torch", _too_old_message(version)
        message = _old_gpu_message(device)
        if message is not None:
            return "torch", message
        return "triton", f"triton {version[0]}.{version[1]}"
    from . import _cpp_build

    if os.environ.get("SPECDEC_FAST_NO_CPP") == "1":
        return "torch", "SPECDEC_FAST_NO_CPP=1 turns the C++ backend off"
    library = _cpp_build.library_path(_cpp_build.build_key())
    if library.is_file():
        return "cpp", f"built for this machine ({_cpp_build.cpu_isa()} paths): {library}"
    return "cpp", (f"not built yet: the first call on CPU tensors builds it ({_cpp_build.cpu_isa()} paths), "
                   f"or `specdec-fast build-cpu` now")


def require_triton() -> None:
    """ValueError naming why backend='triton' cannot run here: no triton, or one older than MIN_TRITON."""
    version = triton_version()
    if version is None:
        raise ValueError("backend='triton' needs the triton package (pip install triton)")
    if version < MIN_TRITON:
        raise ValueError(f"backend='triton': {_too_old_message(version)}")


def resolve_backend(backend, device: torch.device, cpp_op: str) -> str:
    """The backend to run on ``device``. ``cpp_op`` names the torch.ops.specdec_fast op that
    the C++ backend must provide. Raises ValueError for a backend that cannot run there."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}")
    if backend is None:
        if device.type == "cuda":
            return "triton" if triton_available() and triton_runs_on(device) else "torch"
        return "cpp" if cpp_op_available(cpp_op) else "torch"
    if backend == "triton":
        require_triton()
        if device.type != "cuda" and not triton_interpreting():
            raise ValueError("backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported")
        old_gpu = _old_gpu_message(device) if device.type == "cuda" and not triton_interpreting() else None
        if old_gpu is not None:
            raise ValueError(f"backend='triton': {old_gpu} (backend=None runs the torch backend there)")
    if backend == "cpp":
        if device.type != "cpu":
            raise ValueError(f"backend='cpp' runs on CPU tensors, got tensors on {device}")
        if not cpp_op_available(cpp_op):
            raise ValueError(f"backend='cpp' is unavailable: the C++ op {cpp_op!r} did not build (see the warning)")
    return backend


def cpp_op_available(name: str) -> bool:
    return load_cpu_ops() and hasattr(torch.ops.specdec_fast, name)
