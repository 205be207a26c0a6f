"""The C++ backend's loader (kernels/_cpp_build.py): it loads in any user process, and a
failure falls back to the torch reference with one warning that says what failed, what it
costs and what to do.

Each case runs in a fresh interpreter: what a process imported before (pip, setuptools,
distutils) is the point, and load_cpu_ops() runs once per process."""
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from specdec_fast.kernels import _cpp_build

from .backends import kernel_backends

needs_cpp = pytest.mark.skipif("cpp" not in kernel_backends(), reason="C++ backend not tested on this machine")


def _python(code: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a cold cache builds under the lock: minutes)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=timeout)


# Each case is a fresh interpreter importing torch and transformers: 2-3 s idle, 8 s on a loaded
# 2-core box. `import pip` (the reported failure) stays in the fast suite.
@needs_cpp
@pytest.mark.parametrize("prelude", ["import pip", pytest.param("import setuptools", marks=pytest.mark.slow),
                                     pytest.param("import distutils", marks=pytest.mark.slow)])
def test_cpp_ops_load_in_a_process_that_imported_packaging_tools_first(prelude):
    """`import pip` first made setuptools' distutils shim fail inside torch.utils.cpp_extension
    ("AssertionError: .../distutils/core.py"), and the package ran on the torch reference."""
    run = _python(f"""
        {prelude}
        import sys, warnings
        warnings.simplefilter("error", RuntimeWarning)  # a fallback warning fails the run
        import torch
        from specdec_fast.kernels import chain_verify
        from specdec_fast.kernels._backend import resolve_backend
        from specdec_fast.kernels._cpp_build import load_cpu_ops
        assert load_cpu_ops()
        assert resolve_backend(None, torch.device("cpu"), "chain_verify") == "cpp"
        logits = torch.randn(2, 3, 11)
        tokens, _ = chain_verify(logits, None, torch.zeros(2, 2, dtype=torch.long), backend="cpp")
        print(tokens.shape[1], "setuptools" in sys.modules)
    """)
    assert run.returncode == 0, run.stderr
    width, setuptools_loaded = run.stdout.split()
    assert width == "3"
    if prelude == "import pip":
        assert setuptools_loaded == "False"  # loading needs no setuptools in the user's process


def _fake_compiler(tmp_path) -> str:
    """A `c++` that answers torch's version probe (-v) like the real one and fails every compile
    with a recognisable error line, the way a broken toolchain or a compile error does."""
    path = tmp_path / "fake-c++"
    path.write_text('#!/bin/sh\ncase "$1" in -v|--version) exec c++ "$@";; esac\n'
                    "echo 'fake-c++: error: this compiler is broken on purpose' >&2\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.slow  # a child build that fails in ninja: 10-20 s on a 2-core box
def test_a_failed_build_warns_once_and_the_torch_reference_serves(tmp_path):
    run = _python("""
        import warnings
        import torch
        from specdec_fast.kernels import chain_verify, rms_norm
        from specdec_fast.kernels._backend import resolve_backend
        from specdec_fast.kernels._cpp_build import load_cpu_ops
        torch.manual_seed(0)
        logits, draft = torch.randn(2, 4, 11), torch.randint(0, 11, (2, 3))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = chain_verify(logits, None, draft, temperature=0.7, seed=3)  # backend=None
            rms_norm(torch.randn(3, 8), torch.ones(8), 1e-6)
            assert not load_cpu_ops()
            assert resolve_backend(None, torch.device("cpu"), "chain_verify") == "torch"
        ref = chain_verify(logits, None, draft, temperature=0.7, seed=3, backend="torch")
        assert all(torch.equal(a, b) for a, b in zip(out, ref))
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        print(len(messages))
        print(messages[0] if messages else "")
    """, env={"CXX": _fake_compiler(tmp_path), "SPECDEC_FAST_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr
    count, message = run.stdout.split("\n", 1)
    assert count == "1", run.stdout
    assert "the build failed" in message
    assert "fake-c++: error: this compiler is broken on purpose" in message  # what failed: the compiler's own line
    assert "build.log" in message
    assert "torch reference" in message and "slower" in message  # what it costs
    assert "pip install ninja" in message and "SPECDEC_FAST_NO_CPP=1" in message  # what to do
    assert len(message.splitlines()) <= 8, message


def _fresh_load(monkeypatch, tmp_path, **env):
    """load_cpu_ops without its per-process cache, against an empty cache folder."""
    monkeypatch.setenv("SPECDEC_FAST_CACHE", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.warns(RuntimeWarning) as caught:
        assert _cpp_build.load_cpu_ops.__wrapped__() is False
    assert len(caught) == 1
    return str(caught[0].message)


def test_a_missing_compiler_is_named_without_starting_a_build(monkeypatch, tmp_path):
    message = _fresh_load(monkeypatch, tmp_path, CXX="/nonexistent/bin/g++")
    assert "no C++ compiler: '/nonexistent/bin/g++'" in message
    assert "apt install g++" in message and "SPECDEC_FAST_NO_CPP=1" in message
    assert not list(tmp_path.rglob("build.log"))  # failed before any child process


def test_missing_ninja_says_pip_install_ninja(monkeypatch, tmp_path):
    monkeypatch.setattr(_cpp_build, "_ninja_bin_dir", lambda: None)
    message = _fresh_load(monkeypatch, tmp_path)
    assert "ninja is not installed" in message and "pip install ninja" in message


def test_no_cpp_env_skips_silently(monkeypatch, recwarn):
    monkeypatch.setenv("SPECDEC_FAST_NO_CPP", "1")
    assert _cpp_build.load_cpu_ops.__wrapped__() is False
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_failure_excerpt_keeps_the_error_lines_and_cuts_command_lines():
    log = "\n".join(["[1/3] c++ " + "-I/x " * 200, "FAILED: verify.o", "c++ " + "-O3 " * 200,
                     "verify.cpp:3:1: error: expected ';'", "ninja: build stopped: subcommand failed."])
    assert _cpp_build._failure_excerpt(log + "\n" + log) == "verify.cpp:3:1: error: expected ';'"  # once
    tail = _cpp_build._failure_excerpt("a\n" + "b" * 400)
    assert tail.splitlines() == ["a", "b" * 300 + " ..."]


def test_the_key_follows_the_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "g++")
    key = _cpp_build.build_key()
    monkeypatch.setenv("CXX", "clang++")
    assert _cpp_build.build_key() != key
    assert _cpp_build.library_path(key).parent.parent.name == key


def test_the_key_follows_every_header(monkeypatch, tmp_path):
    """A change to any csrc header (penalties.h, included by standardise.h) is a new build key,
    so the next load_cpu_ops() compiles instead of loading a library built without it."""
    import shutil

    copy = tmp_path / "csrc"
    shutil.copytree(_cpp_build.csrc_dir(), copy)
    monkeypatch.setattr(_cpp_build, "csrc_dir", lambda: copy)
    key = _cpp_build.build_key()
    assert {"penalties.h", "standardise.h", "token_pass.h"} <= {p.name for p in _cpp_build._headers()}
    (copy / "penalties.h").write_text((copy / "penalties.h").read_text() + "\n// changed\n")
    assert _cpp_build.build_key() != key


def test_sources_are_found_beside_the_kernels_folder():
    names = {p.name for p in _cpp_build.sources()}
    assert {"verify.cpp", "paged_attention.cpp", "skinny_linear.cpp"} <= names


def test_the_key_follows_the_unity_groups(monkeypatch):
    """Another grouping of the sources into translation units is another build."""
    key = _cpp_build.build_key()
    monkeypatch.setattr(_cpp_build, "UNITY_GROUPS", _cpp_build.UNITY_GROUPS + 1)
    assert _cpp_build.build_key() != key


def test_no_source_includes_all_of_aten():
    """csrc includes aten_lean.h, not <ATen/ATen.h> / <torch/extension.h> / <torch/torch.h>: those
    parse every operator's declaration (16.0 s of g++ a unit against 11.6, aten_lean.h's note).
    aten_lean.h's TORCH_ASSERT_ONLY_METHOD_OPERATORS catches such an include only after it."""
    import re

    heavy = re.compile(r'#\s*include\s*[<"](ATen/ATen\.h|ATen/Functions\.h|torch/extension\.h|torch/torch\.h)[>"]')
    files = _cpp_build.sources() + _cpp_build._headers()
    found = [f"{path.name}: {m.group(0)}" for path in files for m in heavy.finditer(path.read_text())]
    assert not found, f"include csrc/aten_lean.h (and the op's <ATen/ops/NAME.h> there) instead: {found}"
    for path in _cpp_build.sources():
        assert '#include "aten_lean.h"' in path.read_text(), f"{path.name} does not include aten_lean.h"


@needs_cpp
def test_the_build_command_names_the_library_and_its_vector_paths(capsys):
    """`specdec-fast build-cpu` (a container's build step): the library this process loads, and the
    width it was built for."""
    from specdec_fast import cli

    assert cli.main(["build-cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    library = _cpp_build.library_path(_cpp_build.build_key())
    assert out[0] == f"the C++ CPU kernels were built before: {library}" or (
        out[0].startswith("the C++ CPU kernels built in ") and out[0].endswith(f" s: {library}"))
    assert library.is_file()
    lanes = {"avx512": 16, "avx2": 8, "generic": 4}[_cpp_build.cpu_isa()]
    assert out[1] == f"vector paths: {_cpp_build.cpu_isa()} (paged attention in {lanes} float lanes)"


def test_the_build_command_says_what_failed_and_what_to_install(monkeypatch, tmp_path, capsys):
    from specdec_fast import cli

    monkeypatch.setenv("SPECDEC_FAST_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/bin/g++")
    monkeypatch.delenv("SPECDEC_FAST_NO_CPP", raising=False)
    assert cli.main(["build-cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("specdec-fast: error: the C++ CPU kernels did not build: no C++ compiler: '/nonexistent/bin/g++'")
    assert "to fix: install one (Debian/Ubuntu: apt install g++" in err and "torch reference" in err
    assert not list(tmp_path.rglob("build.log"))  # failed before any child process
    monkeypatch.setenv("SPECDEC_FAST_NO_CPP", "1")
    assert cli.main(["build-cpu"]) == 2
    assert "SPECDEC_FAST_NO_CPP=1 turns the C++ CPU backend off" in capsys.readouterr().err
