"""Autograd Nodes: the backward graph that a forward pass records.

``Node`` is the base: ``next_functions`` (one edge ``(node, input_nr)`` per input of
the forward op, None where no gradient flows), ``name()``, ``metadata``, and

- ``apply(grads)``: the eager backward of the node;
- ``compiled_args(args)``: collect everything the backward depends on (the cache key
  of compiled autograd): node type, non-tensor attributes, saved-tensor metadata;
- ``apply_with_saved(grads, saved)``: run the *same* derivative formula with each
  saved value swapped for what ``saved.before`` gives (a proxy, when tracing).

``PrimBackward`` is one class per differentiable prim (``MulBackward``, ...), made
from the prim table, so a derivative is written once, in prims, and serves both
``apply`` and ``apply_with_saved``.
"""
from __future__ import annotations

import itertools
import weakref

import numpy as np

from compiled_autograd.autograd.saved_variable import SavedVariable
from runtime.memory import on_array
from runtime.prims import PRIMS, VJPContext, ops

_sequence = itertools.count()


class Node:
    """Base of every autograd node."""

    # The attributes every walk reads are members (read by offset: native_walk_tables.c);
    # hooks and a custom Function's ctx attributes live in the instance __dict__.
    __slots__ = ("next_functions", "input_metadata", "_sequence_nr", "_metadata",
                 "__dict__", "__weakref__")

    # AccumulateGrad runs as soon as it is ready (torch gives it the top priority).
    _priority = 1
    accumulates_grad = False   # True for AccumulateGrad: its ``variable`` is a leaf

    def __init__(self, next_functions, input_metadata):
        self.next_functions = tuple(next_functions)
        # (shape, dtype) of each gradient this node receives (= forward outputs).
        self.input_metadata = tuple(input_metadata)
        self._sequence_nr = next(_sequence)
        self._metadata = None

    def name(self) -> str:
        return type(self).__name__

    @property
    def metadata(self) -> dict:
        if self._metadata is None:
            self._metadata = {}
        return self._metadata

    def register_prehook(self, fn):
        """``fn(grad_outputs) -> new grad_outputs or None`` before the node runs."""
        from compiled_autograd.autograd.hooks import register_node_prehook
        return register_node_prehook(self, fn)

    def register_hook(self, fn):
        """``fn(grad_inputs, grad_outputs) -> new grad_inputs or None`` after it runs."""
        from compiled_autograd.autograd.hooks import register_node_hook
        return register_node_hook(self, fn)

    def saved_variables(self):
        """The SavedVariables this node holds (for checks and release)."""
        return ()

    def check_saved(self) -> None:
        for sv in self.saved_variables():
            sv.check(self.name())

    def release_variables(self) -> None:
        for sv in self.saved_variables():
            sv.release()

    def static_needs(self):
        needs = self.__dict__.get("_static_needs")
        if needs is None:
            needs = self._static_needs = tuple(fn is not None for fn, _ in self.next_functions)
        return needs

    def apply(self, grads, needs=None):
        raise NotImplementedError(f"{self.name()}.apply")

    def compiled_args(self, args) -> None:
        raise NotImplementedError(f"{self.name()}.compiled_args")

    def apply_with_saved(self, grads, saved):
        raise NotImplementedError(f"{self.name()}.apply_with_saved")

    def __repr__(self):
        return f"<{self.name()} object at {id(self):#x}>"


class PrimBackward(Node):
    """The backward of one prim call. Subclassed once per prim (see node_class)."""

    prim = None  # set on each subclass
    __slots__ = ("saved", "params", "shapes", "dtypes")

    def __init__(self, next_functions, input_metadata, saved, params, shapes, dtypes):
        super().__init__(next_functions, input_metadata)
        # saved: one entry per save-spec item: a SavedVariable, a Python scalar,
        # None (not needed), or a tuple of SavedVariables (the "tail" item).
        self.saved = saved
        self.params = params
        self.shapes = shapes
        self.dtypes = dtypes

    def saved_variables(self):
        out = []
        for item in self.saved:
            if item.__class__ is tuple:
                out.extend(sv for sv in item if sv.__class__ is SavedVariable)
            elif item.__class__ is SavedVariable:
                out.append(item)
        return out

    def release_variables(self) -> None:
        for item in self.saved:
            if item.__class__ is SavedVariable:
                item.release()
            elif item.__class__ is tuple:
                for sv in item:
                    if sv.__class__ is SavedVariable:
                        sv.release()

    def _unpack(self, as_tensor):
        name = self.name()
        out = []
        for item in self.saved:
            if isinstance(item, tuple):
                out.append(tuple(sv.unpack(self) if as_tensor else sv.unpack_array(name)
                                 for sv in item))
            elif hasattr(item, "unpack_array"):
                out.append(item.unpack(self) if as_tensor else item.unpack_array(name))
            else:
                out.append(item)
        return tuple(out)

    def run_formula(self, grads, needs, saved_values):
        ctx = VJPContext(saved_values, self.params, self.shapes, self.dtypes, needs)
        out = self.prim.vjp(ctx, grads[0])
        # Mixed-dtype ops (float32 * float64): each gradient takes its input's dtype.
        for i, g in enumerate(out):
            if g is not None and g.dtype != self.dtypes[i]:
                out = out[:i] + (ops.astype(g, dtype=self.dtypes[i]),) + out[i + 1:]
        return out

    def apply(self, grads, needs=None):
        g = grads[0]
        as_tensor = type(g) is not np.ndarray
        if needs is None:
            needs = self.static_needs()
        return self.run_formula(grads, needs, self._unpack(as_tensor))

    def compiled_args(self, args) -> None:
        # type, params (their ints as sizes), input sizes, dtypes, saved values;
        # saved Python floats are lifted into scalars, not keyed.
        args.collect_prim_node(self)

    def apply_with_saved(self, grads, saved):
        values = []
        for i, item in enumerate(self.saved):
            if isinstance(item, tuple):
                values.append(tuple(saved.before(sv) for sv in item))
            elif hasattr(item, "unpack_array"):
                values.append(saved.before(item))
            elif type(item) is float:
                values.append(saved.scalar((id(self), i), item))
            else:
                values.append(item)
        shapes = saved.sizes(self, self.shapes)
        params = saved.params(self, self.params)
        try:
            ctx = VJPContext(tuple(values), params, shapes, self.dtypes, saved.needs(self))
            out = self.prim.vjp(ctx, grads[0])
            return tuple(g if g is None or g.dtype == self.dtypes[i]
                         else ops.astype(g, dtype=self.dtypes[i]) for i, g in enumerate(out))
        finally:
            for item in self.saved:
                for sv in (item if isinstance(item, tuple) else (item,)):
                    if hasattr(sv, "unpack_array"):
                        saved.after(sv)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


NODE_CLASSES: dict[str, type] = {}


def node_class(prim) -> type:
    """The Node subclass for a prim, e.g. ``MulBackward`` for ``mul``."""
    cls = NODE_CLASSES.get(prim.name)
    if cls is None:
        cls = type(f"{_camel(prim.name)}Backward", (PrimBackward,),
                   {"prim": prim, "__module__": __name__,
                    "__doc__": f"Backward of the prim ``{prim.name}``."})
        NODE_CLASSES[prim.name] = cls
    return cls


for _p in PRIMS.values():
    if _p.differentiable:
        node_class(_p)


class AccumulateGrad(Node):
    """Sink of a leaf tensor: adds the incoming gradient into ``variable.grad``."""

    _priority = 0
    accumulates_grad = True
    __slots__ = ("variable",)

    def __init__(self, variable):
        super().__init__((), ((variable.shape, variable.dtype),))
        self.variable = variable

    def apply(self, grads, needs=None):
        accumulate_into(self.variable, grads[0])
        return ()

    def compiled_args(self, args) -> None:
        args.collect_leaf(self.variable, type(self))

    def apply_with_saved(self, grads, saved):
        saved.accumulate_grad(self.variable, grads[0])
        return ()


def accumulate_into(variable, g, owned=False) -> None:
    """torch's AccumulateGrad: the first gradient is stored (a copy, since arrays
    flowing through the backward may be shared views, unless the caller ``owned``
    a fresh C-contiguous array nobody else holds); later ones are added in place,
    so ``.grad`` stays the same object. Under create_graph (Tensor gradients)
    accumulation is out of place and differentiable."""
    Tensor = _tensor_class()
    grad = variable.grad
    if type(g) is not np.ndarray and isinstance(g, Tensor):
        # A copy (differentiable): g may be shared with another leaf or be the
        # caller's own gradient tensor.
        variable.grad = ops.copy(g) if grad is None else grad + g
        return
    if grad is None:
        dtype = variable._data.dtype
        if owned and g.dtype == dtype and g.flags.c_contiguous:
            stored = g
        else:
            stored = np.array(g, dtype=dtype, order="C", copy=True)
            on_array(stored, "AccumulateGrad")
        variable.grad = Tensor._make(stored)
    elif grad.requires_grad:
        stored = np.add(grad._data, g)
        on_array(stored, "AccumulateGrad")
        variable.grad = Tensor._make(stored)
    else:
        np.add(grad._data, g, out=grad._data, casting="same_kind")
        grad._version_counter.value += 1


_tensor = []


def _tensor_class():
    """Tensor (imported on first use: tensor.py imports this module)."""
    if not _tensor:
        from compiled_autograd.autograd.tensor import Tensor
        _tensor.append(Tensor)
    return _tensor[0]


def grad_accumulator(tensor) -> AccumulateGrad:
    """The (cached, weakly held) AccumulateGrad node of a leaf that requires grad."""
    ref = tensor._grad_acc_ref
    acc = ref() if ref is not None else None
    if acc is None:
        acc = AccumulateGrad(tensor)
        tensor._grad_acc_ref = weakref.ref(acc)
    return acc


class CopySlices(Node):
    """An in-place op on a view, seen from the base (torch's CopySlices; see the
    note "View + Inplace update for base tensor"). ``fn`` is the in-place op's
    node; the view is recovered from the base's gradient by its geometry
    (as_strided), and the gradient of the view's old value is written back."""

    def __init__(self, base_edge, base_meta, geometry, fn):
        super().__init__((base_edge,) + fn.next_functions[1:], (base_meta,))
        self.geometry = geometry  # dict(shape=, strides=, offset=) in base elements
        self.fn = fn

    def saved_variables(self):
        return self.fn.saved_variables()

    def _run(self, g, needs, call_fn, geometry=None):
        from runtime.prims import ops
        geometry = geometry or self.geometry
        view_grad = ops.as_strided(g, **geometry)
        # The view's old value needs a gradient exactly when the base's old value
        # does, whatever fn's own edge says (the note's exec_info point).
        fn_needs = (needs[0],) + tuple(needs[1:])
        res = call_fn(view_grad, fn_needs)
        grad_base = None
        if needs[0]:
            src = res[0] if res[0] is not None else ops.full_like(view_grad, value=0)
            grad_base = ops.as_strided_scatter(g, src, **geometry)
        return (grad_base,) + tuple(res[1:])

    def apply(self, grads, needs=None):
        if needs is None:
            needs = self.static_needs()
        return self._run(grads[0], needs, lambda vg, n: self.fn.apply([vg], n))

    def compiled_args(self, args) -> None:
        args.collect(type(self))
        args.collect_params(self.geometry, owner=self)
        self.fn.compiled_args(args)

    def apply_with_saved(self, grads, saved):
        geometry = saved.params(self, self.geometry)
        return self._run(grads[0], saved.needs(self),
                         lambda vg, n: self.fn.apply_with_saved([vg], saved.with_needs(n)),
                         geometry)
