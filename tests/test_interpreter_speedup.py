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


def _lazy_inits():
    from triton.language import core

    if not getattr(core.tuple.__init__, "specdec_lazy", False):
        pytest.skip("the lazy types are not installed here")
    return core, core.tuple.__init__.original, core.block_type.__init__.original


def _triton_s(cls, init, *args):
    """An object built by Triton's own __init__ (no lazy attribute left to read)."""
    obj = object.__new__(cls)
    init(obj, *args)
    return obj


def test_lazy_tuple_types_are_triton_s():
    """A tl.tuple's type read later is the one Triton builds at once: values of every kind, a
    given type, a type given as a list, and a tuple changed by _setitem before its type is read."""
    core, tuple_init, _ = _lazy_inits()
    import triton.language as tl

    tensor = tl.core.tensor(None, tl.block_type(tl.float32, [4, 8]))
    cases = [([1, 2.5, tl.float16], None), ([core.constexpr(3), tensor], None), ([], None),
             ([core.constexpr(4)], core.tuple_type([core.constexpr_type(4)], ["x"])),
             ([1, 2], [core.constexpr_type(1), core.constexpr_type(2)])]
    for values, given in cases:
        lazy, own = core.tuple(values, given), _triton_s(core.tuple, tuple_init, values, given)
        assert lazy.type == own.type and lazy.type.name == own.type.name and lazy.type.fields == own.type.fields
        assert "type" in lazy.__dict__  # read once, kept
    lazy, own = core.tuple([1, 2]), _triton_s(core.tuple, tuple_init, [1, 2])
    lazy._setitem(1, tl.int32)
    own._setitem(1, tl.int32)
    assert lazy.type == own.type and lazy.type.name == own.type.name


def test_lazy_block_types_are_triton_s():
    """Shape, numel, name and equality of block types over lists and tl.tuples of ints and
    constexprs; every rejected shape rejected with Triton's error."""
    core, _, block_init = _lazy_inits()
    import triton.language as tl

    shapes = [[8], [1, 16], [4, 2, 2], core.tuple([core.constexpr(2), core.constexpr(32)]), core.tuple([64]),
              [core.constexpr(8), 4]]
    for element in (tl.float32, tl.int1, tl.pointer_type(tl.bfloat16)):
        for shape in shapes:
            lazy, own = tl.block_type(element, shape), _triton_s(core.block_type, block_init, element, shape)
            assert isinstance(lazy.shape, core.tuple) and lazy.shape.values == own.shape.values
            assert lazy.shape == [int(s) for s in own.shape]  # the comparison broadcast_impl_value makes
            assert lazy.numel == own.numel and lazy.name == own.name and str(lazy) == str(own)
            assert lazy == own and lazy.is_block() and lazy.scalar == own.scalar
    for bad in ([], [3], [8, 6], [2.0], (4,), [core.constexpr(12)], [1 << 21, 1 << 10]):
        with pytest.raises(Exception) as lazy_error:
            tl.block_type(tl.float32, bad)
        with pytest.raises(Exception) as own_error:
            _triton_s(core.block_type, block_init, tl.float32, bad)
        assert type(lazy_error.value) is type(own_error.value) and str(lazy_error.value) == str(own_error.value), bad


def _overflow_check_skipper():
    """The installed binary_op_sanitize_overflow_impl (its .original is Triton's), else skip."""
    from triton.language.semantic import TritonSemantic

    skipping = TritonSemantic.binary_op_sanitize_overflow_impl
    if not getattr(skipping, "specdec_skips_dropped_checks", False):
        pytest.skip("not installed here")
    return skipping


def _overflowing_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def wrap(x_ptr, out_ptr):
        offs = tl.arange(0, 8)
        x = tl.load(x_ptr + offs)
        tl.store(out_ptr + offs, x * 3 + x - 7)  # int32 mul and add past 2**31 in some lanes

    return wrap


def test_the_dropped_overflow_check_changes_nothing(monkeypatch):
    """An int32 kernel overflowing in some lanes gives the same wrapped values with and without the
    check (Triton's own interpreter builds it and device_assert drops it: debug is off)."""
    import torch
    from triton.language.semantic import TritonSemantic

    skipping = _overflow_check_skipper()
    kernel = _overflowing_kernel()
    x = torch.tensor([0, 1, -5, 2**30, 2**31 - 1, -2**31, 123456789, 715827883], dtype=torch.int32)
    fast = torch.zeros_like(x)
    kernel[(1,)](x, fast)
    monkeypatch.setattr(TritonSemantic, "binary_op_sanitize_overflow_impl", skipping.original)
    own = torch.zeros_like(x)
    kernel[(1,)](x, own)
    assert torch.equal(fast, own)
    assert torch.equal(fast, (x.long() * 4 - 7).to(torch.int32))  # two's complement wrap (x*3+x = x*4)


def test_with_debug_on_the_overflow_check_runs_and_fires():
    """The replacement steps aside where device_assert would keep the check: a builder with debug
    on gets Triton's own check, which raises on the overflowing lanes (and passes on others)."""
    import numpy as np
    import triton.language as tl
    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter

    _overflow_check_skipper()
    builder = interpreter.InterpreterBuilder()
    builder.options = interpreter.InterpreterOptions(debug=True)
    semantic = TritonSemantic(builder)

    def int32(values):
        data = np.array(values, dtype=np.int32)
        return tl.core.tensor(interpreter.TensorHandle(data, tl.int32), tl.block_type(tl.int32, [len(values)]))

    semantic.binary_op_sanitize_overflow_impl(int32([1, 2]), int32([3, 4]), semantic.add)  # in range: no error
    with pytest.raises(AssertionError, match="int32 overflow detected for operation add"):
        semantic.binary_op_sanitize_overflow_impl(int32([1, 2**31 - 1]), int32([3, 4]), semantic.add)


def test_quick_tensors_are_triton_s():
    """handle, type, dtype, shape (a tl.tuple of constexprs) and numel of tensors over block types
    of every kind of shape and over scalar types, as Triton's own __init__ makes them."""
    core, _, _ = _lazy_inits()  # installed with the lazy types
    import triton.language as tl

    types = [tl.float32, tl.int1, tl.pointer_type(tl.int64), tl.block_type(tl.float32, [8]),
             tl.block_type(tl.int32, [2, 16]), tl.block_type(tl.bfloat16, core.tuple([core.constexpr(4), 1]))]
    for _ in range(2):  # the second time from the cache
        for ty in types:
            quick, own = core.tensor("h", ty), _triton_s(core.tensor, core.tensor.__init__.original, "h", ty)
            assert quick.handle == own.handle and quick.type is own.type and quick.dtype == own.dtype
            assert isinstance(quick.shape, core.tuple) and quick.shape == own.shape
            assert [type(s) for s in quick.shape] == [type(s) for s in own.shape] == [core.constexpr] * len(own.shape)
            assert isinstance(quick.numel, core.constexpr) and quick.numel.value == own.numel.value
            assert str(quick) == str(own) and quick.shape.type.name == own.shape.type.name
