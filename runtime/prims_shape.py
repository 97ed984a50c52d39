"""Shape, view and indexing prims: reshape, permute, expand, slice, cat, gather /
scatter-add, advanced indexing, and as_strided (the geometry that CopySlices uses).

A prim marked ``view=True`` may return an array that aliases its input; the front end
turns such a result into a view Tensor (shared storage and version counter).
"""
from __future__ import annotations

import numpy as np

from compiled_autograd.runtime.lowering import Template, View
from compiled_autograd.runtime.prims import as_array, broadcast_shapes, ops, prim, sum_to

# ---------------------------------------------------------------- views


@prim("reshape", view=True, c=View("reshaped"), meta=lambda x, shape: (tuple(shape), x.dtype))
def reshape(x, shape):
    """A view when the layout allows one, else a copy (numpy decides). ``x``: an
    ndarray or a numpy scalar, as every kernel's array argument."""
    return x.reshape(shape)


@reshape.defvjp
def _(ctx, g):
    return (ops.reshape(g, shape=ctx.shapes[0]),)


@prim("permute", view=True, c=View("permuted"), index_params=("perm",),
      meta=lambda x, perm: (tuple(x.shape[p] for p in perm), x.dtype))
def permute(x, perm):
    return x.transpose(perm)


@permute.defvjp
def _(ctx, g):
    return (ops.permute(g, perm=tuple(int(i) for i in np.argsort(ctx.params["perm"]))),)


@prim("expand", view=True, c=View("expanded"), meta=lambda x, shape: (tuple(shape), x.dtype))
def expand(x, shape):
    """Broadcast to ``shape`` without copying (a read-only stride-0 view)."""
    return np.broadcast_to(x, shape)


@expand.defvjp
def _(ctx, g):
    return (sum_to(g, ctx.shapes[0]),)


def _slice_key(ndim, dim, start, stop, step):
    return (slice(None),) * dim + (slice(start, stop, step),)


def _slice_meta(x, dim, start, stop, step):
    shape = list(x.shape)
    # len(range(...)) by arithmetic, so a symbolic bound stays symbolic
    shape[dim] = max(0, (stop - start + step - 1) // step) if stop > start else 0
    return tuple(shape), x.dtype


@prim("slice", view=True, meta=_slice_meta, c=View("sliced"), index_params=("dim",))
def slice_(x, dim, start, stop, step):
    """``x[..., start:stop:step, ...]`` along ``dim`` (bounds already clipped)."""
    return x[_slice_key(x.ndim, dim, start, stop, step)]


@slice_.defvjp
def _(ctx, g):
    return (ops.slice_backward(g, shape=ctx.shapes[0], **ctx.params),)


@prim("slice_backward",
      meta=lambda g, shape, dim, start, stop, step: (tuple(shape), g.dtype),
      c=Template("slice_backward.c.j2", kind="slice_scatter"), index_params=("dim",))
def slice_backward(g, shape, dim, start, stop, step):
    """Zeros of ``shape`` with ``g`` written into the slice: the slice's gradient."""
    out = np.zeros(shape, dtype=g.dtype)
    out[_slice_key(len(shape), dim, start, stop, step)] = g
    return out


@slice_backward.defvjp
def _(ctx, g):
    p = ctx.params
    return (ops.slice(g, dim=p["dim"], start=p["start"], stop=p["stop"], step=p["step"]),)


def _as_strided_meta(x, shape, strides, offset):
    return tuple(shape), x.dtype


def _strided_view(flat, shape, strides, offset):
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[offset:], shape=shape, strides=tuple(s * item for s in strides))


@prim("as_strided", view=True, meta=_as_strided_meta, c=View("strided"))
def as_strided(x, shape, strides, offset):
    """The view of x's C-order elements with element ``strides`` from ``offset``:
    the geometry of a view relative to its base (what CopySlices records)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    return _strided_view(flat, shape, strides, offset)


@as_strided.defvjp
def _(ctx, g):
    zeros = ops.full_like(g, value=0, shape=ctx.shapes[0])
    return (ops.as_strided_scatter(zeros, g, **ctx.params),)


@prim("as_strided_scatter", meta=lambda base, src, **_: (tuple(base.shape), base.dtype),
      c=Template("as_strided_scatter.c.j2", kind="strided_scatter"))
def as_strided_scatter(base, src, shape, strides, offset):
    """A copy of ``base`` whose ``as_strided(shape, strides, offset)`` view is ``src``."""
    out = np.array(base, order="C", copy=True)
    _strided_view(out.reshape(-1), shape, strides, offset)[...] = src
    return out


@as_strided_scatter.defvjp
def _(ctx, g):
    p = ctx.params
    g_base = g_src = None
    if ctx.needs[0]:
        g_base = ops.as_strided_scatter(g, ops.full_like(g, value=0, shape=p["shape"]), **p)
    if ctx.needs[1]:
        g_src = sum_to(ops.as_strided(g, **p), ctx.shapes[1])
    return g_base, g_src


# ---------------------------------------------------------------- cat


def _cat_meta(*xs, dim):
    shape = list(xs[0].shape)
    shape[dim] = sum(x.shape[dim] for x in xs)
    return tuple(shape), np.result_type(*[x.dtype for x in xs])


@prim("cat", meta=_cat_meta, index_params=("dim",),
      c=Template("cat.c.j2", kind="concat"))
def cat(*xs, dim):
    return np.concatenate(xs, axis=dim)


@cat.defvjp
def _(ctx, g):
    dim, grads, start = ctx.params["dim"], [], 0
    for shape, need in zip(ctx.shapes, ctx.needs):
        stop = start + shape[dim]
        grads.append(ops.slice(g, dim=dim, start=start, stop=stop, step=1) if need else None)
        start = stop
    return tuple(grads)


# ---------------------------------------------------------------- gather / scatter-add


def _along_axis_key(idx, dim, shape):
    """The advanced-indexing key that ``take_along_axis`` uses, for ``np.add.at``."""
    grids = np.ogrid[tuple(slice(n) for n in idx.shape)]
    return tuple(idx if d == dim else grids[d] for d in range(len(shape)))


@prim("gather", save=(1,),
      meta=lambda x, idx, dim: (tuple(idx.shape), x.dtype),
      c=Template("gather.c.j2", kind="gather_scatter", scatter=False), index_params=("dim",))
def gather(x, idx, dim):
    """``out[i][j] = x[i][idx[i][j]]`` along ``dim`` (torch.gather)."""
    return np.take_along_axis(x, idx, axis=dim)


@gather.defvjp
def _(ctx, g):
    (idx,) = ctx.saved
    dim, shape, idx_shape = ctx.params["dim"], ctx.shapes[0], ctx.shapes[1]
    if _one_per_line(shape, idx_shape, dim):
        # One index per line along dim (a class target, an argmax): g where the
        # position is the index, else 0. The same values as scatter_add's zeros
        # with g added, without writing the zeros first: a select, which the C
        # backend computes inside its users' loops (a log-softmax's backward).
        n = shape[dim]
        positions = np.arange(n, dtype=np.int32).reshape((n,) + (1,) * (len(shape) - 1 - dim))
        # (g + 0.0: a -0.0 gradient comes out +0.0, as scatter_add's 0.0 + g gives)
        hit = ops.eq(positions, ops.wrap_index(idx, size=n))
        return ops.where(hit, ops.add(g, 0.0), 0.0), None
    return ops.scatter_add(g, idx, dim=dim, shape=shape), None


def _one_per_line(shape, idx_shape, dim) -> bool:
    """gather's index holds one entry along ``dim`` and spans every other dim of
    the input, all static sizes: each line of the gradient gets one value."""
    sizes = (*shape, *idx_shape)
    return (all(type(d) is int for d in sizes) and len(shape) == len(idx_shape)
            and 0 <= dim < len(shape) and idx_shape[dim] == 1 and 0 < shape[dim] < 2 ** 31
            and all(a == b for d, (a, b) in enumerate(zip(shape, idx_shape)) if d != dim))


@prim("wrap_index", meta=lambda idx, size: (tuple(idx.shape), np.dtype(np.int32)),
      differentiable=False, c=Template("wrap_index.c.j2", kind="index_check"))
def wrap_index(idx, size):
    """``idx`` with each entry in [-size, size) made non-negative (take_along_axis's
    rule), as int32 (size < 2**31); an entry out of that range raises IndexError,
    as scatter_add's would."""
    idx = np.asarray(idx)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise IndexError(f"index {int(idx[bad][0])} is out of bounds for dimension "
                         f"with size {size}")
    return as_array(np.where(idx < 0, idx + size, idx).astype(np.int32))


@prim("scatter_add", save=(1,),
      meta=lambda src, idx, dim, shape: (tuple(shape), src.dtype),
      c=Template("gather.c.j2", kind="gather_scatter", scatter=True), index_params=("dim",))
def scatter_add(src, idx, dim, shape):
    """Zeros of ``shape`` with ``src`` added at ``idx`` along ``dim`` (duplicates add)."""
    out = np.zeros(shape, dtype=src.dtype)
    np.add.at(out, _along_axis_key(idx, dim, shape), src)
    return out


@scatter_add.defvjp
def _(ctx, g):
    (idx,) = ctx.saved
    return ops.gather(g, idx, dim=ctx.params["dim"]), None


# ---------------------------------------------------------------- advanced indexing


def _index_key(indices, pattern):
    """``pattern`` has one entry per indexed dim: None for a full slice, or the
    position of the index array among ``indices``."""
    return tuple(slice(None) if p is None else indices[p] for p in pattern)


def _index_meta(x, *indices, pattern):
    # numpy's rule: adjacent index arrays replace their dims in place; separated
    # ones move the broadcast index shape to the front. Boolean masks were turned
    # into integer indices by the front end, so the shape is static.
    b = broadcast_shapes(*[tuple(i.shape) for i in indices])
    dims = [d for d, p in enumerate(pattern) if p is not None]
    rest = tuple(x.shape[len(pattern):])
    if dims == list(range(dims[0], dims[-1] + 1)):
        shape = tuple(x.shape[:dims[0]]) + b + tuple(x.shape[dims[-1] + 1:len(pattern)]) + rest
    else:
        shape = b + tuple(x.shape[d] for d, p in enumerate(pattern) if p is None) + rest
    return shape, x.dtype


@prim("index", save=("tail",), meta=_index_meta, index_params=("pattern",),
      c=Template("index.c.j2", kind="advanced_index", accumulate=False))
def index(x, *indices, pattern):
    """numpy/torch advanced indexing with integer or boolean index arrays."""
    return as_array(x[_index_key(indices, pattern)])


@index.defvjp
def _(ctx, g):
    indices = ctx.saved[0]
    grad = ops.index_accumulate(g, *indices, shape=ctx.shapes[0], pattern=ctx.params["pattern"])
    return (grad,) + (None,) * len(indices)


@prim("index_accumulate", save=("tail",),
      meta=lambda src, *indices, shape, pattern: (tuple(shape), src.dtype),
      c=Template("index.c.j2", kind="advanced_index", accumulate=True), index_params=("pattern",))
def index_accumulate(src, *indices, shape, pattern):
    """Zeros of ``shape`` with ``src`` added at the indexed places (duplicates add):
    the gradient of ``index``."""
    out = np.zeros(shape, dtype=src.dtype)
    np.add.at(out, _index_key(indices, pattern), src)
    return out


@index_accumulate.defvjp
def _(ctx, g):
    indices = ctx.saved[0]
    return (ops.index(g, *indices, pattern=ctx.params["pattern"]),) + (None,) * len(indices)
