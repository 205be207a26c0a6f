"""`specdec-fast env`: what this machine gives specdec_fast, for a first check or a bug report:
the versions it runs with, each CUDA device (compute capability, SMs, shared memory a block) and
the kernel backend a call takes there and why (kernels/_backend.default_backend_reason: Triton on
NVIDIA GPUs of compute capability 8.0 or later, else the torch reference), and the CPU's (the C++
kernels: built or not; this command builds nothing). Exit status 0."""
import platform
import sys

HELP = "print the versions, the devices and the kernel backend each one takes (for a bug report)"


def add_env_parser(sub) -> None:
    sub.add_parser("env", help=HELP, description=HELP)


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "not installed"


def run_env(out=None) -> int:
    import torch

    from . import __version__
    from .kernels import _backend
    from .kernels.attention.triton import _num_sms, _shared_limit

    out = out or sys.stdout
    hip = getattr(torch.version, "hip", None)
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else (f"ROCm {hip}" if hip else "CPU build")
    print(f"specdec-fast {__version__}, Python {platform.python_version()}, torch {torch.__version__} ({cuda}), "
          f"triton {_version('triton')}, transformers {_version('transformers')}", file=out)
    backend, why = _backend.default_backend_reason(torch.device("cpu"))
    print(f"cpu ({platform.machine()}, {torch.get_num_threads()} threads): backend {backend}: {why}", file=out)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        print("no CUDA device", file=out)
    for index in range(count):
        device = torch.device("cuda", index)
        major, minor = torch.cuda.get_device_capability(index)
        shared = _shared_limit(device)
        backend, why = _backend.default_backend_reason(device)
        print(f"cuda:{index} {torch.cuda.get_device_name(index)}: compute capability {major}.{minor}, "
              f"{_num_sms(device)} SMs, {'?' if shared is None else shared} bytes of shared memory a block: "
              f"backend {backend}: {why}", file=out)
    return 0
