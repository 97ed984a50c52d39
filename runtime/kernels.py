"""The forward's C kernels (``kernels.c``): prims' kernels in one pass over memory,
where numpy makes many. A prim's kernel tries ``call_native(name, ...)`` first; it
gives ``NotImplemented`` where the C does not apply (not an ndarray of native
float32/float64) or is not built, and the prim's numpy kernel runs.
The numpy kernel stays the reference: tests/test_forward_kernels.py compares the
two (values, dtypes, layouts, empty arrays, NaN and infinities). ``axpy`` (``out =
a + alpha * b`` in one pass) serves the optimizers' rules (``optim._rules.axpy_``)
and the "python" backend's scaled adds (``scaled_add``, ``ir.passes.in_place_writes``).
``linear`` calls numpy's own OpenBLAS (``cbuild.blas_library``), whose gemm
addresses are handed to the module once it is loaded; where they cannot be found
it gives NotImplemented, and numpy's matmul runs.

Part of the forward's C path: built on first use like ``forward.c``
(``compiled_autograd.runtime.extension``, optimised as the generated C is), and turned off with it by
``CA_C_FORWARD=0`` (then every prim runs its numpy kernel), or where it cannot be
built. The math (``ca_math.h``) is the C backend's own: runtime owns the header and
codegen pastes it into the generated code."""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np

from compiled_autograd.runtime import cbuild
from compiled_autograd.runtime.extension import Extension

log = logging.getLogger("compiled_autograd")

HERE = Path(__file__).parent
MATH_HEADER = HERE / "ca_math.h"


def _hand_over_gemm(module) -> None:
    """Give kernels.c's linear the BLAS's sgemm and dgemm (numpy's OpenBLAS)."""
    try:
        names = cbuild.blas()
        lib = cbuild.blas_library()
        sgemm, dgemm = (ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
                        for n in (names.sgemm, names.dgemm))
    except (cbuild.CBuildError, OSError, AttributeError) as e:
        log.info("compiled autograd: the forward's linear runs numpy's matmul (%s)", e)
        return
    module.set_gemm(sgemm, dgemm, names.int_type == "int64_t")


KERNELS = Extension("_kernels", (HERE / "kernels.c",), "the forward's C kernels",
                    "CA_C_FORWARD", numpy_headers=True, optimize=True,
                    on_load=_hand_over_gemm)


def native(name: str):
    """The C kernel ``name`` of ``kernels.c``, or None (off, or not built)."""
    module = KERNELS.module()
    return None if module is None else getattr(module, name)


def _unavailable(*args):
    return NotImplemented


# name -> kernels.c's function, or _unavailable: looked up once, not at every call
# (a prim's kernel runs on every forward op). When KERNELS changes (disabled,
# reset) the dict is replaced, not emptied: a lookup that raced the change
# stores into the old dict, which nobody reads any more.
_functions: dict = {}


def _forget_functions() -> None:
    global _functions
    _functions = {}


KERNELS.on_change(_forget_functions)


def call_native(name: str, *args):
    """``kernels.c``'s ``name`` on ``args``: its result, or NotImplemented where it
    does not apply or is not built (the caller then runs its numpy kernel)."""
    functions = _functions
    fn = functions.get(name)
    if fn is None:
        fn = functions[name] = native(name) or _unavailable
    return fn(*args)


def scaled_add(out, a, alpha, b):
    """``out = a + alpha * b`` (``out`` may be ``a`` or ``b``), as numpy computes it
    in two passes -- ``b * alpha``, rounded, then the sum -- in one pass where
    ``axpy`` applies; else numpy's two, through a temporary. Returns ``out``."""
    module = KERNELS.module()     # (per optimizer update: no further calls)
    if module is None or module.axpy(out, a, alpha, b) is NotImplemented:
        np.add(a, np.multiply(b, alpha), out=out)
    return out
