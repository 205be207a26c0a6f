"""tests/interpreter_speedup.py: helper calls skip Triton's re-patching only where the launch has
already patched the triton.language modules the helper sees; elsewhere Triton's own call runs.
Each case runs in a fresh interpreter: a re-patch by Triton's own call is never undone, so an
earlier test in the same process could leave tl.core patched and hide a wrong skip."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter only")

# A kernel that sees `tl`, calling a helper from a module that sees only triton.language.core: the
# launch patches tl, not tl.core, so the helper's call must patch (Triton's own way) or its tlc.*
# builtins run unpatched and raise.
HELPER = '''
import triton
from triton.language import core as tlc


@triton.jit
def twice_plus_index(x):
    return x * 2 + tlc.arange(0, 8)
'''
KERNEL = '''
import triton
import triton.language as tl
from helper_module import twice_plus_index


@triton.jit
def kernel(x_ptr, out_ptr):
    offs = tl.arange(0, 8)
    tl.store(out_ptr + offs, twice_plus_index(tl.load(x_ptr + offs)))
'''
RUN = '''
import sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from tests import interpreter_speedup
import triton
if triton.__version__ != "3.6.0" or not interpreter_speedup.install():
    print("NOT INSTALLED"); raise SystemExit
if sys.argv[3] == "skip-regardless":
    interpreter_speedup._patched_by_the_launch = lambda langs: True
import torch
import kernel_module
x, out = torch.arange(8, dtype=torch.float32), torch.zeros(8)
try:
    kernel_module.kernel[(1,)](x, out)
except Exception as error:
    print("RAISED", type(error).__name__); raise SystemExit
print("EQUAL" if torch.equal(out, x * 2 + torch.arange(8)) else "WRONG")
'''


def _run(tmp_path, how: str) -> str:
    (tmp_path / "helper_module.py").write_text(HELPER)
    (tmp_path / "kernel_module.py").write_text(KERNEL)
    done = subprocess.run([sys.executable, "-c", RUN, str(ROOT), str(tmp_path), how], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip().splitlines()[-1]
    if out == "NOT INSTALLED":
        pytest.skip("the replacement is checked against Triton 3.6.0's interpreter only")
    return out


def test_installed_in_this_suite():
    import triton
    from triton.runtime import interpreter

    if os.environ.get("SPECDEC_PLAIN_INTERPRETER") == "1":
        pytest.skip("turned off by SPECDEC_PLAIN_INTERPRETER=1")
    if triton.__version__ != "3.6.0":
        pytest.skip(f"checked against Triton 3.6.0's interpreter; this is {triton.__version__}")
    assert getattr(interpreter.InterpretedFunction.__call__, "specdec_skips_repatching", False)


def test_a_helper_seeing_an_unpatched_module_is_patched_triton_s_way(tmp_path):
    assert _run(tmp_path, "checked") == "EQUAL"


def test_control_skipping_regardless_breaks_that_helper(tmp_path):
    """The check is what keeps that helper right: skip every re-patch and its builtins fail."""
    assert _run(tmp_path, "skip-regardless").startswith("RAISED")


def test_the_dtype_cache_answers_what_triton_answers():
    """Every scalar, block and pointer type, asked twice (the second from the cache)."""
    import triton.language as tl
    from triton.runtime import interpreter

    cached = interpreter._get_np_dtype
    if not getattr(cached, "specdec_cached", False):
        pytest.skip("the cache is not installed here")
    original = cached.original
    scalars = [tl.int1, tl.float16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32,
               tl.uint32, tl.int64, tl.uint64, tl.bfloat16, tl.float8e5, tl.float8e4nv]
    types = scalars + [tl.pointer_type(t) for t in scalars] + [tl.block_type(t, [4, 2]) for t in scalars]
    types += [tl.block_type(tl.pointer_type(tl.float32), [8])]
    for _ in range(2):
        for tt in types:
            assert cached(tt) == original(tt), tt
