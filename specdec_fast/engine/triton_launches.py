"""TritonLaunches: every Triton kernel launch of a block of code, with the specialisation key
Triton compiles it under, so a step can be checked for graph safety on any machine.

Triton compiles one variant of a kernel per specialisation key: the dtype of each tensor and
whether its address is 16-byte aligned, each int argument's type (i32 / i64 / u64 by value)
and whether it is 1 (then a constexpr) or a multiple of 16, the constexpr values and the launch
options. A launch whose key was never seen compiles (and loads a module) at that moment: inside
a CUDA-graph capture that invalidates the capture. The key is computed here exactly as the
installed triton's JITFunction.run does (3.4 to 3.6; runtime/jit.py: create_function_from_signature,
the backend's specialisation rules, compute_cache_key or its inline form), also for the interpreter's
InterpretedFunction (TRITON_INTERPRET=1), which compiles nothing but is launched the same way
(``kernel[grid](...)`` -> ``run``): so the CPU twin of a graph sees the keys a GPU would compile.

While a TritonLaunches is active, JITFunction.run and InterpretedFunction.run are wrapped (on the
classes, restored on exit). ``expected``: a set of (kernel, key) that may be launched; any other
launch raises UncompiledLaunchError before it runs, naming the kernel and the arguments whose
specialisation differs from the closest expected launch of the same kernel.
"""
import functools
import inspect
from typing import NamedTuple

import torch


class UncompiledLaunchError(RuntimeError):
    """A launch with a specialisation key that the warm-up did not launch (a compile at capture)."""


class Launch(NamedTuple):
    kernel: str  # module.qualname of the @triton.jit function
    key: str  # triton's cache key: specialisation of every argument + launch options
    names: tuple  # parameter names, in order
    specialization: tuple  # per parameter: (type, attribute) as triton computes it
    values: tuple  # per parameter: the Python scalar passed, or a short description of a tensor
    grid: tuple

    def scalars(self) -> tuple:
        """(name, value) of the non-tensor arguments: what a graph replay repeats as captured."""
        return tuple((n, v) for n, v in zip(self.names, self.values) if not isinstance(v, TensorArg))


class TensorArg(NamedTuple):
    dtype: torch.dtype
    shape: tuple


def _kernel_name(fn) -> str:
    inner = getattr(fn, "fn", fn)
    return f"{inner.__module__}.{inner.__qualname__}"


class _Binders:
    """Triton's own argument binder per kernel (its specialisation code), built once."""

    def __init__(self):
        self.cache = {}

    def __call__(self, fn):
        binder = self.cache.get(id(fn))
        if binder is None:
            from triton.backends.compiler import BaseBackend
            from triton.runtime.jit import KernelParam, create_function_from_signature

            params = getattr(fn, "params", None)
            signature = getattr(fn, "signature", None)
            if params is None:  # InterpretedFunction: the decorator's options are in fn.kwargs
                signature = inspect.signature(fn.fn)
                options = getattr(fn, "kwargs", None)  # triton 3.6; 3.4 keeps them on its rewriter
                options = options if options is not None else getattr(getattr(fn, "rewriter", None), "kwargs", {})
                dns = options.get("do_not_specialize") or ()
                dns_oa = options.get("do_not_specialize_on_alignment") or ()
                params = [KernelParam(i, p, i in dns or p.name in dns, i in dns_oa or p.name in dns_oa)
                          for i, p in enumerate(signature.parameters.values())]
            # The NVIDIA backend keeps BaseBackend's int / pointer rules (triton 3.6).
            binder = (create_function_from_signature(signature, params, BaseBackend), tuple(p.name for p in params))
            self.cache[id(fn)] = (binder, fn)
        return self.cache[id(fn)][0]


_BINDERS = _Binders()
_ACTIVE: list = []
_RESTORE: list = []  # the hook_launches undo of the active TritonLaunches


def _describe(value):
    if isinstance(value, torch.Tensor):
        return TensorArg(value.dtype, tuple(value.shape))
    return value


@functools.cache
def _key_function():
    """Triton's kernel cache key as a function of (specialization, options): compute_cache_key
    (triton >= 3.5; 3.6 hashes the JIT callables among the constexprs), else what
    JITFunction.run computes inline (3.4)."""
    try:
        from triton.runtime.jit import compute_cache_key
    except ImportError:
        return lambda specialization, options: str(specialization) + str(options)
    return lambda specialization, options: compute_cache_key({}, specialization, options)


def _cache_key(specialization, options) -> str:
    return _key_function()(specialization, options)


def launch_of(fn, args, kwargs, grid) -> Launch:
    """The Launch that ``fn[grid](*args, **kwargs)`` makes (no side effect)."""
    binder, names = _BINDERS(fn)
    bound, specialization, options = binder(*args, **kwargs)
    key = _cache_key(specialization, options)
    values = tuple(_describe(bound[name]) for name in names)
    grid = tuple(grid) if isinstance(grid, (tuple, list)) else (repr(grid),)
    return Launch(_kernel_name(fn), key, names, tuple(tuple(s) if isinstance(s, list) else s for s in specialization),
                  values, grid)


def _spec_text(spec) -> str:
    kind, attr = spec[0], spec[1] if len(spec) > 1 else None
    if kind == "constexpr":
        return f"constexpr {attr!r}"
    if attr == "D":
        return f"{kind} {'16-byte aligned' if kind.startswith('*') else 'divisible by 16'}"
    return kind


def explain_new_key(launch: Launch, known: list) -> str:
    """Which arguments of ``launch`` are specialised differently from the closest known launch of
    the same kernel (or that the kernel was never launched)."""
    same = [k for k in known if k.kernel == launch.kernel]
    if not same:
        return f"{launch.kernel} was not launched at all before"
    closest = min(same, key=lambda k: sum(a != b for a, b in zip(k.specialization, launch.specialization)))
    diffs = [f"{name} = {value!r} ({_spec_text(new)}; before: {_spec_text(old)}, value {old_value!r})"
             for name, value, new, old, old_value in zip(launch.names, launch.values, launch.specialization,
                                                        closest.specialization, closest.values) if new != old]
    if not diffs:
        return f"{launch.kernel}: same arguments, different launch options"
    return f"{launch.kernel}: " + "; ".join(diffs)


class TritonLaunches:
    """Context manager: ``launches`` lists every Triton launch inside it (see the module doc)."""

    def __init__(self, expected: set | None = None, known: list | None = None):
        self.expected, self.known = expected, known or []
        self.launches: list[Launch] = []

    def __enter__(self):
        if not _ACTIVE:
            _install()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        if not _ACTIVE:
            _uninstall()

    def _record(self, fn, args, kwargs, grid) -> None:
        launch = launch_of(fn, args, kwargs, grid)
        self.launches.append(launch)
        if self.expected is not None and (launch.kernel, launch.key) not in self.expected:
            raise UncompiledLaunchError(
                f"Triton launch with a specialisation the warm-up did not launch (it would compile now, and a compile "
                f"inside a CUDA-graph capture invalidates the capture): {explain_new_key(launch, self.known)}")


def _classes() -> tuple:
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:  # no triton: nothing to record
        return ()
    return JITFunction, InterpretedFunction


def hook_launches(around):
    """Routes every Triton launch through ``around(kernel, args, kwargs, grid, warmup, launch)``,
    which returns the launch's result (``launch()`` runs it): on JITFunction.run and
    InterpretedFunction.run, or, where the interpreter makes its run per instance (triton < 3.6),
    on InterpretedFunction.__getitem__ (``kernel[grid]`` returns the launcher; warmup False).
    Returns the function that puts the originals back. The one hook of TritonLaunches and of
    bench/launch_count's counters."""
    saved = []
    for cls in _classes():
        if "run" in cls.__dict__:
            original = cls.__dict__["run"]

            def run(self, *args, grid, warmup, _original=original, **kwargs):
                return around(self, args, kwargs, grid, warmup,
                              lambda: _original(self, *args, grid=grid, warmup=warmup, **kwargs))

            saved.append((cls, "run", original))
            cls.run = run
        else:
            original = cls.__dict__["__getitem__"]

            def getitem(self, grid, _original=original):
                launcher = _original(self, grid)
                return lambda *args, **kwargs: around(self, args, kwargs, grid, False,
                                                      lambda: launcher(*args, **kwargs))

            saved.append((cls, "__getitem__", original))
            cls.__getitem__ = getitem

    def restore() -> None:
        for cls, name, original in reversed(saved):
            setattr(cls, name, original)

    return restore


def _record_active(kernel, args, kwargs, grid, warmup, launch):
    if _ACTIVE and not warmup:
        _ACTIVE[-1]._record(kernel, args, kwargs, grid)
    return launch()


def _install() -> None:
    _RESTORE.append(hook_launches(_record_active))


def _uninstall() -> None:
    _RESTORE.pop()()
