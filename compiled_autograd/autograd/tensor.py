"""Tensor: an ndarray storage plus autograd state and view metadata, and its ops.

``Tensor`` is the top of the autograd core. Its state and metadata come from
``TensorBase`` (what the layers below know of a tensor), its ops from
``TensorMethods`` and ``InplaceMethods``; here are what needs the whole core:
``__prim_call__`` (a prim called on Tensors records history: ``dispatch``),
``backward`` (the engine), hook registration, and a view's ``grad_fn``, which is
rebuilt after an in-place change through its base.
"""
from __future__ import annotations

from functools import partial


from compiled_autograd.autograd import dispatch, engine, hooks
from compiled_autograd.autograd.grad_mode import is_grad_enabled
from compiled_autograd.autograd.node import gradient_edge, node_class
from compiled_autograd.autograd.tensor_base import TensorBase, as_ndarray
from compiled_autograd.autograd.tensor_inplace import InplaceMethods
from compiled_autograd.autograd.tensor_methods import TensorMethods
from compiled_autograd.runtime.memory import on_array
from compiled_autograd.runtime.prims import PRIMS, norm_dim


def _make(data):
    """A new Tensor over ``data`` with no history (every op's result is made here)."""
    t = object.__new__(Tensor)
    t._data = data             # (_init, one call fewer)
    t._init_state()
    return t


class Tensor(TensorBase, TensorMethods, InplaceMethods):
    """A tensor that records the history autograd differentiates (torch.Tensor's API)."""

    __slots__ = ()

    _make = staticmethod(_make)
    __prim_call__ = staticmethod(partial(dispatch.apply_prim, make=_make))
    __prim_priority__ = 1
    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected op

    def __init__(self, data, requires_grad=False, dtype=None):
        """Prefer ``ca.tensor``; this wraps ``data`` like it."""
        self._init(as_ndarray(data, dtype))
        on_array(self._data, "ca.tensor")
        self.requires_grad = requires_grad

    # ------------------------------------------------------------ autograd state

    @property
    def grad_fn(self):
        if self._base is not None and self._view_version != self._version_counter.value:
            self._regenerate_view_grad_fn()
        return self._grad_fn

    def _regenerate_view_grad_fn(self):
        """After an in-place change through the base or another view, this view's
        history is a view (as_strided) of the base's new history."""
        base = self._base
        if self._creation == "no_grad" and dispatch._needs_grad(base):
            raise dispatch._view_rebase_error(self, indirect=True)     # (torch's, each time)
        self._view_version = self._version_counter.value
        if self._grad_fn is None and (self._requires_grad or self._creation == "no_grad"):
            return  # a leaf view given requires_grad itself, or one made without history
        base_edge = gradient_edge(base)
        if base_edge[0] is None:
            self._grad_fn = None
            return
        geometry = dispatch.view_geometry(self, base)
        old_fn, old_nr = self._grad_fn, self._output_nr
        self._grad_fn = node_class(PRIMS["as_strided"])(
            (base_edge,), ((self.shape, self.dtype),), (), geometry, (base.shape,),
            (base.dtype,))
        self._output_nr = 0
        if self._retains_grad:   # (retain_grad is a hook on the grad_fn: it moves too)
            hooks.move_retain_grad(self, old_fn, old_nr)

    @property
    def requires_grad(self) -> bool:
        # (torch's: a view's includes its base's -- a view made in no_grad mode of
        # a leaf that requires grad requires grad too, and is a leaf)
        return (self._requires_grad or self._grad_fn is not None
                or (self._base is not None and self._base.requires_grad))

    @requires_grad.setter
    def requires_grad(self, value):
        if not isinstance(value, bool):            # (torch: 1 is refused too)
            raise RuntimeError("requires_grad must be a bool")
        if self.grad_fn is not None:
            if not value:
                raise RuntimeError(
                    "you can only change requires_grad flags of leaf variables. If you want "
                    "to use a computed variable in a subgraph that doesn't require "
                    "differentiation use var_no_grad = var.detach().")
            return
        if value and self.dtype.kind not in "fc":
            raise RuntimeError("only Tensors of floating point and complex dtype can "
                               "require gradients")
        self._requires_grad = value

    @requires_grad.deleter
    def requires_grad(self):
        raise RuntimeError("requires_grad must be a bool")   # (torch's setter, given NULL)

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def retain_grad(self):
        """Keep ``.grad`` for this non-leaf tensor after backward."""
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.is_leaf:
            return
        self._retains_grad = True
        hooks.add_retain_grad(self)

    def detach(self):
        """A Tensor sharing storage (and version counter) with no history."""
        t = _make(self._data)
        t._version_counter = self._version_counter
        return t

    def detach_(self):
        if self._base is not None:
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self._grad_fn = None
        self._requires_grad = False
        return self

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Compute the gradient of this tensor w.r.t. graph leaves (torch semantics)."""
        engine.backward([self], None if gradient is None else [gradient], retain_graph,
                        create_graph, inputs=inputs)

    def register_hook(self, hook):
        return hooks.register_tensor_hook(self, hook)

    def register_post_accumulate_grad_hook(self, hook):
        return hooks.register_post_accumulate_grad_hook(self, hook)

    # ------------------------------------------------------------ metadata

    def size(self, dim=None):
        if dim is None:
            return self._data.shape
        return self._data.shape[norm_dim(dim, self.ndim)]

    def numpy(self):
        """The storage as an ndarray (shared, as torch's .numpy()); under no_grad
        also for a tensor that requires grad (as torch)."""
        if is_grad_enabled() and self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                               "tensor.detach().numpy() instead.")
        return self._data

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    __hash__ = object.__hash__


__all__ = ["Tensor"]


dispatch.set_tensor_type(Tensor)
