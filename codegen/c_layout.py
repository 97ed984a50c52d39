"""Values of a compiled C backward: where each lives, and size arithmetic.

A graph value in C is a ``Val``: a dtype, a shape, element strides and an offset
into a ``Storage`` -- an arena buffer, an output array, an input array, or an
external array that a Python callback returned (an unpacked saved value, a hook's
result). View prims (reshape, permute, expand, slice, as_strided) only make a new
``Val`` over the same storage: a transpose costs nothing and folds into the BLAS
call that reads it.

Sizes are ints, or expressions over the graph's symbolic ``sizes`` (the tuples of
``compiled_autograd.ir.symbolic``) when the graph is dynamic.
"""
from __future__ import annotations

import numpy as np

from compiled_autograd.ir.symbolic import boxed_symbol, evaluate, expr_of, expr_text

CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
          np.dtype(np.int64): "int64_t", np.dtype(np.int32): "int32_t",
          np.dtype(np.bool_): "uint8_t"}


def ctype(dtype) -> str:
    try:
        return CTYPES[np.dtype(dtype)]
    except KeyError:
        raise NotImplementedError(f"C backend: no C type for dtype {np.dtype(dtype)}") from None


# ---------------------------------------------------------------- size expressions

def dim(d):
    """A size from a graph's meta or params: an int, or an expression tuple."""
    e = expr_of(d)
    return int(e) if isinstance(e, (int, float)) else e


def mul(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 0 or b == 0:
        return 0
    if a == 1:
        return b
    if b == 1:
        return a
    return ("*", a, b)


def add(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a == 0:
        return b
    if b == 0:
        return a
    return ("+", a, b)


def prod(dims):
    out = 1
    for d in dims:
        out = mul(out, d)
    return out


def c_expr(e) -> str:
    """C for a size expression: literals, ``sizes[i]`` and integer arithmetic
    (sizes are never negative, so C's ``/`` is Python's ``//``)."""
    return expr_text(e, boxed_symbol, _C_OPS, sep=" ")


_C_OPS = {"+": "+", "-": "-", "*": "*", "//": "/"}


def value_of(e, sizes) -> int:
    return e if isinstance(e, int) else int(evaluate(e, sizes))


def broadcast_strides(shape, strides, ndim):
    """Element strides of an array of ``shape``/``strides`` read as ``ndim`` dims
    (numpy broadcasting: missing leading dims and size-1 dims stride 0)."""
    return [0] * (ndim - len(shape)) + [0 if n == 1 else s for n, s in zip(shape, strides)]


def in_layout(v, strides):
    """``v``, a fresh array Python hands in, read in the layout ``strides``
    (elements) the graph recorded, as Python holds it: no copy. None: contiguous."""
    if strides is None or tuple(strides) == v.storage.strides:
        return v
    v.storage.strides = tuple(strides)
    return v.with_layout(v.shape, v.storage.strides, 0)


def contiguous_strides(shape):
    strides, s = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = s
        s = mul(s, shape[d])
    return tuple(strides)


# ---------------------------------------------------------------- storage and values

class Storage:
    """A block of memory the C code reads or writes.

    kind: "arena" (planned intermediate), "out" (an array Python allocates and keeps:
    gradients to accumulate, returned values), "in" (an input or constant array),
    "ext" (an array a callback returned). ``first``/``last``: the steps that write it
    and last read it (``last`` from the graph's liveness: Emitter._last_reads)."""

    __slots__ = ("kind", "index", "dtype", "nbytes", "first", "last", "shape", "strides")

    def __init__(self, kind, index, dtype, shape, first, strides=None):
        self.kind, self.index, self.dtype, self.shape = kind, index, np.dtype(dtype), shape
        self.nbytes = mul(prod(shape), self.dtype.itemsize)
        self.first = self.last = first
        # The element strides of the array Python holds: contiguous, except for an
        # "ext" array a callback returns strided (read in place, not copied).
        self.strides = contiguous_strides(shape) if strides is None else tuple(strides)

    @property
    def name(self) -> str:
        return f"{self.kind}{self.index}"


class Val:
    """A strided window on a storage."""

    __slots__ = ("storage", "dtype", "shape", "strides", "offset")

    def __init__(self, storage, dtype, shape, strides=None, offset=0):
        self.storage, self.dtype, self.shape = storage, np.dtype(dtype), tuple(shape)
        self.strides = contiguous_strides(self.shape) if strides is None else tuple(strides)
        self.offset = offset

    @property
    def ctype(self) -> str:
        return ctype(self.dtype)

    @property
    def ptr(self) -> str:
        return self.storage.name

    def is_contiguous(self) -> bool:
        expect = contiguous_strides(self.shape)
        return all(n == 1 or s == e for n, s, e in zip(self.shape, self.strides, expect))

    def with_layout(self, shape, strides, offset):
        return Val(self.storage, self.dtype, shape, strides, offset)

    def numpy(self, base: np.ndarray, sizes) -> np.ndarray:
        """This window as a numpy view of ``base`` (the storage's array; strides
        and offset count elements from its first element, whatever its layout)."""
        shape = tuple(value_of(d, sizes) for d in self.shape)
        strides = tuple(value_of(s, sizes) * self.dtype.itemsize for s in self.strides)
        offset = value_of(self.offset, sizes) * self.dtype.itemsize
        return np.asarray(_Window(base, base.ctypes.data + offset, shape, strides, self.dtype))


class _Window:
    """A numpy view at an address inside ``base`` (kept alive by the view)."""

    def __init__(self, base, address, shape, strides, dtype):
        self.base = base
        self.__array_interface__ = {"data": (address, False), "shape": shape,
                                    "strides": strides, "typestr": dtype.str, "version": 3}


# ---------------------------------------------------------------- views

def permuted(v: Val, perm) -> Val:
    return v.with_layout([v.shape[p] for p in perm], [v.strides[p] for p in perm], v.offset)


def expanded(v: Val, shape) -> Val:
    lead = len(shape) - len(v.shape)
    strides = [0] * lead + [0 if n == 1 and t != 1 else s
                            for n, s, t in zip(v.shape, v.strides, shape[lead:])]
    return v.with_layout(shape, strides, v.offset)


def sliced(v: Val, dim_, start, step) -> Val:
    strides = list(v.strides)
    offset = add(v.offset, mul(start, strides[dim_]))
    strides[dim_] = mul(strides[dim_], step)
    return v.with_layout(v.shape, strides, offset)


def reshaped(v: Val, shape):
    """The view of ``v`` with ``shape`` when ``v`` is contiguous, else None (the
    caller copies, as numpy does for most non-contiguous reshapes)."""
    if v.is_contiguous():
        return v.with_layout(shape, contiguous_strides(shape), v.offset)
    return None


def strided_reshape(v: Val, shape):
    """``v`` seen with ``shape`` without a copy where its strides allow it (numpy's
    rule: each run of dims merged or split is contiguous within itself), else
    None; static sizes only. (A window of a wider buffer split in its last dim:
    a concatenation's piece seen in the shape of what is copied into it.)"""
    if v.is_contiguous():
        return reshaped(v, shape)
    sizes = list(v.shape) + list(v.strides) + list(shape)
    if not all(isinstance(x, int) for x in sizes) or 0 in v.shape:
        return None
    old = [(n, st) for n, st in zip(v.shape, v.strides) if n != 1]
    new = [n for n in shape if n != 1]
    strides, i, j = [], 0, 0
    while i < len(old) and j < len(new):
        oi, nj, o_size, n_size = i + 1, j + 1, old[i][0], new[j]
        while o_size != n_size:
            if o_size < n_size:
                if oi == len(old):
                    return None
                o_size, oi = o_size * old[oi][0], oi + 1
            else:
                if nj == len(new):
                    return None
                n_size, nj = n_size * new[nj], nj + 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(i, oi - 1)):
            return None
        run = [old[oi - 1][1]]
        for k in range(nj - 1, j, -1):
            run.insert(0, run[0] * new[k])
        strides += run
        i, j = oi, nj
    if i != len(old) or j != len(new):
        return None
    it = iter(strides)
    return v.with_layout(tuple(shape), tuple(1 if n == 1 else next(it) for n in shape),
                         v.offset)
