"""The wheel: pure Python (py3-none-any), one import package, installs into a clean venv and imports."""
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO)],
        check=True,
    )
    (whl,) = out.glob("*.whl")
    return whl


def test_wheel_is_pure_python_with_one_import_package(wheel):
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top_level == {"specdec_fast"}, top_level  # never a top-level `kernels`
    assert "specdec_fast/kernels/__init__.py" in names
    assert "specdec_fast/kernels/verify/reference.py" in names
    assert any(n.startswith("specdec_fast/csrc/") and n.endswith(".cpp") for n in names) or not list((REPO / "csrc").glob("*.cpp"))
    assert not any(n.endswith((".so", ".pyd", ".o")) for n in names)  # nothing compiled at build time


def test_wheel_installs_into_a_clean_venv_and_imports(wheel, tmp_path):
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # torch/numpy come from this environment's site-packages, appended after the fresh venv's own:
    # the package itself must resolve to the fresh install.
    fresh_site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True, text=True
    ).stdout.strip()
    Path(fresh_site, "deps_from_dev_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = (
        "import specdec_fast, torch; from specdec_fast.kernels import chain_verify; "
        "import specdec_fast.csrc as c, pathlib; "
        "print(specdec_fast.__file__); print(pathlib.Path(c.__file__).parent); "
        "t = torch.randn(2, 3, 11); out = chain_verify(t, None, torch.zeros(2, 2, dtype=torch.long), backend='torch'); "
        "print(out[0].shape)"
    )
    result = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path)
    module_file, csrc_dir, shape = result.stdout.strip().splitlines()
    assert module_file.startswith(str(env_dir)), module_file
    assert Path(csrc_dir).is_dir()
    assert shape == "torch.Size([2, 3])"
