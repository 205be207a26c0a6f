"""The source layout's two rules, checked on the source text (no imports run):

- one import style: inside the package (specdec_fast/ and kernels/, which setup.py installs
  as specdec_fast.kernels) modules import each other relatively, never as `specdec_fast.x`;
- kernels/ is a lower layer: its relative imports never climb out of kernels/ (no model, no
  engine, no loader from specdec_fast above it)."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_FILES = sorted((REPO / "specdec_fast").rglob("*.py")) + sorted((REPO / "kernels").rglob("*.py"))


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            yield node.lineno, node.level, node.module or ""
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, 0, alias.name


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_package_imports_itself_relatively(path):
    absolute = [f"line {line}: {module}" for line, level, module in _imports(path)
                if level == 0 and module.split(".")[0] in ("specdec_fast", "kernels")]
    assert not absolute, f"use a relative import: {absolute}"


@pytest.mark.parametrize("path", sorted((REPO / "kernels").rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_kernels_import_nothing_above_kernels(path):
    depth = len(path.relative_to(REPO / "kernels").parts) - 1  # packages between the file and kernels/
    escaping = [f"line {line}: {'.' * level}{module}" for line, level, module in _imports(path) if level - 1 > depth]
    assert not escaping, f"kernels/ is a lower layer; these imports reach specdec_fast above it: {escaping}"
