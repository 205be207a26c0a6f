"""`python -m tests.run_interpreted SCRIPT [ARGS...]`: run a script (a bench/ script's --smoke mode)
as its own process under the Triton interpreter with the tests' interpreter speedup installed
(tests/interpreter_speedup.py), as the suite's own process has it. Run from the repository root."""
import os
import runpy
import sys


def main() -> None:
    script, args = sys.argv[1], sys.argv[2:]
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
    from tests.interpreter_speedup import install

    install()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` puts the script's folder first
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
