"""The README's examples stay true: each python block is run, and the kernels snippet's printed
output is compared with the output the README shows under it."""
import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _run(code: str, namespace: dict | None = None) -> str:
    """exec ``code`` in ``namespace`` (default: a fresh one) with this process's RNG state restored
    afterwards; its stdout."""
    out = io.StringIO()
    with torch.random.fork_rng(), contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), namespace if namespace is not None else {"__name__": "__readme__"})
    return out.getvalue()


def test_the_kernels_snippet_prints_what_the_readme_shows():
    section = _section("The kernels")
    (code,), (shown,) = _blocks(section, "python"), _blocks(section, "text")
    assert "print(" in code
    assert _run(code) == shown


@pytest.mark.slow  # 5-15 s (idle or busy 2-core box): loads the demo pair, chain, engine, tree, patched generate
def test_the_generating_examples_run():
    """The Generating section's blocks (chain, engine, tree), then the existing-code block, in one
    namespace, as a reader would paste them one after the other."""
    chain, engine, tree = _blocks(_section("Generating"), "python")
    (patched,) = _blocks(_section("Using it from existing code"), "python")
    namespace = {"__name__": "__readme__"}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        printed = _run(chain, namespace)
        printed_engine = _run(engine, namespace)
        printed_tree = _run(tree, namespace)
        printed_patched = _run(patched, namespace)
    finally:
        namespace["target"].__dict__.pop("generate", None)  # the patch, undone for later tests
        torch.set_num_threads(threads)
    assert printed.startswith("['def binary_search(a, x):")
    assert "predicted speedup" in printed and "alpha" in printed
    lines = printed_engine.splitlines()
    assert lines[0].startswith("0 ['def fib(n):") and lines[1].startswith("0 ['class Stack:")  # warmup captured them
    assert printed_tree.startswith("['def binary_search(a, x):")
    assert "alpha" in printed_patched


def test_the_command_line_stop_strings_are_what_bash_passes():
    """--stop takes its text literally: the README's `--stop "\\n\\n"` reached the CLI as a backslash and
    an n, twice, so the example never stopped at a blank line (it ran to --max-new-tokens). Each
    --stop argument in the Command line block, expanded by bash, holds no backslash."""
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    (block,) = _blocks(_section("Command line"), "bash")
    words = re.findall(r"--stop\s+(\$'[^']*'|\"[^\"]*\"|'[^']*'|\S+)", block)
    assert words, "the Command line block shows --stop"
    for word in words:
        passed = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True, check=True).stdout
        assert "\\" not in passed, (word, passed)
