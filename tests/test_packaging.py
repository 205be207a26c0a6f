"""The wheel: pure Python (py3-none-any), one import package, declares what the default path needs
(Requires-Dist), ships the demo pair with a tokenizer in each model directory, installs into a
clean venv and imports, and its C++ loader finds the sources it ships."""
import fcntl
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


STALE = REPO / "build" / "lib" / "specdec_fast" / "zz_deleted_from_the_source.py"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built once per worker. setuptools builds in the source tree (build/bdist.*): two pytest-xdist
    workers building at once collide there ('File exists: ...dist-info', seen on the 16-core GPU
    machine), so builds take turns under a file lock. Before building, a module that is no longer in
    the source is left in setuptools' staging folder (build/lib), as a deleted or renamed one is
    (test_wheel_holds_only_what_the_source_holds)."""
    out = tmp_path_factory.mktemp("dist")
    with open(Path(tempfile.gettempdir()) / "specdec_fast_wheel_build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        STALE.parent.mkdir(parents=True, exist_ok=True)
        STALE.write_text("X = 1\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO)],
            check=True,
        )
    (whl,) = out.glob("*.whl")
    return whl


def test_wheel_holds_only_what_the_source_holds(wheel):
    """Every file of the wheel's package has its source file (specdec_fast/kernels/ <- kernels/,
    specdec_fast/csrc/ <- csrc/): setuptools reuses build/lib between builds, and a module deleted from
    the source shipped in the next wheel built from the same tree (setup.py build_py_fresh)."""
    roots = {"specdec_fast/kernels/": REPO / "kernels", "specdec_fast/csrc/": REPO / "csrc", "specdec_fast/": REPO / "specdec_fast"}
    names = [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("specdec_fast/") and not n.endswith("/")]
    assert STALE.name not in {Path(n).name for n in names}
    for name in names:
        prefix = next(p for p in roots if name.startswith(p))
        assert (roots[prefix] / name[len(prefix):]).is_file(), name


def test_wheel_is_pure_python_with_one_import_package(wheel):
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top_level == {"specdec_fast"}, top_level  # never a top-level `kernels`
    assert "specdec_fast/kernels/__init__.py" in names
    assert "specdec_fast/kernels/verify/reference.py" in names
    assert any(n.startswith("specdec_fast/csrc/") and n.endswith(".cpp") for n in names) or not list((REPO / "csrc").glob("*.cpp"))
    assert not any(n.endswith((".so", ".pyd", ".o")) for n in names)  # nothing compiled at build time


def test_wheel_carries_the_license_it_declares(wheel):
    """Apache-2.0 (setup.py) asks that its text travel with the work: LICENSE in the dist-info."""
    archive = zipfile.ZipFile(wheel)
    (license_file,) = [n for n in archive.namelist() if ".dist-info/" in n and Path(n).name == "LICENSE"]
    text = archive.read(license_file).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "License :: OSI Approved :: Apache Software License" in archive.read(
        next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()


def _requires_dist(wheel: Path) -> list[str]:
    archive = zipfile.ZipFile(wheel)
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    lines = archive.read(metadata).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


def test_wheel_requires_what_the_default_path_needs(wheel):
    """ninja builds the C++ CPU backend on first use (without it: the torch reference, 5-8x slower
    end to end); transformers/tokenizers/safetensors serve generate(), the CLI and the demo."""
    requires = _requires_dist(wheel)
    core = {r.split(";")[0].replace(" ", "") for r in requires if "extra ==" not in r}
    names = {re.split(r"[<>=!~\[]", r)[0].lower() for r in core}
    assert names == {"torch", "numpy", "ninja", "transformers", "tokenizers", "safetensors"}, requires
    assert "torch>=2.6" in core and "transformers>=5.4" in core  # 4.x breaks output_scores, 5.0-5.3: setup.py
    extras = {r.split(";")[0].strip(): r.split("extra ==")[1].strip().strip("'\"") for r in requires if "extra ==" in r}
    from specdec_fast.kernels._backend import MIN_TRITON  # the floor the code enforces is the one declared

    assert extras == {f"triton>={MIN_TRITON[0]}.{MIN_TRITON[1]}": "triton"}, requires


def test_wheel_ships_the_pair_with_a_tokenizer_in_each_model_directory(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for model in ("target", "draft"):
        for file in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert f"specdec_fast/assets/pair/{model}/{file}" in names
    assert "specdec_fast/kernels/_cpp_build.py" in names


def test_wheel_installs_into_a_clean_venv_and_imports(wheel, tmp_path):
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # Without PYTHONPATH: a checkout tested with PYTHONPATH=<its root> (a worktree beside an editable
    # install) would have pip find the package there and the import take the source tree.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, env=env)
    # torch/numpy come from this environment's site-packages, appended after the fresh venv's own:
    # the package itself must resolve to the fresh install.
    fresh_site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True, text=True,
        env=env).stdout.strip()
    Path(fresh_site, "deps_from_dev_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = (
        "import specdec_fast, torch; from specdec_fast.kernels import chain_verify; "
        "import specdec_fast.csrc as c, pathlib; "
        "from specdec_fast.kernels import _cpp_build; "
        "print(specdec_fast.__file__); print(pathlib.Path(c.__file__).parent); "
        "assert _cpp_build.csrc_dir() == pathlib.Path(c.__file__).parent and _cpp_build.sources(); "
        "t = torch.randn(2, 3, 11); out = chain_verify(t, None, torch.zeros(2, 2, dtype=torch.long), backend='torch'); "
        "print(out[0].shape)"
    )
    result = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path, env=env)
    module_file, csrc_dir, shape = result.stdout.strip().splitlines()
    assert module_file.startswith(str(env_dir)), module_file
    assert Path(csrc_dir).is_dir()
    assert shape == "torch.Size([2, 3])"
