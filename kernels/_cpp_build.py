"""The C++ CPU backend (csrc/*.cpp): built once in a child process, loaded with torch.ops.load_library.

All sources compile into one shared library that registers its ops with
TORCH_LIBRARY_FRAGMENT(specdec_fast, m), so each op lives in its own .cpp file and is called
as torch.ops.specdec_fast.<name>. The files compile as UNITY_GROUPS translation units that
include them (unity builds: torch's headers are most of each file's compile time), so a name one
.cpp file defines at namespace scope must not clash with another's (a clash fails the build, and
the tests that need the C++ ops fail with it).

Why a child process: the compile goes through torch.utils.cpp_extension, which imports
setuptools, and setuptools' distutils shim fails in a process that imported pip (or
distutils) before it ("AssertionError: .../distutils/core.py"): the package then ran on the
torch reference at 109 tok/s instead of 696-925 on the demo pair. The child is a fresh
interpreter that only builds; the user's process only loads the finished library, so what
it imported before does not matter.

Cache: ~/.cache/specdec_fast/cpu_ops/<key>/ (root overridable with SPECDEC_FAST_CACHE), key =
hash of the sources, headers, flags, compiler, torch install and CPU flags. The finished
library is published there atomically (lib/<name>.so), so its presence means a complete
build. A file lock makes parallel processes build once; the others wait, then load.

Failure (no ninja, no compiler, a compile error, a library that does not load): one
RuntimeWarning per process saying what failed, what it costs and what to do, and
load_cpu_ops() returns False: the torch reference serves. SPECDEC_FAST_NO_CPP=1 skips the
C++ backend without a warning; SPECDEC_FAST_VERBOSE_BUILD=1 streams the compiler's output.

This file runs in two roles: imported as specdec_fast.kernels._cpp_build (the loader), and
executed by path in the child (the builder, main()). Its module-level imports are stdlib only.
"""
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import warnings
from functools import lru_cache
from pathlib import Path

CFLAGS = ["-O3", "-fopenmp", "-march=native", "-ffp-contract=off", "-std=c++17"]
LDFLAGS = ["-fopenmp"]
# Never wait forever under the lock (a cold build takes well under a minute: see UNITY_GROUPS).
BUILD_TIMEOUT_S = 1800
# Translation units of the build, each including every UNITY_GROUPS-th source (by name). Measured
# (g++ 12 -O3, a 2-core machine, torch 2.13, csrc/aten_lean.h's headers): each .cpp file apart took
# 15-21 s of g++, 121 s for the seven, ~12 s of each being torch's headers (<torch/library.h> alone
# 9 s); all seven as one unit 37 s. A cold build (load_cpu_ops, two units): 33 s of wall clock and
# 56 s of compiler time, against 90 s and 158 s as seven units with <ATen/ATen.h> before. Two
# rather than one: a machine with more cores builds them side by side.
UNITY_GROUPS = 2
# Measured on the demo pair, greedy, 96 new tokens: 109 tok/s on the reference vs 696-925 with
# the C++ ops (2 threads, issue 15); 26.5 vs 144 tok/s plain decoding (1 thread, loaded box);
# per kernel the reference is 5-230x slower (README's tables).
COST = ("CPU tensors will use the torch reference kernels instead: 5-230x slower per kernel, "
        "5-8x slower end to end on the demo pair")
SILENCE = "set SPECDEC_FAST_NO_CPP=1 to use the torch reference without this warning"


class CppBuildError(RuntimeError):
    """What failed and what to do about it (the text of the one warning)."""

    def __init__(self, what: str, fix: str):
        super().__init__(f"{what}; fix: {fix}")
        self.what, self.fix = what, fix


def csrc_dir() -> Path:
    """The C++ sources: csrc/ beside kernels/ in the source tree, and specdec_fast/csrc beside
    specdec_fast/kernels in an installed wheel (setup.py maps both folders the same way)."""
    return Path(__file__).resolve().parent.parent / "csrc"


def sources() -> list[Path]:
    return sorted(csrc_dir().glob("*.cpp"))


def _headers() -> list[Path]:
    return sorted(csrc_dir().glob("*.h"))


def compiler() -> str:
    """The compiler torch.utils.cpp_extension will call (it reads CXX, default c++)."""
    return os.environ.get("CXX", "c++")


def _cpu_tag() -> str:
    """What -march=native depends on: the machine and its CPU flags (part of the cache key, so a
    home folder shared by an AVX-512 and an AVX2 machine keeps one library for each)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return platform.machine() + flags


def cpu_isa() -> str:
    """The vector instruction set -march=native compiles the C++ ops for on this machine:
    "avx512" (AVX-512F), "avx2" (AVX2 + FMA) or "generic". The library reports the one it was
    built for (torch.ops.specdec_fast.skinny_linear_isa()); this is readable without building it,
    so routing constants (kernels/linear AUTO_ROWS) can be chosen at import time."""
    flags = set(_cpu_tag().split())
    if "avx512f" in flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "generic"


def build_key() -> str:
    """Hash of everything the library depends on: sources, headers, flags, compiler, torch install, CPU."""
    import torch

    h = hashlib.sha256()
    for src in sources() + _headers():
        h.update(src.name.encode() + src.read_bytes())
    h.update(" ".join(CFLAGS + LDFLAGS + [compiler()]).encode() + torch.__version__.encode() + _cpu_tag().encode())
    h.update(f"unity groups {UNITY_GROUPS}".encode())
    # The torch install (headers and libraries) is part of the build command that ninja records:
    # two environments sharing one build folder rebuilt it for each other.
    h.update(str(Path(torch.__file__).resolve().parent).encode() + sysconfig.get_paths()["include"].encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    root = os.environ.get("SPECDEC_FAST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specdec_fast")
    return Path(root) / "cpu_ops"


def library_path(key: str) -> Path:
    """Where the finished library of build ``key`` is published."""
    return cache_root() / key / "lib" / f"specdec_fast_cpu_{key}.so"


def _ninja_bin_dir() -> str | None:
    """The folder holding `ninja`: PATH, else the pip package's (an unactivated venv lacks it on PATH)."""
    found = shutil.which("ninja")
    if found:
        return str(Path(found).parent)
    try:
        import ninja
    except ImportError:
        return None
    return ninja.BIN_DIR


def _check_tools() -> dict:
    """The child's environment (ninja on PATH); raises CppBuildError when a tool is missing."""
    ninja_dir = _ninja_bin_dir()
    if ninja_dir is None:
        raise CppBuildError("ninja is not installed (torch.utils.cpp_extension needs it)", "pip install ninja")
    cxx = compiler()
    words = shlex.split(cxx) or ["c++"]
    if shutil.which(words[0]) is None:
        raise CppBuildError(f"no C++ compiler: {words[0]!r} (CXX, default c++) was not found",
                            "install one (Debian/Ubuntu: apt install g++; Fedora: dnf install gcc-c++), or set CXX")
    import torch

    # The child must build against this process's torch (the cache key names its install):
    # put the folder holding it first on the child's path, whatever this process's sys.path did.
    torch_home = str(Path(torch.__file__).resolve().parent.parent)
    python_path = os.pathsep.join(p for p in (torch_home, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PATH": ninja_dir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": python_path}


def _failure_excerpt(output: str, max_lines: int = 4, max_chars: int = 300) -> str:
    """The lines of a build log worth reading: the compiler's diagnostics ("...: error: ...",
    each once), else the last lines. ninja repeats each failed command line; those are skipped."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    diagnostics = list(dict.fromkeys(line for line in lines if re.search(r"(^|: )(fatal )?error: ", line)))
    chosen = (diagnostics or lines)[-max_lines:]
    return "\n".join(line if len(line) <= max_chars else line[:max_chars] + " ..." for line in chosen)


def _build_in_child(key: str, env: dict) -> None:
    """Compile in a fresh interpreter (this file's main()); raises CppBuildError with the log's gist."""
    build_dir = cache_root() / key
    spec = dict(name=f"specdec_fast_cpu_{key}", sources=[str(s) for s in sources()], headers=[str(h) for h in _headers()],
                build_dir=str(build_dir), output=str(library_path(key)), cflags=CFLAGS, ldflags=LDFLAGS,
                verbose=os.environ.get("SPECDEC_FAST_VERBOSE_BUILD") == "1")
    # torch's own lock file inside the build folder: left behind by a killed build, it makes every
    # later build wait forever. We hold our exclusive lock here, so no build is running.
    (build_dir / "lock").unlink(missing_ok=True)
    # Load this file by path (not `-m specdec_fast...`): the child imports neither the package nor
    # anything from the working directory, which is the build folder.
    code = ("import importlib.util as u, sys; s = u.spec_from_file_location('_specdec_fast_cpp_build', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); sys.exit(m.main(sys.argv[2]))")
    argv = [sys.executable, "-c", code, str(Path(__file__).resolve()), json.dumps(spec)]
    capture = not spec["verbose"]
    print("specdec_fast: compiling the C++ CPU kernels (once per machine and torch install: about half a minute) ...",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        run = subprocess.run(argv, cwd=build_dir, env=env, capture_output=capture, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CppBuildError(f"the build took over {BUILD_TIMEOUT_S} s and was stopped",
                            "rerun with SPECDEC_FAST_VERBOSE_BUILD=1 to watch it") from None
    log = (run.stdout or "") + (run.stderr or "")
    if capture:
        (build_dir / "build.log").write_text(log)
    if run.returncode != 0 or not library_path(key).is_file():
        where = f" (full log: {build_dir / 'build.log'})" if capture else ""
        raise CppBuildError(f"the build failed{where}:\n{_failure_excerpt(log)}",
                            "the build needs a C++17 compiler with OpenMP (g++ 9 or newer: apt install g++) and "
                            "ninja (pip install ninja); the log above names what failed")
    print(f"specdec_fast: C++ CPU kernels built in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


def build_and_load() -> Path:
    """Build (once per cache key) and load the C++ ops into torch.ops.specdec_fast; the library's
    path. Raises CppBuildError (what failed, what to do). load_cpu_ops is the callers' form; the
    CLI's `specdec-fast build-cpu` calls this one to print the reason as an error."""
    import torch

    if not sources():
        raise CppBuildError(f"this installation holds no C++ sources ({csrc_dir()} has no .cpp file)",
                            "reinstall specdec-fast from its wheel or its source tree")
    key = build_key()
    lib = library_path(key)
    if not lib.is_file():  # the common case skips the lock: the published library is complete
        lib.parent.mkdir(parents=True, exist_ok=True)
        with open(cache_root() / key / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not lib.is_file():  # another process may have built it while we waited
                    _build_in_child(key, _check_tools())
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        torch.ops.load_library(str(lib))
    except OSError as exc:
        raise CppBuildError(f"the built library {lib} did not load ({exc})",
                            f"delete {lib.parent.parent} to rebuild it") from None
    return lib


@lru_cache(maxsize=None)
def load_cpu_ops() -> bool:
    """Build (once per cache key) and load the C++ ops into torch.ops.specdec_fast. True when they
    are there; otherwise one warning per process says why (the torch reference serves)."""
    if os.environ.get("SPECDEC_FAST_NO_CPP") == "1" or not sources():
        return False
    try:
        build_and_load()
        return True
    except CppBuildError as exc:
        _warn(exc.what, exc.fix)
    except Exception as exc:  # noqa: BLE001 - anything else: still fall back, and say what it was
        _warn(f"{type(exc).__name__}: {exc}", "rerun with SPECDEC_FAST_VERBOSE_BUILD=1 to see the whole build")
    return False


def _warn(what: str, fix: str) -> None:
    """The one warning of a process (load_cpu_ops runs once): what failed, what it costs, what to do."""
    warnings.warn(f"specdec_fast: the C++ CPU backend is unavailable: {what}\n{COST}.\nTo fix: {fix}; or {SILENCE}.",
                  RuntimeWarning, stacklevel=3)


def _publish(built: str, output: Path) -> None:
    """Copy the library to ``output`` atomically: a reader sees no file or a complete one."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(f".tmp{os.getpid()}")
    shutil.copyfile(built, tmp)
    os.replace(tmp, output)


def _write_if_changed(target: Path, data: bytes) -> None:
    """Write only what differs, so that ninja's timestamps stay put."""
    if not target.exists() or target.read_bytes() != data:
        target.write_bytes(data)


def main(spec_json: str) -> int:
    """The child's entry: compile with torch.utils.cpp_extension (ninja), then publish the library."""
    spec = json.loads(spec_json)
    from torch.utils import cpp_extension

    build_dir = Path(spec["build_dir"])
    src_dir = build_dir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    # Build from a copy inside the content-addressed build folder, rewriting only what differs so
    # ninja's timestamps stay put: ninja records absolute source paths, and building from each
    # checkout's own csrc/ made two checkouts with identical sources rebuild each other (~60 s a time).
    copied = []
    for path in map(Path, spec["sources"] + spec["headers"]):
        _write_if_changed(src_dir / path.name, path.read_bytes())
        if path.suffix == ".cpp":
            copied.append(path.name)
    units = []
    for i in range(UNITY_GROUPS):
        group = copied[i::UNITY_GROUPS]
        if group:
            units.append(str(src_dir / f"_unity_{i}.cc"))  # .cc: never taken for a source of csrc/
            _write_if_changed(Path(units[-1]), "".join(f'#include "{name}"\n' for name in group).encode())
    try:
        built = cpp_extension.load(name=spec["name"], sources=units, extra_cflags=spec["cflags"],
                                   extra_ldflags=spec["ldflags"], build_directory=str(build_dir),
                                   is_python_module=False, verbose=spec["verbose"])
    except Exception as exc:  # noqa: BLE001 - the message (with ninja's output) is what the parent reports
        output = getattr(exc, "output", None)  # a failed compiler probe (CalledProcessError) keeps its output here
        if output:
            print(output.decode(errors="replace") if isinstance(output, bytes) else output, file=sys.stderr)
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    _publish(built, Path(spec["output"]))
    return 0
