"""The primitive set ("prims"): one table that every layer uses.

Each prim declares, in one place, its name, its numpy kernel, its shape/dtype rule
(``meta``), what its derivative needs saved (``save``), its derivative (``vjp``)
written in prims, whether its result aliases its input (``view``), how it lowers to C
(``c``: a record of ``compiled_autograd.runtime.lowering`` -- an elementwise expression, a reduction,
a view's layout, a kernel template -- that the C backend dispatches on) and which
of its params index dims rather than give sizes (``index_params``: a cache key
holds them by value, never as symbolic sizes). The definitions live in
``prims_elementwise``, ``prims_shape`` and ``prims_reduce``; this module holds the
machinery and the table, ``PRIMS``.

Calling a prim dispatches on its arguments, like ``__torch_function__``: if an
argument's type defines ``__prim_call__(prim, args, params)`` that handler runs (the
front end's ``Tensor`` builds a differentiable op; the tracer's proxy records a graph
node); otherwise the numpy kernel runs. That is how one derivative formula serves
eager execution (arrays), double backward (Tensors) and tracing (proxies), while this
layer imports nothing above it.

Calling convention: positional arguments are the prim's *inputs* (arrays, or Python
scalars as constants); keyword arguments are its static *params* (ints, tuples,
dtypes), hashable so that they can be part of a cache key.
"""
from __future__ import annotations

import numpy as np

PRIMS: dict[str, "Prim"] = {}

# Called as hook(prim, out, args) after every kernel while memory is being
# accounted (compiled_autograd.runtime.memory installs it); None otherwise.
_kernel_hook = None


def set_kernel_hook(hook) -> None:
    global _kernel_hook
    _kernel_hook = hook


def run_kernel(prim, args, params):
    """Run ``prim``'s numpy kernel: the single place where prims compute."""
    out = prim.kernel(*args, **params)
    if _kernel_hook is not None:
        _kernel_hook(prim, out, args)
    return out

# Save-spec entries: an int (that input), "out" (the result), "tail" (every input
# after the first, for index arrays), or (entry, j): that entry only when input j
# needs a gradient -- mul saves `other` only if `self` needs a gradient.
SaveSpec = tuple


class Prim:
    """One primitive op. Calling it dispatches (see the module docstring)."""

    __slots__ = ("name", "kernel", "meta", "save", "vjp", "view", "differentiable",
                 "c", "index_params", "method", "doc")

    def __init__(self, name, kernel, meta, save, view, differentiable, c, index_params,
                 method=None):
        self.name = name
        self.kernel = kernel
        self.meta = meta
        self.save = save
        self.vjp = None
        self.view = view
        self.differentiable = differentiable
        self.c = c
        self.index_params = tuple(index_params)
        if method not in (None, "plain", "float"):
            raise ValueError(f"prim {name}: method must be None, 'plain' or 'float', "
                             f"got {method!r}")
        self.method = method
        self.doc = kernel.__doc__

    def __call__(self, *args, **params):
        # The argument type with the highest __prim_priority__ handles the call (a
        # tracing proxy outranks a Tensor, which outranks an ndarray).
        handler, best = None, 0
        for a in args:
            t = type(a)
            h = getattr(t, "__prim_call__", None)
            if h is not None and t.__prim_priority__ > best:
                handler, best = h, t.__prim_priority__
        if handler is not None:
            return handler(self, args, params)
        out = self.kernel(*args, **params)
        if _kernel_hook is not None:
            _kernel_hook(self, out, args)
        return out

    def defvjp(self, fn):
        """Register the derivative: ``fn(ctx, g) -> tuple of input gradients``."""
        if not self.differentiable:
            raise RuntimeError(f"prim {self.name} is declared non-differentiable")
        self.vjp = fn
        return fn

    def __repr__(self):
        return f"<prim {self.name}>"


class Ops:
    """Attribute access to every prim: ``ops.mul(a, b)``. Filled by ``prim``."""

    def __getattr__(self, name):
        raise AttributeError(f"no prim named {name!r}")


ops = Ops()


def prim(name, *, meta, c, save: SaveSpec = (), view=False, differentiable=True,
         index_params=(), method=None):
    """Decorator that turns a numpy kernel into a registered prim. ``c`` (its C
    lowering, a ``compiled_autograd.runtime.lowering`` record) has no default: a prim without one
    fails here, not when the C backend first meets it. ``method``: the prim is also
    ``x.<name>()`` and ``ca.<name>(x)`` -- "plain", or "float" (an integer input is
    promoted to the default float first, as torch's exp)."""
    def register(kernel):
        if name in PRIMS:
            raise RuntimeError(f"prim {name} registered twice")
        p = Prim(name, kernel, meta, save, view, differentiable, c, index_params, method)
        PRIMS[name] = p
        setattr(ops, name, p)
        return p
    return register


def index_param_names() -> frozenset:
    """Every param name that some prim declares an index (a dim, a permutation):
    the front end splits a params dict into key and sizes by name alone."""
    return frozenset(n for p in PRIMS.values() for n in p.index_params)


class VJPContext:
    """What a derivative formula may read: saved values (aligned with the prim's
    save spec; None where not saved), the static params, the inputs' shapes and
    dtypes (None for Python-scalar inputs) and which inputs need a gradient."""

    __slots__ = ("saved", "params", "shapes", "dtypes", "needs")

    def __init__(self, saved, params, shapes, dtypes, needs):
        self.saved = saved
        self.params = params
        self.shapes = shapes
        self.dtypes = dtypes
        self.needs = needs


# ---------------------------------------------------------------- shared helpers

def shape_of(a):
    """Shape of an array, Tensor or proxy; () for a Python scalar."""
    return a.shape if hasattr(a, "shape") else ()


def dtype_of(a):
    """dtype of an array-like; for a Python scalar a plain scalar of its kind, which
    numpy's result_type treats as weak (NEP 50), as torch does. (A subclass of
    float or int -- a symbolic scalar -- would not be weak: numpy makes it float64.)"""
    if hasattr(a, "dtype"):
        return a.dtype
    if isinstance(a, bool):
        return False
    if isinstance(a, int):
        return 0
    if isinstance(a, float):
        return 0.0
    return a


def as_array(x):
    """numpy ufuncs return numpy scalars for 0-d inputs; kernels return arrays."""
    return x if type(x) is np.ndarray else np.asarray(x)


def norm_dim(dim, ndim):
    """A dim in [-ndim, ndim) made non-negative, with torch's message."""
    lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not lo <= dim <= hi:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{lo}, {hi}], but got {dim})")
    return dim + ndim if dim < 0 else dim


def sum_to(g, shape):
    """Reduce a broadcast gradient ``g`` back to ``shape`` (written in prims)."""
    gshape = shape_of(g)
    if tuple(gshape) == tuple(shape):
        return g
    lead = len(gshape) - len(shape)
    dims = tuple(range(lead)) + tuple(
        i + lead for i, s in enumerate(shape) if s == 1 and gshape[i + lead] != 1)
    if dims:
        g = ops.sum(g, dims=dims, keepdim=True)
    return ops.reshape(g, shape=tuple(shape))


def is_scalar(x):
    return isinstance(x, (int, float, bool))


def broadcast_shapes(*shapes):
    """numpy's broadcasting rule, keeping the dim objects themselves (a symbolic
    size stays symbolic; numpy's own version would turn it into a plain int)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        dims = [s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0]
        big = [d for d in dims if d != 1]
        if not big:
            out.append(1)
            continue
        for d in big[1:]:
            if d != big[0]:
                raise ValueError(f"shape mismatch: objects cannot be broadcast to a single "
                                 f"shape. Mismatch is between {list(shapes[0])} and "
                                 f"{list(shapes[-1])}")
        out.append(next((d for d in big if not type(d) is int), big[0]))
    return tuple(out)


def elementwise_meta(*args, **_):
    return broadcast_shapes(*map(shape_of, args)), np.result_type(*map(dtype_of, args))


def same_meta(x, *_, **__):
    return tuple(x.shape), x.dtype


def compare_meta(*args, **_):
    return broadcast_shapes(*map(shape_of, args)), np.dtype(bool)
