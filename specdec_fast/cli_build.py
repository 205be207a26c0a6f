"""`specdec-fast build-cpu`: compile the C++ CPU kernels now (kernels/_cpp_build.py), e.g. as a
container image's build step after `pip install`, so that no process pays for the compile at its
first call on CPU tensors. Prints where the library is and the vector paths it was built for.

Exit status: 0 when the library is there (built now or before); 1 when the build failed (what
failed, as load_cpu_ops' one warning says it: the compiler's error lines or the missing tool, and
what to install); 2 when SPECDEC_FAST_NO_CPP=1 turns the backend off."""
import os
import sys
import time

HELP = "compile the C++ CPU kernels now (a container's build step), not at the first call"


def add_build_parser(sub) -> None:
    sub.add_parser("build-cpu", help=HELP, description=HELP)


def run_build_cpu() -> int:
    from .kernels import _cpp_build

    if os.environ.get("SPECDEC_FAST_NO_CPP") == "1":
        print("specdec-fast: error: SPECDEC_FAST_NO_CPP=1 turns the C++ CPU backend off; unset it to build",
              file=sys.stderr)
        return 2
    built_before = _cpp_build.library_path(_cpp_build.build_key()).is_file()
    start = time.perf_counter()
    try:
        library = _cpp_build.build_and_load()
    except _cpp_build.CppBuildError as exc:
        print(f"specdec-fast: error: the C++ CPU kernels did not build: {exc.what}\nto fix: {exc.fix}\n"
              f"until then {_cpp_build.COST}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - e.g. a cache folder it may not write: one line, not a traceback
        print(f"specdec-fast: error: the C++ CPU kernels did not build: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    import torch

    ops = torch.ops.specdec_fast
    when = "were built before" if built_before else f"built in {time.perf_counter() - start:.0f} s"
    print(f"the C++ CPU kernels {when}: {library}")
    print(f"vector paths: {ops.skinny_linear_isa()} (paged attention in {ops.paged_attention_lanes()} float lanes)")
    return 0
