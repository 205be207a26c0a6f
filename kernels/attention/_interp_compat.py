"""Makes triton 3.6's interpreter loop over runtime bounds with numpy >= 2.4.

The interpreter holds every scalar as a 1-element numpy array and implements
``tensor.__index__`` as ``int(array)``; numpy 2.4 turned that conversion of a 1-d array into a
TypeError, so ``for i in range(lo, hi, STEP)`` with loaded or computed bounds fails under
TRITON_INTERPRET=1 (measured: triton 3.6.0 + numpy 2.4.6). This adds an ``__index__`` that
takes the single element, inside the interpreter's own patch scope (restored after each
launch). It changes nothing on a GPU: only applied when interpreting.
"""
import numpy as np


def apply() -> None:
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_specdec_scalar_index", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._specdec_scalar_index = True
    interpreter._patch_lang_tensor = patched
