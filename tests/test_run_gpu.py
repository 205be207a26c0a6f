"""bench/run_gpu.sh runs unattended on a lent GPU whose time is short: its stages must not fail on
arrival for a reason the CPU could have seen. --dry-run prints every part without a GPU; here each
part's script must exist and take every flag the stage gives it, and the deadline must behave."""
import ast
import re
import shlex
import sys
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("session", "tests", "limits", "levers", "kernels", "scale", "loop", "more", "trees", "heads", "gemv", "attention",
          "moe", "mla", "adaptive", "options", "ncu", "ncu_source")


def dry_run(stage: str, **env) -> str:
    done = subprocess.run(["bash", str(ROOT / "bench" / "run_gpu.sh"), "--dry-run", stage], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def python_parts(output: str) -> list[list[str]]:
    """Each `python3 bench/X.py ARGS` the stage would start or print (started or not)."""
    parts = []
    for line in output.splitlines():
        match = re.search(r"python3 (bench/\S+\.py.*)$", line)
        if match:
            parts.append(shlex.split(match.group(1)))
    return parts


def parser_sources(script: Path) -> str:
    """The script's text and that of the bench modules it imports from (a parser they share:
    verify_gpu_table.side_by_side_args, bench_args.mode_parser), and the modes its mode_parser calls
    make ("--gpu" for gpu=...)."""
    text = script.read_text()
    modes = [f'"--{keyword.arg}"' for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "mode_parser" for keyword in node.keywords]
    for name in re.findall(r"^from (\w+) import", text, re.M):
        module = script.parent / f"{name}.py"
        if module.exists():
            text += module.read_text()
    return text + "".join(modes)


@pytest.mark.parametrize("stage", STAGES)
def test_every_part_takes_its_flags(stage):
    parts = python_parts(dry_run(stage, DEADLINE_S="100000"))
    if stage != "tests":
        assert parts, f"stage {stage} printed no part"
    for script, *args in parts:
        source = parser_sources(ROOT / script)
        for flag in (a.split("=")[0] for a in args if a.startswith("--")):
            assert f'"{flag}"' in source, f"{script} has no {flag} (stage {stage})"


def test_the_session_keeps_its_deadline():
    """session: the suite capped at 330 s (on an H200: 301 s whole at ceaec11; cut at 315 s with
    2424 tests done at 5c2fdbc), then limits' parts until 560 s in the worst case (every part
    taking its whole cap): the first parts start, the rest are named NOT RUN, and a budget never
    exceeds what the part's cap leaves."""
    out = dry_run("session")
    assert "[cap 330 s, at 0 s] pytest tests" in out
    started = [line for line in out.splitlines() if line.startswith("+ [cap")]
    assert any("profile_step.py --quick --out" in line for line in started)
    assert "NOT RUN (deadline)" in out and "stage session done at 560 s" in out
    for line in started:
        cap, at = map(int, re.search(r"cap (\d+) s, at (\d+) s", line).groups())
        assert at + cap <= 560
        budget = re.search(r"--budget-s (\d+)", line)
        if budget:
            assert int(budget.group(1)) <= cap - 40


def test_limits_alone_starts_its_first_parts_and_the_report():
    out = dry_run("limits")
    started = "\n".join(line for line in out.splitlines() if line.startswith("+"))
    for part in ("profile_step.py --quick", "bench_verify.py --gpu --quick", "bench_attention.py --gpu --quick",
                 "bench_tree.py --kernels-only --quick", "issue25_report.py"):
        assert part in started, out


def test_an_unknown_stage_is_refused():
    done = subprocess.run(["bash", str(ROOT / "bench" / "run_gpu.sh"), "--dry-run", "nope"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "usage" in done.stdout


def test_the_ncu_stage_names_cases_that_exist():
    """`ncu` profiles bench/ncu_cases.py's cases by name: each name it passes is one of CASES (its
    import needs no GPU: the cases build their tensors only when called)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import ncu_cases

    for stage in ("ncu", "ncu_source"):
        named = [args[args.index("--case") + 1] for _, *args in python_parts(dry_run(stage, DEADLINE_S="100000"))]
        assert named and set(named) <= set(ncu_cases.CASES), (stage, named)


def test_a_gpu_machine_runs_the_gpu_tests_first(monkeypatch):
    """tests/conftest.py's collection hook on a GPU machine: the `gpu` tests first, the rest in
    their collection order (a stable sort), so that a device session's capped suite
    (stage_tests) reaches the tests only a GPU runs; `cpu_only` tests skipped there."""
    from types import SimpleNamespace

    from tests import conftest

    def item(name, *marks):
        return SimpleNamespace(name=name, keywords={name: 1, **{m: 1 for m in marks}}, markers=[],
                               add_marker=lambda marker, _n=name: added.append((_n, marker.kwargs["reason"])))

    added = []
    items = [item("a"), item("b", "gpu"), item("c", "cpu_only"), item("d"), item("e", "gpu")]
    monkeypatch.setattr(conftest, "HAS_CUDA", True)
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.name for i in items] == ["b", "e", "a", "c", "d"]
    assert added == [("c", "only meaningful where the test device is the CPU")]
    monkeypatch.setattr(conftest, "HAS_CUDA", False)  # a CPU machine: the order as collected
    added.clear()
    conftest.pytest_collection_modifyitems(None, items := [item("a"), item("b", "gpu"), item("c")])
    assert [i.name for i in items] == ["a", "b", "c"] and added == [("b", "needs a CUDA device")]


def test_catchup_runs_the_named_files_cuda_tests_then_the_verify_rows(tmp_path):
    """catchup (after sessions without a GPU): the CUDA tests (-k gpu / triton / cuda) of the files CATCHUP_TESTS
    names, capped at 290 s, then the verify's latency rows and the tree's kernels within the 560 s deadline;
    without CATCHUP_TESTS it stops at once, naming the variable."""
    files = tmp_path / "files.txt"
    files.write_text("tests/kernels/test_mla_attention.py\ntests/engine/test_mtp.py\n")
    out = dry_run("catchup", CATCHUP_TESTS=str(files))
    assert "[cap 290 s, at 0 s] pytest tests/kernels/test_mla_attention.py tests/engine/test_mtp.py -k gpu or triton" \
           " or cuda" in out
    assert "stage catchup done at 520 s" in out
    for script, *args in python_parts(out):
        source = parser_sources(ROOT / script)
        for flag in (a.split("=")[0] for a in args if a.startswith("--")):
            assert f'"{flag}"' in source, f"{script} has no {flag} (stage catchup)"
    done = subprocess.run(["bash", str(ROOT / "bench" / "run_gpu.sh"), "--dry-run", "catchup"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode != 0 and "CATCHUP_TESTS" in done.stderr
