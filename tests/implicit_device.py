"""ImplicitDeviceFactories: catches tensors created without an explicit device (the class of the
H100 bug where philox turned its int arguments into CPU tensors next to CUDA seeds).

On a CPU-only machine every device-less factory call lands on the CPU, where the inputs already
are, so the bug is invisible. This TorchFunctionMode records every torch factory call
(torch.utils._device._device_constructors: empty, full, zeros, arange, tensor, as_tensor, ...)
made with no ``device=`` (or device=None) from code under the given roots (the package): the
call site is the first stack frame outside torch. Calls from elsewhere (the Triton interpreter's
internals, torch's own Python code) are not ours and are ignored; as_tensor / tensor / asarray of a
tensor keep that tensor's device and are not flagged. The C++ ops create their outputs from
their inputs' options and never pass through Python factories.
"""
import os
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

_TORCH_DIR = os.path.dirname(torch.__file__)
_KEEPS_INPUT_DEVICE = {torch.tensor, torch.as_tensor, torch.asarray}


def package_roots() -> tuple:
    """The source folders of specdec_fast and of its kernels (mapped to specdec_fast.kernels)."""
    import specdec_fast
    import specdec_fast.kernels

    return (os.path.dirname(specdec_fast.__file__), os.path.dirname(specdec_fast.kernels.__file__))


class ImplicitDeviceFactories(TorchFunctionMode):
    """Inside it, ``calls`` lists (factory name, "file:line") for each device-less factory call
    made from code under ``roots``."""

    def __init__(self, roots=None):
        super().__init__()
        self.roots = tuple(os.path.abspath(r) + os.sep for r in (roots or package_roots()))
        self.factories = _device_constructors()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.factories and kwargs.get("device") is None:
            inherits = func in _KEEPS_INPUT_DEVICE and args and isinstance(args[0], torch.Tensor)
            site = None if inherits else self._our_call_site()
            if site is not None:
                self.calls.append((func.__name__, site))
        return func(*args, **kwargs)

    def _our_call_site(self):
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
            frame = frame.f_back
        if frame is None:
            return None
        path = os.path.abspath(frame.f_code.co_filename)
        return f"{path}:{frame.f_lineno}" if path.startswith(self.roots) else None
