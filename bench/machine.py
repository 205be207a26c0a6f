"""What every benchmark records beside its numbers: the machine, the versions, the commit."""
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_simd() -> dict:
    """The SIMD instruction sets of this CPU (from /proc/cpuinfo) and the one the C++ ops compile
    for (-march=native): skinny_linear has tiles per ISA, so CPU results are named by it."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        flags = flags.split(":", 1)[1].split()
    except (OSError, StopIteration, IndexError):
        flags = []
    simd = sorted(f for f in flags if f.startswith(("avx", "fma", "sse", "amx")))
    isa = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= set(flags) else "generic"
    return {"cpu_isa": isa, "cpu_simd_flags": simd}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions() -> dict:
    """torch / triton / transformers / python versions and the git commit."""
    import torch

    info = {"torch": torch.__version__, "python": platform.python_version(), "commit": git_commit()}
    for name in ("triton", "transformers"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    return info


def write_result(result: dict, prefix: str, device_name: str, out=None) -> Path:
    """Write a benchmark's result as JSON to out, or to bench/results/<prefix>_<device>.json (the
    device's name lower case, spaces as underscores: the <dev> of bench/run_gpu.sh); print and
    return the path."""
    import json

    path = Path(out or ROOT / "bench" / "results" / f"{prefix}_{device_name.lower().replace(' ', '_')}.json")
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return path
