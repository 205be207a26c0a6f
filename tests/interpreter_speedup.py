"""Triton's interpreter without its redundant re-patching on every device-function call.

Triton 3.6's interpreter (triton/runtime/interpreter.py) patches triton.language once per
launch (GridExecutor.__call__: every builtin replaced by an interpreting wrapper, restored at the
launch's end), and then AGAIN on every call of a @triton.jit helper from inside the kernel
(InterpretedFunction.__call__ -> _patch_lang): inspect.getmembers over tl, tl.tensor and tl.math
each time. That second patch is never restored and, when the launch has already patched the
helper's triton.language modules, replaces each wrapper by an identical one. Our kernels call
helpers in their inner loops: cProfile of one interpreted chain_verify_triton call (B = 2, K = 2,
V = 600, top_p, 4 chunks: 4 launches, ~6.4 k helper calls) put 5.2 of its 12.9 profiled seconds
in _patch_builtin; skipping the redundant patches took the unprofiled call from 3.84 to 2.05 s,
bit for bit the same tokens.

install() makes a helper call skip _patch_lang exactly when every triton.language module its
globals see (the ones _patch_lang would patch: tl and tl.core) is already patched, told by
tl.program_id no longer being a builtin; otherwise it calls Triton's own method. It installs
only where InterpretedFunction.__call__ is the code it was checked against (the source below),
so another Triton version keeps its own behaviour. It also caches _get_np_dtype (below: that
verify call 1.87-2.04 -> 1.69-1.78 s more, same tokens); makes the types of tl.tuple and
block_type when first read and a tensor's shape constants once a shape (_install_lazy_types:
test_verify_finish_gather + test_verify_rungs_launch at -n 2, 93 -> 60 s); and does not build the
integer-overflow checks that the interpreter's device_assert drops
(_install_no_dropped_overflow_checks: an interpreted DFlash generate call 14.4 -> 8.3 profiled
seconds). Each piece installs only over the Triton source it was checked against. Tests only:
the package never patches Triton.
SPECDEC_PLAIN_INTERPRETER=1 turns it off (to compare)."""
import inspect
import os

# Triton 3.6.0's InterpretedFunction.__call__ body, the code this replacement was checked against.
_EXPECTED_CALL = """
        _patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise InterpreterError(repr(e)) from e
"""


def _normalised(source: str) -> str:
    return "\n".join(line.strip() for line in source.strip().splitlines() if line.strip())


def _patched_by_the_launch(langs) -> bool:
    """Whether the launch in progress has patched every module in langs (tl / tl.core)."""
    import triton.language as tl

    return bool(langs) and not any(tl.core.is_builtin(lang.program_id) for lang in langs)


def install() -> bool:
    """Replace InterpretedFunction.__call__ (see the module docstring); True when installed."""
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("SPECDEC_PLAIN_INTERPRETER") == "1":
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # no Triton here: nothing to speed up
        return False

    original = interpreter.InterpretedFunction.__call__
    if getattr(original, "specdec_skips_repatching", False):
        return True
    if not _normalised(_EXPECTED_CALL) in _normalised(inspect.getsource(original)):
        return False
    langs_of = {}  # helper function -> the triton.language modules its globals see

    def call(self, *args, **kwargs):
        langs = langs_of.get(self.fn)
        if langs is None:
            langs = langs_of[self.fn] = tuple(
                value for value in self.fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core))
        if not _patched_by_the_launch(langs):
            return original(self, *args, **kwargs)  # a module the launch did not patch: Triton's own way
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    call.specdec_skips_repatching = True
    interpreter.InterpretedFunction.__call__ = call
    _install_dtype_cache(interpreter, tl)
    _install_lazy_types(tl.core)
    _install_no_dropped_overflow_checks(interpreter)
    return True


def _install_dtype_cache(interpreter, tl) -> None:
    """_get_np_dtype (the numpy dtype of a Triton type) builds a 19-entry dict of Triton dtypes on
    every call: 42 k calls in that verify call, ~9% of its profile. Its result depends on a block
    type's element type alone, so it is cached by that (a type that cannot be hashed goes to the
    original)."""
    original = interpreter._get_np_dtype
    if getattr(original, "specdec_cached", False):
        return
    cache = {}

    def get_np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        try:
            return cache[key]
        except KeyError:
            cache[key] = result = original(key)
            return result
        except TypeError:
            return original(tt_dtype)

    get_np_dtype.specdec_cached, get_np_dtype.original = True, original
    interpreter._get_np_dtype = get_np_dtype


# Triton 3.6.0's tl.core.tuple.__init__ and block_type.__init__ bodies, the code the lighter
# versions below were checked against.
_EXPECTED_TUPLE_INIT = """
        self.values = [i for i in args]
        if isinstance(type, tuple_type):
            self.type = type
        elif type is not None:  # make_template in ASTFunction.deserialize may pass us a list/tuple
            self.type = tuple_type(type)
        else:
            self.type = _type_for_tuple_values(self.values)
"""
_EXPECTED_TENSOR_INIT = """
        super().__init__()
        # IR handle
        self.handle = handle
        # Block shape
        self.shape = type.shape if type.is_block() else ()
        self.numel = constexpr(math.prod(self.shape))
        self.type = type  # Tensor type (can be block_type)
        # Following the practice in pytorch, dtype is scalar type
        self.dtype = type.scalar
        self.shape = tuple([constexpr(s) for s in self.shape])
"""
_EXPECTED_BLOCK_TYPE_INIT = """
        self.element_ty = element_ty
        # Note that block_type's shape is a list of int
        # while tensor's shape is a list of constexpr.
        assert (isinstance(shape, (list, tuple)))
        # shape can be empty ([]) when an input is a 0D tensor.
        self.shape = tuple(_unwrap_shape(shape))
        if not self.shape:
            raise TypeError('0d block_type is forbidden')
        self.numel = validate_block_shape(self.shape)
        self.name = f'<{self.shape}, {self.element_ty}>'
"""


def _install_lazy_types(core) -> None:
    """Every interpreted operation builds a tensor (whose shape is a tl.tuple) and a block_type, and
    both build their type's name string at once: a tl.tuple's type (tuple_type, with a name joined
    from its values' types, 189 k of them in the verify call above) and a block_type's shape check
    and name; a tensor makes a constexpr of its numel and of each shape entry. Few read them: a
    tl.tuple's type is made from its values when first read, a block_type over a shape of plain ints
    reuses that shape's checked numel and makes its name when first read, and tensors of one shape
    share its constexprs (never changed once made). The values and names are the ones Triton's own
    code gives, read when asked. Measured: test_verify_finish_gather's top_p case (three statistics
    launches and a whole call, one thread, runs alternated) 15.3-16.1 s -> 12.2-13.0 s with the
    tuple and block types; that file and test_verify_rungs_launch at -n 2, 93 -> 60 s; the tensors'
    shared constants then took an interpreted DFlash generate call's tensor inits from 1.38 to
    0.65 profiled seconds."""
    import builtins
    import math

    tuple_init, block_init, tensor_init = core.tuple.__init__, core.block_type.__init__, core.tensor.__init__
    if getattr(tuple_init, "specdec_lazy", False):
        return
    if (_normalised(_EXPECTED_TUPLE_INIT) not in _normalised(inspect.getsource(tuple_init))
            or _normalised(_EXPECTED_BLOCK_TYPE_INIT) not in _normalised(inspect.getsource(block_init))
            or _normalised(_EXPECTED_TENSOR_INIT) not in _normalised(inspect.getsource(tensor_init))
            or core.base_value.__init__ is not object.__init__):
        return

    class TypeOfValues:
        """tl.tuple.type where __init__ was given none: made from the values when first read."""

        def __get__(self, obj, owner=None):
            if obj is None:
                return self
            obj.type = made = core._type_for_tuple_values(obj.values)  # an instance attribute from now on
            return made

    class NameOfBlockType:
        """block_type.name: Triton's string, made when first read."""

        def __get__(self, obj, owner=None):
            if obj is None:
                return self
            obj.name = made = f"<{obj.shape}, {obj.element_ty}>"
            return made

    def lazy_tuple_init(self, args, type=None):
        self.values = [i for i in args]
        if isinstance(type, core.tuple_type):
            self.type = type
        elif type is not None:
            self.type = core.tuple_type(type)

    numels = {}  # a checked shape of plain ints -> its numel

    def lazy_block_init(self, element_ty, shape):
        kind = builtins.type(shape)
        if kind is not list and kind is not core.tuple:
            return block_init(self, element_ty, shape)  # Triton's own assertion
        key = builtins.tuple(s.value if builtins.type(s) is core.constexpr else s
                             for s in (shape.values if kind is core.tuple else shape))
        if any(builtins.type(s) is not int for s in key):
            return block_init(self, element_ty, shape)  # Triton's own unwrapping, checks and errors
        numel = numels.get(key)
        if numel is None:
            if not key:
                raise TypeError("0d block_type is forbidden")
            numel = numels[key] = core.validate_block_shape(key)
        self.element_ty = element_ty
        self.shape = core.tuple(key)  # a tl.tuple, as Triton's (its == against a list is the values')
        self.numel = numel

    shape_constants = {(): (core.constexpr(1), [])}  # a shape of plain ints -> (numel, its entries) as constexprs

    def quick_tensor_init(self, handle, type):
        key = builtins.tuple(type.shape) if type.is_block() else ()
        if any(builtins.type(s) is not int for s in key):
            return tensor_init(self, handle, type)  # other entries: Triton's own path
        constants = shape_constants.get(key)
        if constants is None:
            constants = shape_constants[key] = (core.constexpr(math.prod(key)), [core.constexpr(s) for s in key])
        self.handle = handle
        self.numel = constants[0]  # constexprs are never changed after they are made: shared
        self.type = type
        self.dtype = type.scalar
        self.shape = core.tuple(constants[1])

    lazy_tuple_init.specdec_lazy = True
    lazy_tuple_init.original, lazy_block_init.original = tuple_init, block_init
    quick_tensor_init.original = tensor_init
    core.tuple.type = TypeOfValues()
    core.block_type.name = NameOfBlockType()
    core.tuple.__init__, core.block_type.__init__ = lazy_tuple_init, lazy_block_init
    core.tensor.__init__ = quick_tensor_init


# Triton 3.6.0's TritonSemantic.device_assert opening and binary_op_sanitize_overflow_impl's end: the
# check is built, then handed to device_assert, which drops it where options.debug is off.
_EXPECTED_DEVICE_ASSERT = """
        if not self.builder.options.debug:
            return
"""
_EXPECTED_SANITIZE_END = """
        cond = self.and_(self.less_equal(ret, max_value), self.greater_equal(ret, min_value))
        msg = f"int{lhs_sca_ty.int_bitwidth} overflow detected for operation {binary_op.__name__}"
        self.device_assert(cond, msg, None)
"""


def _install_no_dropped_overflow_checks(interpreter) -> None:
    """The interpreter's options sanitize integer overflow (InterpreterOptions.sanitize_overflow) and
    never debug (InterpreterOptions.debug is False, and nothing sets it): every int32 add, sub and
    mul then also casts both sides to int64, repeats the operation, compares it with the type's
    bounds (eight interpreted operations) and hands the result to device_assert, which returns at
    once without debug. Here that check is not built where device_assert would drop it (the
    interpreter's builder, debug off): 4.6 of 14.4 profiled seconds of an interpreted DFlash
    generate call. Nothing observable changes: the check's values were never read."""
    from triton.language.semantic import TritonSemantic

    original = TritonSemantic.binary_op_sanitize_overflow_impl
    if getattr(original, "specdec_skips_dropped_checks", False):
        return
    if (_normalised(_EXPECTED_DEVICE_ASSERT) not in _normalised(inspect.getsource(TritonSemantic.device_assert))
            or _normalised(_EXPECTED_SANITIZE_END) not in _normalised(inspect.getsource(original))):
        return
    builder_class = interpreter.InterpreterBuilder

    def sanitize_overflow(self, lhs, rhs, binary_op):
        if isinstance(self.builder, builder_class) and not self.builder.options.debug:
            return  # device_assert would drop the check
        return original(self, lhs, rhs, binary_op)

    sanitize_overflow.specdec_skips_dropped_checks, sanitize_overflow.original = True, original
    TritonSemantic.binary_op_sanitize_overflow_impl = sanitize_overflow
