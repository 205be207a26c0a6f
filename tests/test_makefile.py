"""The Makefile's venv recipe (`make -n`: printed, not run) on a CPU-only machine: PyTorch's CPU
index is added for the pinned torch exactly when pip cannot find that wheel offline (this
project's machines carry it; elsewhere PyPI alone cannot resolve requirements/dev-cpu.txt: its
torch is the CUDA build, which requires another triton than the pinned one)."""
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _fake_python(tmp_path: Path, wheel_is_local: bool) -> Path:
    """A python3 stand-in: no CUDA torch (`-c` fails); `pip install --dry-run` succeeds only when
    the wheel is 'local'; records the dry run's arguments."""
    script = tmp_path / "python3"
    script.write_text(f"""#!/bin/sh
case "$*" in
  *--dry-run*) echo "$@" > "{tmp_path}/dry_run_args"; exit {0 if wheel_is_local else 1} ;;
  *) exit 1 ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _venv_recipe(tmp_path: Path, wheel_is_local: bool) -> str:
    python = _fake_python(tmp_path, wheel_is_local)
    venv = tmp_path / "venv"
    done = subprocess.run(["make", "-n", "-B", f"{venv}/.specdec-installed", f"PYTHON={python}", f"VENV={venv}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("wheel_is_local", [True, False])
def test_the_cpu_index_only_where_the_pinned_wheel_is_not_local(tmp_path, wheel_is_local):
    recipe = _venv_recipe(tmp_path, wheel_is_local)
    install = next(line for line in recipe.splitlines() if "-r requirements/dev-cpu.txt" in line)
    assert (INDEX in install) is (not wheel_is_local), install
    pin = next(line for line in (REPO / "requirements/dev-cpu.txt").read_text().splitlines() if line.startswith("torch=="))
    dry_run = (tmp_path / "dry_run_args").read_text()
    assert "--no-index" in dry_run and pin in dry_run.split()  # checked offline, for the pinned version
