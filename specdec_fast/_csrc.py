"""Builds the C++ CPU backend (csrc/*.cpp) on first use and caches it.

All sources compile into one shared library that registers its ops with
TORCH_LIBRARY_FRAGMENT(specdec_fast, m), so each op lives in its own .cpp file and is
called as torch.ops.specdec_fast.<name>. The build is cached under
~/.cache/specdec_fast/<version>/<hash of sources, flags, torch install, CPU>/ (override the
root with SPECDEC_FAST_CACHE) and guarded by a file lock, so parallel processes build once.
Without a compiler (or with SPECDEC_FAST_NO_CPP=1) load_cpu_ops() returns False and
the torch reference serves.
"""
import fcntl
import hashlib
import os
import platform
import sysconfig
import warnings
from functools import lru_cache
from pathlib import Path

from ._version import __version__

CFLAGS = ["-O3", "-fopenmp", "-march=native", "-ffp-contract=off", "-std=c++17"]
LDFLAGS = ["-fopenmp"]


def _sources() -> list[Path]:
    import specdec_fast.csrc as csrc

    return sorted(Path(csrc.__file__).parent.glob("*.cpp"))


def _cpu_tag() -> str:
    """What -march=native depends on: the machine and its CPU flags."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return platform.machine() + flags


def _build_key(sources: list[Path]) -> str:
    import torch

    h = hashlib.sha256()
    for src in sources + sorted(Path(sources[0]).parent.glob("*.h")):
        h.update(src.name.encode() + src.read_bytes())
    h.update(" ".join(CFLAGS + LDFLAGS).encode() + torch.__version__.encode() + _cpu_tag().encode())
    # The torch install (its headers and libraries) is part of the build command that ninja
    # records: two environments sharing one build folder rebuilt it for each other.
    h.update(str(Path(torch.__file__).resolve().parent).encode() + sysconfig.get_paths()["include"].encode())
    return h.hexdigest()[:16]


def _copy_sources(sources: list[Path], dest: Path) -> list[Path]:
    """Copy the .cpp files and the headers beside them into dest (rewriting only what differs,
    so ninja's timestamps stay put); returns the copied .cpp paths."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for src in sources + sorted(sources[0].parent.glob("*.h")):
        target = dest / src.name
        data = src.read_bytes()
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
        if src.suffix == ".cpp":
            copied.append(target)
    return copied


def cache_root() -> Path:
    root = os.environ.get("SPECDEC_FAST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specdec_fast")
    return Path(root) / __version__


def _ensure_ninja_on_path() -> None:
    """torch's builder calls `ninja` from PATH; a virtualenv that is not activated lacks it there."""
    try:
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass


@lru_cache(maxsize=None)
def load_cpu_ops() -> bool:
    """Build (once) and load the C++ ops into torch.ops.specdec_fast. True when they are there."""
    if os.environ.get("SPECDEC_FAST_NO_CPP") == "1":
        return False
    sources = _sources()
    if not sources:
        return False
    try:
        from torch.utils import cpp_extension

        key = _build_key(sources)
        build_dir = cache_root() / key
        build_dir.mkdir(parents=True, exist_ok=True)
        _ensure_ninja_on_path()
        with open(build_dir / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                # Build from a copy inside the (content-addressed) build folder: ninja records
                # absolute source paths, so building from each checkout's own csrc/ made two
                # checkouts with identical sources rebuild each other's library (~60 s a time).
                local_sources = _copy_sources(sources, build_dir / "src")
                cpp_extension.load(
                    name=f"specdec_fast_cpu_{key}",
                    sources=[str(s) for s in local_sources],
                    extra_cflags=CFLAGS,
                    extra_ldflags=LDFLAGS,
                    build_directory=str(build_dir),
                    is_python_module=False,
                    verbose=os.environ.get("SPECDEC_FAST_VERBOSE_BUILD") == "1",
                )
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return True
    except Exception as exc:  # no compiler, no ninja, a build error: fall back, say why once
        warnings.warn(f"specdec_fast: C++ CPU backend unavailable, using the torch reference ({exc})", RuntimeWarning)
        return False
