"""A test that runs the Triton backend must build its tensors on the test device (tests/conftest.py: "cuda" on a GPU
machine, whose compiled kernels take no CPU tensors; the CPU with the interpreter elsewhere). CI has no GPU, so a test
that builds them on the CPU passes here and fails on the first GPU that runs it: an H200 run of 2026-11-30 found 43
such failures (bench/results/h200_2026-11-30). This reads every test file and names each test parametrised over a
backend list that holds "triton" (or kernel_backends()) that neither takes the ``device`` fixture nor reads the test
device from tests/kernels/backends.py (DEVICE / TEST_DEVICE): it names that run's three such tests (as they were at
ca9d900), not its other three causes -- a helper that moved nothing, a reference that closed over a CPU model, tests
that call a Triton kernel directly -- only the test that never asked where to build."""
import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _runs_triton(decorator) -> bool:
    """A pytest.mark.parametrize over a "backend" argument whose values hold "triton"."""
    if not (isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", None) == "parametrize"
            and len(decorator.args) > 1):
        return False
    names = decorator.args[0]
    if not (isinstance(names, ast.Constant) and isinstance(names.value, str) and "backend" in names.value):
        return False
    values = ast.unparse(decorator.args[1])
    excluded = "!= 'triton'" in values or '!= "triton"' in values
    return not excluded and ("'triton'" in values or '"triton"' in values or "kernel_backends" in values)


def offenders(root: Path = TESTS) -> list:
    found = []
    for path in sorted(root.rglob("test_*.py")):
        source = path.read_text()
        module_device = "DEVICE" in source  # the test device read at module level (tests/kernels/backends.py)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") \
                    and any(_runs_triton(d) for d in node.decorator_list) \
                    and "device" not in [a.arg for a in node.args.args] and not module_device:
                found.append(f"{path.relative_to(root.parent)}::{node.name}")
    return found


def test_every_triton_test_builds_on_the_test_device():
    assert offenders() == []


def test_control_a_test_without_the_device_is_named(tmp_path):
    (tmp_path / "test_example.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('backend', ['torch', 'triton'])\n"
        "def test_cpu_only(backend):\n    pass\n\n"
        "@pytest.mark.parametrize('backend', ['torch', 'triton'])\n"
        "def test_on_the_device(backend, device):\n    pass\n\n"
        "@pytest.mark.parametrize('backend', [b for b in ('torch', 'triton') if b != 'triton'])\n"
        "def test_without_triton(backend):\n    pass\n")
    assert offenders(tmp_path) == [f"{tmp_path.name}/test_example.py::test_cpu_only"]
