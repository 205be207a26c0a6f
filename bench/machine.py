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
