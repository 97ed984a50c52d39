"""The ops of a Tensor: ``TensorMethods``, a base class of Tensor. Every op is a prim
call or a short composition of prim calls; no op has a derivative of its own here
(the prims carry them). The elementwise prims a user calls by name (``x.exp()``,
``ca.exp(x)``) come from the prim table: each one whose entry has ``method`` set.

This module sits below Tensor: it makes tensors with ``x._make`` of a tensor at hand
(``_promote``, ``_as_tensor`` take the one to use)."""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from compiled_autograd.autograd.grad_mode import is_grad_enabled
from compiled_autograd.autograd.tensor_base import TensorBase
from compiled_autograd.runtime.prims import PRIMS, norm_dim, ops

DEFAULT_FLOAT = np.dtype(np.float32)
_FLOAT_KINDS = "fc"


def _scalar(x):
    return x.item() if isinstance(x, np.generic) else x


def _as_tensor(x, make):
    """A Tensor for an ndarray, list or tuple (made with ``make``: Tensor._make); a
    Tensor as it is; a Python scalar as a scalar."""
    if isinstance(x, TensorBase):
        return x
    if isinstance(x, (np.ndarray, list, tuple)):
        return make(np.asarray(x))
    return _scalar(x)


def _maker(*values):
    """``_make`` of the first tensor among ``values``."""
    for v in values:
        if isinstance(v, TensorBase):
            return v._make
    raise TypeError("expected a Tensor among the arguments")


def _to(t, dtype):
    return t if t.dtype == dtype else ops.astype(t, dtype=np.dtype(dtype))


def _float(t):
    """torch promotes integer inputs of float ops to the default float dtype."""
    return t if t.dtype.kind in _FLOAT_KINDS else _to(t, DEFAULT_FLOAT)


def _promote(a, b, make=None):
    """torch's rule where numpy's differs: an integer Tensor meeting a float
    (Tensor or Python float) becomes float, of the float Tensor's dtype or float32.
    ``make`` (Tensor._make) is needed only when neither is a Tensor."""
    make = make or _maker(a, b)
    a, b = _as_tensor(a, make), _as_tensor(b, make)
    ta, tb = isinstance(a, TensorBase), isinstance(b, TensorBase)
    if ta and tb:
        if a.dtype == b.dtype:
            return a, b
        fa, fb = a.dtype.kind in _FLOAT_KINDS, b.dtype.kind in _FLOAT_KINDS
        if fa and not fb:
            return a, _to(b, a.dtype)
        if fb and not fa:
            return _to(a, b.dtype), b
        # torch: a 0-d tensor takes part by category only; the dimensioned one wins.
        if a.ndim == 0 and b.ndim > 0:
            return _to(a, b.dtype), b
        if b.ndim == 0 and a.ndim > 0:
            return a, _to(b, a.dtype)
        return a, b
    if not ta and not tb:  # two Python scalars: the default dtype, as torch
        dtype = DEFAULT_FLOAT if isinstance(a, float) or isinstance(b, float) else np.int64
        return make(np.asarray(a, dtype=dtype)), b
    t, s = (a, b) if ta else (b, a)
    if isinstance(s, float) and t.dtype.kind not in _FLOAT_KINDS:
        t = _to(t, DEFAULT_FLOAT)
        return (t, s) if ta else (s, t)
    return a, b


def _broadcast_error(a, b):
    sa, sb = tuple(getattr(a, "shape", ())), tuple(getattr(b, "shape", ()))
    n = max(len(sa), len(sb))
    pa, pb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    for d in range(n - 1, -1, -1):
        if pa[d] != pb[d] and 1 not in (pa[d], pb[d]):
            return RuntimeError(f"The size of tensor a ({pa[d]}) must match the size of tensor "
                                f"b ({pb[d]}) at non-singleton dimension {d}")
    return None


def _call_binary(p, a, b, handler=None):
    """``p(a, b)`` (or ``handler(p, (a, b), {})``, the prim's dispatch already
    decided) with torch's message for shapes that do not broadcast."""
    try:
        return p(a, b) if handler is None else handler(p, (a, b), {})
    except ValueError:
        err = _broadcast_error(a, b)
        if err is None:
            raise
        raise err from None


def _binary(name):
    p = PRIMS[name]

    def op(self, other):
        cls = other.__class__
        # The hot path: where _promote would leave the pair as it is and self's
        # type handles the call -- ``other`` a Python int, a Python float beside a
        # floating tensor, a tensor of the same type and dtype --, the call
        # itself, as _call_binary makes it.
        if (cls is int or (cls is float and self.dtype.kind in _FLOAT_KINDS)
                or (cls is self.__class__ and other.dtype == self.dtype)):
            try:
                return self.__class__.__prim_call__(p, (self, other), {})
            except ValueError:
                err = _broadcast_error(self, other)
                if err is None:
                    raise
                raise err from None
        return _call_binary(p, *_promote(self, other))

    def rop(self, other):
        cls = other.__class__
        if cls is int or (cls is float and self.dtype.kind in _FLOAT_KINDS):
            return _call_binary(p, other, self, self.__class__.__prim_call__)
        return _call_binary(p, *_promote(other, self))
    return op, rop



# ---------------------------------------------------------------- arithmetic


def _div(a, b):
    a, b = _promote(a, b)
    if isinstance(a, TensorBase) and a.dtype.kind not in _FLOAT_KINDS:
        a = _to(a, DEFAULT_FLOAT)  # true division of integers is float, as in torch
    if isinstance(b, TensorBase) and b.dtype.kind not in _FLOAT_KINDS:
        b = _to(b, DEFAULT_FLOAT)
    return _call_binary(PRIMS["div"], a, b)




def _matmul(a, b):
    a, b = _promote(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError("both arguments to matmul need to be at least 1D, but they are "
                           f"{a.ndim}D and {b.ndim}D")
    squeeze = []
    if a.ndim == 1:
        a, squeeze = a.reshape(1, a.shape[0]), squeeze + [-2]
    if b.ndim == 1:
        b, squeeze = b.reshape(b.shape[0], 1), squeeze + [-1]
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                           f"({a.shape[-2]}x{a.shape[-1]} and {b.shape[-2]}x{b.shape[-1]})")
    out = ops.matmul(a, b)
    if squeeze:
        shape = list(out.shape)
        for d in sorted(squeeze):
            shape[d] = None
        out = out.reshape(*[s for s in shape if s is not None])
    return out


def _clamp(self, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    return ops.clamp(self, min=_scalar(min), max=_scalar(max))


# ---------------------------------------------------------------- comparisons (no grad)


def _logical(fn):
    def op(self, other=None):
        other = other._data if isinstance(other, TensorBase) else other
        return self._make(np.asarray(fn(self._data) if other is None else fn(self._data, other)))
    return op


# Boolean mask algebra is forward-only (it never carries a gradient).

# ---------------------------------------------------------------- dtype


def _to_dtype(self, dtype=None, copy=False):
    if dtype is None:
        return self
    return ops.astype(self, dtype=np.dtype(dtype)) if (copy or self.dtype != dtype) else self


# ---------------------------------------------------------------- reductions


def _dims(self, dim):
    """Reduced dims, sorted and non-negative; None or () mean all (as torch)."""
    if isinstance(dim, int):
        dim = (dim,)
    if dim is None or len(dim) == 0:
        return tuple(range(self.ndim))
    dims = tuple(sorted(norm_dim(d, self.ndim) for d in dim))
    return () if self.ndim == 0 else dims  # a 0-d tensor accepts dim 0 / -1


def _count(self, dims):
    return int(np.prod([self.shape[d] for d in dims], dtype=np.int64))


def _sum(self, dim=None, keepdim=False):
    return ops.sum(self, dims=_dims(self, dim), keepdim=keepdim)


def _mean(self, dim=None, keepdim=False):
    if self.dtype.kind not in _FLOAT_KINDS:
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either "
                           f"a floating point or complex dtype. Got: {self.dtype.name}")
    dims = _dims(self, dim)
    n = _count(self, dims)
    return ops.mul(ops.sum(self, dims=dims, keepdim=keepdim), 1.0 / n if n else float("nan"))


def _var(self, dim=None, unbiased=None, keepdim=False, correction=None):
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    dims = _dims(self, dim)
    centered = self - _mean(self, dims, keepdim=True)
    denom = max(_count(self, dims) - correction, 0)
    total = ops.sum(centered * centered, dims=dims, keepdim=keepdim)
    return ops.mul(total, 1.0 / denom if denom else float("inf"))


# std's gradient is 0 where std is 0 (all values equal), as torch's std_backward.
MinMax = namedtuple("MinMax", ["values", "indices"])


def _argmax(self, dim=None, keepdim=False):
    dim = None if dim is None else norm_dim(dim, self.ndim)
    return self._make(ops.argmax(self._data, dim=dim, keepdim=keepdim))


def _max(self, dim=None, keepdim=False):
    """Without dim: the maximum (gradient shared among ties, as torch). With dim:
    (values, indices); the gradient goes to the index, as torch's max(dim)."""
    if isinstance(dim, TensorBase):
        return ops.maximum(*_promote(self, dim))
    if dim is None:
        return ops.amax(self, dims=_dims(self, None), keepdim=False)
    d = norm_dim(dim, self.ndim)
    idx = self._make(ops.argmax(self._data, dim=d, keepdim=True))
    values = ops.gather(self, idx, dim=d)
    if not keepdim:
        values, idx = values.squeeze(d), idx.squeeze(d)
    return MinMax(values, idx)


def _min(self, dim=None, keepdim=False):
    if isinstance(dim, TensorBase):
        return ops.minimum(*_promote(self, dim))
    if dim is None:
        return -ops.amax(-self, dims=_dims(self, None), keepdim=False)
    d = norm_dim(dim, self.ndim)
    idx = self._make(ops.argmax(-self._data, dim=d, keepdim=True))
    values = ops.gather(self, idx, dim=d)
    if not keepdim:
        values, idx = values.squeeze(d), idx.squeeze(d)
    return MinMax(values, idx)


# ---------------------------------------------------------------- shape and views


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(map(int, shape))


def _infer_shape(self, shape):
    shape = list(shape)
    numel = self.numel()
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    if -1 in shape:
        known = int(math.prod([s for s in shape if s != -1]))
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // known
    if int(math.prod(shape)) != numel:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return tuple(shape)


def _reshape(self, *shape):
    shape = _infer_shape(self, _shape_args(shape))
    return ops.reshape(self, shape=shape)     # a view even when the shape is the same


def _alias(self):
    """A new view of all of ``self`` (with its own grad_fn, as torch's views): what
    a view op that changes nothing returns, so that hooks and retain_grad on it
    see only its own gradient."""
    return ops.reshape(self, shape=self.shape)


def _view(self, *shape):
    shape = _infer_shape(self, _shape_args(shape))
    try:
        np.reshape(self._data, shape, copy=False)
    except ValueError:
        raise RuntimeError("view size is not compatible with input tensor's size and stride "
                           "(at least one dimension spans across two contiguous subspaces). "
                           "Use .reshape(...) instead.") from None
    return ops.reshape(self, shape=shape)


def _permute(self, *dims):
    # (torch's checks, in its order: the number of dims, each in range, no repeats)
    dims = _shape_args(dims)
    if len(dims) != self.ndim:
        raise RuntimeError("permute(sparse_coo): number of dimensions in the tensor input does "
                           "not match the length of the desired ordering of dimensions i.e. "
                           f"input.dim() = {self.ndim} is not equal to len(dims) = {len(dims)}")
    dims = tuple(norm_dim(d, self.ndim) for d in dims)
    if len(set(dims)) != len(dims):
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    return ops.permute(self, perm=dims)


def _transpose(self, dim0, dim1):
    perm = list(range(self.ndim))
    d0, d1 = norm_dim(dim0, self.ndim), norm_dim(dim1, self.ndim)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ops.permute(self, perm=tuple(perm))


def _t(self):
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
    return _transpose(self, 0, 1) if self.ndim == 2 else _alias(self)


def _expand(self, *sizes):
    sizes = _shape_args(sizes)
    lead = len(sizes) - self.ndim
    if lead < 0:
        raise RuntimeError(f"expand: the number of sizes provided ({len(sizes)}) must be "
                           f"greater or equal to the number of dimensions in the tensor "
                           f"({self.ndim})")
    shape = tuple(self.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes))
    for i, n in enumerate(self.shape):
        if n != 1 and n != shape[i + lead]:
            raise RuntimeError(f"The expanded size of the tensor ({shape[i + lead]}) must match "
                               f"the existing size ({n}) at non-singleton dimension {i + lead}."
                               f"  Target sizes: {list(sizes)}.  Tensor sizes: {list(self.shape)}")
    return ops.expand(self, shape=shape)      # a view even when the shape is the same


def _unsqueeze(self, dim):
    d = norm_dim(dim, self.ndim + 1)
    return ops.reshape(self, shape=self.shape[:d] + (1,) + self.shape[d:])


def _squeeze(self, dim=None):
    if dim is None:
        shape = tuple(n for n in self.shape if n != 1)
    else:
        dims = _dims(self, dim)
        shape = tuple(n for i, n in enumerate(self.shape) if not (i in dims and n == 1))
    return ops.reshape(self, shape=shape)


def _flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0:
        return ops.reshape(self, shape=(1,))
    s, e = norm_dim(start_dim, self.ndim), norm_dim(end_dim, self.ndim)
    shape = self.shape[:s] + (int(np.prod(self.shape[s:e + 1], dtype=np.int64)),) + self.shape[e + 1:]
    return self if shape == self.shape else _reshape(self, *shape)


def _narrow(self, dim, start, length):
    d = norm_dim(dim, self.ndim)
    n = self.shape[d]
    start = start + n if start < 0 else start
    if not (0 <= start <= n and 0 <= length and start + length <= n):
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({n}).")
    return ops.slice(self, dim=d, start=start, stop=start + length, step=1)


def _select(self, dim, index):
    d = norm_dim(dim, self.ndim)
    n = self.shape[d]
    if not -n <= index < n:
        raise IndexError(f"index {index} is out of bounds for dimension {d} with size {n}")
    index = index + n if index < 0 else index
    sliced = ops.slice(self, dim=d, start=index, stop=index + 1, step=1)
    return ops.reshape(sliced, shape=self.shape[:d] + self.shape[d + 1:])


def _split(self, split_size_or_sections, dim=0):
    d = norm_dim(dim, self.ndim)
    n = self.shape[d]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        sizes = [min(step, n - s) for s in range(0, n, step)] if n else [0]
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} "
                               f"(input tensor's size at dimension {d}), but got "
                               f"split_sizes={sizes}")
    out, start = [], 0
    for size in sizes:
        out.append(ops.slice(self, dim=d, start=start, stop=start + size, step=1))
        start += size
    if is_grad_enabled():
        # As torch: the views of a function that returns several may not be
        # modified in place (dispatch.check_inplace says so, naming torch's op).
        name = "Split" if isinstance(split_size_or_sections, int) else "SplitWithSizes"
        for i, view in enumerate(out):
            view._creation = ("multi_output", i, name)
    return tuple(out)


def _unbind(self, dim=0):
    """torch's unbind: the slices along ``dim``, each without that dimension (views
    of a function that returns several: none may be modified in place)."""
    d = norm_dim(dim, self.ndim)
    out = tuple(_select(self, d, i) for i in range(self.shape[d]))
    if is_grad_enabled():
        for i, view in enumerate(out):
            view._creation = ("multi_output", i, "Unbind")
    return out


def _chunk(self, chunks, dim=0):
    n = self.shape[norm_dim(dim, self.ndim)]
    return _split(self, max(-(-n // chunks), 1), dim)


# ---------------------------------------------------------------- module functions


def cat(tensors, dim=0, make=None):
    """``ca.cat`` (``make``: Tensor._make, for lists and arrays among ``tensors``)."""
    make = make or _maker(*tensors)
    tensors = [_as_tensor(t, make) for t in tensors]
    if not tensors:
        raise RuntimeError("torch.cat(): expected a non-empty list of Tensors")
    # torch skips legacy empty tensors (1-d, size 0) next to others: they join as an
    # empty slice of the first other tensor's shape (a reshape, so they still get their
    # (empty) gradient); dim and the checks go by that first other tensor.
    ref = next((t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)), tensors[0])
    d = norm_dim(dim, ref.ndim)
    for k, t in enumerate(tensors):
        if t.ndim == 1 and t.shape[0] == 0:
            continue
        if t.ndim != ref.ndim:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {ref.ndim} "
                               f"and {t.ndim}")
        for i, (a, b) in enumerate(zip(ref.shape, t.shape)):
            if i != d and a != b:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. "
                                   f"Expected size {a} but got size {b} for tensor number {k} "
                                   "in the list.")
    if ref.ndim != 1:
        empty = ref.shape[:d] + (0,) + ref.shape[d + 1:]
        tensors = [ops.reshape(t, shape=empty) if t.ndim == 1 and t.shape[0] == 0 else t
                   for t in tensors]
    return ops.cat(*tensors, dim=d)


def stack(tensors, dim=0, make=None):
    make = make or _maker(*tensors)
    tensors = [_as_tensor(t, make) for t in tensors]
    d = norm_dim(dim, tensors[0].ndim + 1)
    return cat([_unsqueeze(t, d) for t in tensors], d, make)


def where(condition, input, other, make=None):
    make = make or _maker(condition, input, other)
    a, b = _promote(input, other, make)
    condition = _as_tensor(condition, make)
    try:
        return ops.where(condition, a, b)
    except ValueError:
        raise _broadcast_error(a, b) or _broadcast_error(condition, a) from None


def maximum(input, other, make=None):
    return ops.maximum(*_promote(input, other, make))


def minimum(input, other, make=None):
    return ops.minimum(*_promote(input, other, make))


def _prim_method(p):
    """``x.<prim>()`` for an elementwise prim whose table entry sets ``method``:
    "float" promotes integer inputs to the default float first (as torch's exp)."""
    if p.method == "float":
        def op(self):
            if self.dtype.kind not in _FLOAT_KINDS:
                self = _to(self, DEFAULT_FLOAT)
            return type(self).__prim_call__(p, (self,), {})
    else:
        def op(self):
            return type(self).__prim_call__(p, (self,), {})
    op.__name__ = op.__qualname__ = p.name
    op.__doc__ = p.doc
    return op


# The Tensor methods the prim table declares (``method=`` in a prim's block, e.g.
# ``exp`` in runtime/prims_elementwise.py): x.exp() has no ``def exp`` of its own.
TABLE_METHODS = {p.name: _prim_method(p) for p in PRIMS.values() if p.method}


class TensorMethods(type("PrimMethods", (), dict(TABLE_METHODS, __slots__=()))):
    """The ops of a Tensor (a base class of Tensor); its own base holds the methods
    the prim table declares (TABLE_METHODS)."""

    __slots__ = ()

    __add__, __radd__ = _binary("add")
    __sub__, __rsub__ = _binary("sub")
    __mul__, __rmul__ = _binary("mul")
    __pow__, __rpow__ = _binary("pow")
    add, sub, mul, pow = __add__, __sub__, __mul__, __pow__
    maximum = _binary("maximum")[0]
    minimum = _binary("minimum")[0]
    __truediv__ = div = _div
    __rtruediv__ = lambda self, other: _div(other, self)
    __neg__ = lambda self: ops.neg(self)
    __abs__ = lambda self: ops.abs(self)
    __pos__ = lambda self: self
    gelu = lambda self, approximate="none": ops.gelu(_float(self), approximate=approximate)
    __matmul__ = matmul = _matmul
    __rmatmul__ = lambda self, other: _matmul(other, self)
    clamp = _clamp
    clip = _clamp
    __gt__ = lambda self, o: ops.gt(*_promote(self, o))
    __ge__ = lambda self, o: ops.ge(*_promote(self, o))
    __lt__ = lambda self, o: ops.gt(*_promote(o, self))
    __le__ = lambda self, o: ops.ge(*_promote(o, self))
    __eq__ = eq = lambda self, o: ops.eq(*_promote(self, o))
    __ne__ = ne = lambda self, o: ~ops.eq(*_promote(self, o))
    __hash__ = object.__hash__
    __invert__ = _logical(np.invert)
    __and__ = logical_and = _logical(np.logical_and)
    __or__ = logical_or = _logical(np.logical_or)
    logical_not = _logical(np.logical_not)
    to = _to_dtype
    float = lambda self: _to_dtype(self, np.float32)
    double = lambda self: _to_dtype(self, np.float64)
    long = lambda self: _to_dtype(self, np.int64)
    bool = lambda self: _to_dtype(self, np.bool_)
    is_floating_point = lambda self: self.dtype.kind == "f"
    sum = _sum
    mean = _mean
    var = _var
    std = lambda self, dim=None, unbiased=None, keepdim=False, correction=None: \
        ops.sqrt(_var(self, dim, unbiased, keepdim, correction), zero_grad_at_zero=True)
    amax = lambda self, dim=None, keepdim=False: ops.amax(self, dims=_dims(self, dim),
                                                          keepdim=keepdim)
    amin = lambda self, dim=None, keepdim=False: -ops.amax(-self, dims=_dims(self, dim),
                                                           keepdim=keepdim)
    argmax = _argmax
    max = _max
    min = _min
    softmax = lambda self, dim: ops.softmax(_float(self), dim=norm_dim(dim, self.ndim))
    log_softmax = lambda self, dim: ops.log_softmax(_float(self), dim=norm_dim(dim, self.ndim))
    reshape = _reshape
    view = _view
    permute = _permute
    transpose = _transpose
    t = _t
    T = property(lambda self: ops.permute(self, perm=tuple(reversed(range(self.ndim)))))
    mT = property(lambda self: _transpose(self, -2, -1))
    expand = _expand
    expand_as = lambda self, other: _expand(self, *other.shape)
    unsqueeze = _unsqueeze
    squeeze = _squeeze
    flatten = _flatten
    contiguous = lambda self: self if self._data.flags.c_contiguous else ops.copy(self)
    clone = lambda self: ops.copy(self)
    narrow = _narrow
    select = _select
    split = _split
    chunk = _chunk
    unbind = _unbind
    masked_fill = lambda self, mask, value: ops.masked_fill(self, mask,
                                                            _as_tensor(value, self._make))
