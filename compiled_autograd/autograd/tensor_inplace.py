"""Indexing (``x[key]``, ``x[key] = v``, ``x.gather``) and in-place ops (``add_``,
``mul_``, ...).

Indexing follows torch: ints, slices, None and Ellipsis are views (select, slice,
unsqueeze), applied first; then integer/boolean index arrays gather through the
``index`` prim (a boolean mask becomes integer indices, as in torch). In-place ops
run the prim out of place, write into the storage and rebase history
(``dispatch.apply_inplace``); on a view that is torch's CopySlices.
"""
from __future__ import annotations

import numpy as np

from compiled_autograd.autograd.dispatch import apply_inplace
from compiled_autograd.autograd.tensor_base import TensorBase
from compiled_autograd.autograd.tensor_methods import _alias, _as_tensor, _promote, _scalar, _select
from compiled_autograd.runtime.prims import PRIMS, norm_dim, ops


def _is_index_array(k):
    return isinstance(k, (TensorBase, np.ndarray, list)) and np.ndim(
        k._data if isinstance(k, TensorBase) else k) > 0


def _key_item(k):
    """A 0-d integer Tensor/array indexes like an int (as in torch); lists become
    arrays; boolean and integer arrays stay index arrays."""
    if isinstance(k, TensorBase):
        k = k._data
    if isinstance(k, (list, np.ndarray)):
        k = np.asarray(k)
        if k.ndim == 0 and k.dtype.kind in "iu":
            return int(k)
    return k


def _dims_consumed(k):
    if k is None or k is Ellipsis:
        return 0
    if isinstance(k, np.ndarray) and k.dtype == bool:
        return k.ndim
    return 1


def _normalize_key(self, key):
    key = tuple(_key_item(k) for k in (key if isinstance(key, tuple) else (key,)))
    consumed = sum(_dims_consumed(k) for k in key)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > self.ndim:
        raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
    for i, k in enumerate(key):
        if k is Ellipsis:
            key = key[:i] + (slice(None),) * (self.ndim - consumed) + key[i + 1:]
            break
    return key


def _check_broadcast(arrays):
    """torch's error for index arrays of shapes that do not broadcast together."""
    try:
        np.broadcast_shapes(*(a.shape for a in arrays))
    except ValueError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together "
                         f"with shapes {', '.join(str(list(a.shape)) for a in arrays)}") from None


def _is_zero_d_mask(k):
    return isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype == bool


def _index_parts(arr, dim, shape):
    """The int64 index arrays (non-negative) that index array ``arr`` stands for
    at ``dim`` of ``shape``: one per dim a boolean mask covers, else one."""
    if arr.dtype == bool:
        for j, n in enumerate(arr.shape):
            if dim + j >= len(shape) or shape[dim + j] != n:
                raise IndexError(f"The shape of the mask {list(arr.shape)} at index {j} does "
                                 f"not match the shape of the indexed tensor {list(shape)} at "
                                 f"index {dim + j}")
        return [part.astype(np.int64) for part in np.nonzero(arr)]
    if arr.dtype.kind not in "iu":
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    n = shape[dim]
    if arr.size and (arr.max() >= n or arr.min() < -n):
        bad = arr.max() if arr.max() >= n else arr.min()
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {n}")
    return [np.where(arr < 0, arr + n, arr).astype(np.int64)]


def _getitem(self, key):
    key = _normalize_key(self, key)
    out, dim, advanced = self, 0, []
    for k in key:
        if k is None:
            out = out.unsqueeze(dim)
            dim += 1
        elif isinstance(k, slice):
            n = out.shape[dim]
            start, stop, step = k.indices(n)
            if step <= 0:
                raise ValueError("step must be greater than zero")
            stop = max(stop, start)
            if (start, stop, step) != (0, n, 1):
                out = ops.slice(out, dim=dim, start=start, stop=stop, step=step)
            dim += 1
        elif _is_zero_d_mask(k):
            # A 0-d mask adds a dim: of size 1 (True) or 0 (False), as in torch;
            # next to index arrays it is one of them ([0] or [] on that dim).
            out = out.unsqueeze(dim)
            if any(_is_index_array(other) for other in key):
                advanced.append((dim, np.zeros(1 if k else 0, np.int64)))
            elif not k:
                out = ops.slice(out, dim=dim, start=0, stop=0, step=1)
            dim += 1
        elif _is_index_array(k):
            for part in _index_parts(k, dim, out.shape):
                advanced.append((dim, part))
                dim += 1
        elif isinstance(k, (int, np.integer)):
            out = _select(out, dim, int(k))
        else:
            raise IndexError("only integers, slices (`:`), ellipsis (`...`), None and long or "
                             f"byte Variables are valid indices (got {type(k).__name__})")
    if not advanced:
        return out if out is not self else _alias(self)
    _check_broadcast([a for _, a in advanced])
    pattern = [None] * (advanced[-1][0] + 1)
    indices = []
    for pos, (d, arr) in enumerate(advanced):
        pattern[d] = pos
        indices.append(self._make(arr))
    return ops.index(out, *indices, pattern=tuple(pattern))


def _setitem(self, key, value):
    key_t = tuple(_key_item(k) for k in (key if isinstance(key, tuple) else (key,)))
    value = _as_tensor(value, self._make)
    if not any(_is_index_array(k) for k in key_t):
        _inplace("masked_fill", _getitem(self, key_t), True, value)  # a view, copied into
        return
    if not all(_is_index_array(k) or _is_zero_d_mask(k) for k in key_t):
        key_t = _places(self, key_t)
    _index_put_(self, key_t, value)


def _places(self, key):
    """Index arrays mixed with ints, slices, None or ``...``: the places they select,
    laid out as the indexing result, as one index array per dim. As torch (and as
    ``_getitem``), ints select first; then numpy's rule, which is torch's for the
    rest: the advanced dims go first when they are not adjacent."""
    key = _normalize_key(self, key)
    _check_broadcast([k for k in key if _is_index_array(k)])
    ints, rest = [], []
    for k in key:
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            ints.append(int(k))
            continue
        rest.append(k)
        if k is not None:
            ints.extend([slice(None)] * _dims_consumed(k))
    try:
        places = np.arange(self.numel()).reshape(self.shape)[tuple(ints)][tuple(rest)]
    except IndexError as e:
        raise IndexError(str(e).replace("for axis", "for dimension")) from None
    return tuple(np.unravel_index(places, self.shape))


def _index_put_(self, key, value):
    """``x[arrays] = value``: torch's index_put_ (the selected places, in order)."""
    parts, arrays = [], []      # arrays: parts, and each 0-d mask as [0] or []
    for k in _normalize_key(self, key):
        if _is_zero_d_mask(k):
            # Next to index arrays a 0-d mask is [0] (True: it selects the same
            # places) or [] (False: it broadcasts with no other, as in torch).
            arrays.append(np.zeros(1 if k else 0, np.int64))
            continue
        new = _index_parts(k, len(parts), self.shape)
        parts += new
        arrays += new
    _check_broadcast(arrays)
    sel = np.zeros(self.shape, dtype=bool)
    sel[tuple(parts)] = True
    picked = self._data[tuple(parts)]  # only for the selected shape and the duplicate check
    if sel.sum() != picked.size:
        raise RuntimeError("index_put_ with duplicate indices is not supported: the value "
                           "written would depend on the order of the writes")
    mask = self._make(sel)
    if not isinstance(value, TensorBase) or value.ndim == 0:
        _inplace("masked_fill", self, mask, value)
        return
    try:
        if tuple(value.shape) != picked.shape:
            value = value.expand(*picked.shape)
    except RuntimeError:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(value.shape)} cannot "
                           f"be broadcast to indexing result of shape "
                           f"{list(picked.shape)}") from None
    scattered = ops.index_accumulate(value.to(self.dtype), *map(self._make, parts),
                                     shape=self.shape, pattern=tuple(range(len(parts))))
    apply_inplace(PRIMS["masked_fill"], (self, mask, scattered), {})


# ---------------------------------------------------------------- in-place ops


def _inplace(name, target, *args, **params):
    if isinstance(target, TensorBase) and args and isinstance(args[-1], TensorBase) and \
            name != "masked_fill":
        target_, other = _promote(target, args[-1])
        args = args[:-1] + (other if isinstance(other, TensorBase) else other,)
    return apply_inplace(PRIMS[name], (target,) + tuple(args), params)


def _check_float_target(target, other):
    other_float = isinstance(other, float) or (
        isinstance(other, TensorBase) and other.dtype.kind in "fc")
    if other_float and target.dtype.kind not in "fc":
        raise RuntimeError(f"result type Float can't be cast to the desired output type "
                           f"{target.dtype.name}")


def _additive_(name):
    """``add_``/``sub_``: ``self op= alpha * other``."""
    def op(self, other, alpha=1):
        other = _as_tensor(other, self._make)
        _check_float_target(self, other)
        if alpha != 1:
            other = other * alpha
        return _inplace(name, self, other)
    op.__name__ = f"{name}_"
    return op


_add_, _sub_ = _additive_("add"), _additive_("sub")


def _mul_(self, other):
    other = _as_tensor(other, self._make)
    _check_float_target(self, other)
    return _inplace("mul", self, other)


def _div_(self, other):
    other = _as_tensor(other, self._make)
    if self.dtype.kind not in "fc":
        raise RuntimeError(f"result type Float can't be cast to the desired output type "
                           f"{self.dtype.name}")
    return _inplace("div", self, other)


def _fill_(self, value):
    value = _scalar(_as_tensor(value, self._make))
    return apply_inplace(PRIMS["masked_fill"], (self, True, value), {})


def _copy_(self, src):
    src = _as_tensor(src, self._make)
    if isinstance(src, TensorBase) and src.dtype != self.dtype:
        src = src.to(self.dtype)
    return apply_inplace(PRIMS["masked_fill"], (self, True, src), {})


def _clamp_(self, min=None, max=None):
    return apply_inplace(PRIMS["clamp"], (self,), dict(min=_scalar(min), max=_scalar(max)))


def _gather(self, dim, index):
    """torch.gather: ``out[i][j] = self[i][index[i][j]]`` along ``dim``. ``index``:
    int32 or int64, as many dims as self (a 0-d one counts as 1-d, as in torch)
    and no larger in the others, entries in [0, size)."""
    d = norm_dim(dim, max(self.ndim, 1))
    idx = index._data if isinstance(index, TensorBase) else np.asarray(index)
    if idx.dtype not in (np.int32, np.int64):
        raise RuntimeError("gather(): Expected dtype int32/int64 for index")
    if max(idx.ndim, 1) != max(self.ndim, 1):
        raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    x = self.reshape(1) if self.ndim == 0 else self
    lines = idx.reshape(1) if idx.ndim == 0 else idx
    for k in range(x.ndim):
        if k != d and lines.shape[k] > x.shape[k]:
            raise RuntimeError(f"Size does not match at dimension {k} expected index "
                               f"{list(idx.shape)} to be no larger than self "
                               f"{list(self.shape)} apart from dimension {d}")
    n = x.shape[d]
    bad = lines[(lines < 0) | (lines >= n)]
    if bad.size:
        raise RuntimeError(f"index {int(bad[0])} is out of bounds for dimension {d} "
                           f"with size {n}")
    for k in range(x.ndim):
        if k != d and lines.shape[k] < x.shape[k]:
            x = x.narrow(k, 0, lines.shape[k])
    out = ops.gather(x, self._make(np.ascontiguousarray(lines)), dim=d)
    return out.reshape(()) if idx.ndim == 0 else out


class InplaceMethods:
    """Indexing and in-place ops of a Tensor (a base of Tensor)."""

    __slots__ = ()

    __getitem__ = _getitem
    gather = _gather
    __setitem__ = _setitem
    add_ = __iadd__ = _add_
    sub_ = __isub__ = _sub_
    mul_ = __imul__ = _mul_
    div_ = __itruediv__ = _div_
    fill_ = _fill_
    zero_ = lambda self: _fill_(self, 0)
    copy_ = _copy_
    relu_ = lambda self: apply_inplace(PRIMS["relu"], (self,), {})
    clamp_ = _clamp_
    masked_fill_ = lambda self, mask, value: apply_inplace(
        PRIMS["masked_fill"], (self, mask, _as_tensor(value, self._make)), {})
