"""Tensor creation (ca.tensor, from_numpy, zeros, ones, full, arange, randn, rand)
and the module functions over several tensors (ca.cat, stack, where, maximum,
minimum)."""
from __future__ import annotations

import numpy as np

from compiled_autograd.autograd import random as _random
from compiled_autograd.autograd import tensor_methods as _methods
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.autograd.tensor_base import DEFAULT_FLOAT
from compiled_autograd.runtime import memory


def _dtype(dtype):
    return None if dtype is None else np.dtype(dtype)


def tensor(data, requires_grad=False, dtype=None) -> Tensor:
    """A new leaf Tensor holding a copy of ``data`` (float32 unless ``dtype``)."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


def from_numpy(a: np.ndarray) -> Tensor:
    """A Tensor sharing ``a``'s memory and keeping its dtype (int64 indices, bool
    masks). A non-C-contiguous array is copied (views need a C-ordered base)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(a).__name__})")
    return Tensor._make(a if a.flags.c_contiguous else np.ascontiguousarray(a))


def _shape(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _new(arr, requires_grad):
    memory.on_array(arr, "factory")
    t = Tensor._make(arr)
    t.requires_grad = requires_grad
    return t


def zeros(*size, dtype=None, requires_grad=False) -> Tensor:
    return _new(np.zeros(_shape(size), dtype=_dtype(dtype) or DEFAULT_FLOAT), requires_grad)


def ones(*size, dtype=None, requires_grad=False) -> Tensor:
    return _new(np.ones(_shape(size), dtype=_dtype(dtype) or DEFAULT_FLOAT), requires_grad)


def full(size, fill_value, dtype=None, requires_grad=False) -> Tensor:
    if dtype is None:
        dtype = (np.bool_ if isinstance(fill_value, bool) else
                 np.int64 if isinstance(fill_value, int) else DEFAULT_FLOAT)
    return _new(np.full(_shape((size,)), fill_value, dtype=dtype), requires_grad)


def zeros_like(t, dtype=None, requires_grad=False) -> Tensor:
    return _new(np.zeros(t.shape, dtype=_dtype(dtype) or t.dtype), requires_grad)


def ones_like(t, dtype=None, requires_grad=False) -> Tensor:
    return _new(np.ones(t.shape, dtype=_dtype(dtype) or t.dtype), requires_grad)


def arange(start, end=None, step=1, dtype=None, requires_grad=False) -> Tensor:
    if end is None:
        start, end = 0, start
    ints = all(isinstance(v, int) for v in (start, end, step))
    default = np.int64 if ints else DEFAULT_FLOAT
    return _new(np.arange(start, end, step, dtype=_dtype(dtype) or default), requires_grad)


def randn(*size, dtype=None, requires_grad=False) -> Tensor:
    """Standard normal samples from ca's seeded RNG."""
    arr = _random.generator().standard_normal(_shape(size))
    return _new(arr.astype(_dtype(dtype) or DEFAULT_FLOAT), requires_grad)


def rand(*size, dtype=None, requires_grad=False) -> Tensor:
    """Uniform [0, 1) samples from ca's seeded RNG."""
    arr = _random.generator().random(_shape(size))
    return _new(arr.astype(_dtype(dtype) or DEFAULT_FLOAT), requires_grad)


def randint(low, high, size, dtype=np.int64) -> Tensor:
    return _new(_random.generator().integers(low, high, size=_shape((size,))).astype(dtype),
                False)


# ---------------------------------------------------------------- module functions
# (the ops themselves are in tensor_methods, below Tensor: they take Tensor._make
# for arguments that are lists or arrays)

def cat(tensors, dim=0) -> Tensor:
    """Concatenate ``tensors`` along ``dim`` (torch.cat)."""
    return _methods.cat(tensors, dim, make=Tensor._make)


def stack(tensors, dim=0) -> Tensor:
    """Stack ``tensors`` along a new ``dim`` (torch.stack)."""
    return _methods.stack(tensors, dim, make=Tensor._make)


def where(condition, input, other) -> Tensor:
    """``input`` where ``condition``, else ``other`` (torch.where)."""
    return _methods.where(condition, input, other, make=Tensor._make)


def pow(input, exponent) -> Tensor:
    """``input ** exponent`` (torch.pow): ``input`` may be a Python number when
    ``exponent`` is a Tensor."""
    if isinstance(input, Tensor):
        return input.pow(exponent)
    if isinstance(exponent, Tensor) and isinstance(input, (int, float, bool, np.number)):
        return exponent.__rpow__(input)
    raise TypeError(f"pow() received an invalid combination of arguments - got "
                    f"({type(input).__name__}, {type(exponent).__name__}), but expected one "
                    "of: (Tensor input, Tensor exponent), (Number self, Tensor exponent), "
                    "(Tensor input, Number exponent)")


def maximum(input, other) -> Tensor:
    return _methods.maximum(input, other, make=Tensor._make)


def minimum(input, other) -> Tensor:
    return _methods.minimum(input, other, make=Tensor._make)
