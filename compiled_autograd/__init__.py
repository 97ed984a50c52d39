"""compiled_autograd: a numpy-backed autograd library whose backward can be compiled.

The API mirrors torch: ``ca.tensor(..., requires_grad=True)``, ops on Tensors,
``loss.backward()``, ``ca.autograd.grad``, ``ca.nn``. See docs/architecture.md.
"""
import numpy as _np

# runtime/ and codegen/ are this package's subpackages; a checkout keeps them beside it
from compiled_autograd import _checkout
_checkout.install()

import compiled_autograd.runtime as _runtime  # noqa: F401  (fills the prim table)
from compiled_autograd.autograd import tensor_methods as _tensor_methods
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.autograd.factory import (arange, cat, from_numpy, full, maximum, minimum,
                                                ones, ones_like, pow, rand, randint, randn, stack,
                                                tensor, where, zeros, zeros_like)
from compiled_autograd.autograd.grad_mode import (enable_grad, is_grad_enabled, no_grad,
                                         set_grad_enabled)
from compiled_autograd.autograd.random import get_rng_state, manual_seed, set_rng_state
from compiled_autograd import autograd, memory, nn, optim, utils  # noqa: E402
from compiled_autograd.compiled.api import compiled_backward, trace_backward
from compiled_autograd.compiled.backends import register_backend
from compiled_autograd.compiled.cache import compiled_autograd_stats, reset_compiled_autograd
from compiled_autograd.memory.profile import set_compile_stats as _set_compile_stats
from compiled_autograd.planning import plan_checkpoints as _plan_checkpoints

# ca.memory.plan_checkpoints: the planner sits above the compiled path it simulates
# and runs (compiled_autograd.planning), so the facade hands it to ca.memory.
memory.plan_checkpoints = _plan_checkpoints

_set_compile_stats(compiled_autograd_stats)   # a profile notes the compiles inside it

float32 = _np.float32
float64 = _np.float64
int64 = _np.int64
bool_ = _np.bool_


def _method(name):
    def fn(input, *args, **kwargs):
        return getattr(input, name)(*args, **kwargs)
    fn.__name__ = name
    fn.__doc__ = f"``ca.{name}(x, ...)`` is ``x.{name}(...)``."
    return fn


# ca.<op>(x, ...) for the composite ops, and for every prim the table offers as a
# method (``method=`` in its block: ca.exp, ca.tanh, ...).
_FUNCTIONS = ("sum", "mean", "var", "std", "amax", "amin", "max", "min", "argmax", "softmax",
              "log_softmax", "matmul", "reshape", "transpose", "permute", "flatten",
              "squeeze", "unsqueeze", "clamp", "split", "chunk", "unbind", "narrow", "select",
              "clone", "t", "masked_fill", "gather") + tuple(_tensor_methods.TABLE_METHODS)
for _name in _FUNCTIONS:
    globals()[_name] = _method(_name)
del _name

__all__ = [
    "Tensor", "tensor", "from_numpy", "zeros", "ones", "full", "zeros_like", "ones_like",
    "arange", "randn", "rand", "randint", "cat", "stack", "where", "maximum", "minimum", "pow",
    "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "manual_seed",
    "get_rng_state", "set_rng_state", "autograd", "nn", "optim", "memory", "utils", "compiled_backward",
    "trace_backward", "compiled_autograd_stats", "reset_compiled_autograd", "register_backend",
    *_FUNCTIONS,
]
