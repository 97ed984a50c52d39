"""Tensor: an ndarray storage plus autograd state and view metadata.

A Tensor owns ``_data`` (an ndarray), a version counter (shared with its views),
``requires_grad``/``grad``/``grad_fn``, and, for a view, its ``_base``. Operations
are prim calls (``runtime.prims``); ``__prim_call__`` makes a prim called on Tensors
record autograd history, which is also how a derivative formula becomes
differentiable under ``create_graph=True``.
"""
from __future__ import annotations

import numpy as np

from compiled_autograd.autograd import dispatch
from compiled_autograd.autograd.grad_mode import is_grad_enabled
from compiled_autograd.autograd.saved_variable import type_name
from runtime.prims import ops


class VersionCounter:
    __slots__ = ("value",)

    def __init__(self):
        self.value = 0


class Tensor:
    __slots__ = ("_data", "_requires_grad", "_grad_fn", "_output_nr", "_version_counter",
                 "_base", "_view_version", "grad", "_grad_acc_ref", "_retains_grad",
                 "_backward_hooks", "_post_accumulate_grad_hooks", "_creation", "__weakref__")

    __prim_call__ = staticmethod(dispatch.apply_prim)
    __prim_priority__ = 1
    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected op

    def __init__(self, data, requires_grad=False, dtype=None):
        """Prefer ``ca.tensor``; this wraps ``data`` like it."""
        from compiled_autograd.autograd.factory import as_ndarray
        from runtime.memory import on_array
        self._init(as_ndarray(data, dtype))
        on_array(self._data, "ca.tensor")
        self.requires_grad = requires_grad

    def _init(self, data):
        self._data = data
        self._init_state()

    def _init_state(self):
        """Autograd state of a fresh tensor with no history (shared by proxies)."""
        self._requires_grad = False
        self._grad_fn = None
        self._output_nr = 0
        self._version_counter = VersionCounter()
        self._base = None
        self._view_version = 0
        self.grad = None
        self._grad_acc_ref = None
        self._retains_grad = False
        self._backward_hooks = None
        self._post_accumulate_grad_hooks = None
        # How a view was made, when torch forbids in-place on it later:
        # "no_grad" (made without history) or "custom_function" (a Function's output).
        self._creation = None

    @classmethod
    def _make(cls, data):
        t = object.__new__(cls)
        t._data = data             # (_init, one call fewer: every op's result is made here)
        t._init_state()
        return t

    @classmethod
    def _make_view(cls, data, source):
        t = cls._make(data)
        base = source._base if source._base is not None else source
        t._base = base
        t._version_counter = base._version_counter
        t._view_version = base._version_counter.value
        if not is_grad_enabled():
            t._creation = "no_grad"
        elif source._creation is not None:
            t._creation = source._creation   # a view of such a view is one too (as torch)
        return t

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
        self._view_version = self._version_counter.value
        if self._grad_fn is None and (self._requires_grad or self._creation == "no_grad"):
            return  # a leaf view given requires_grad itself, or one made without history
        base_edge = dispatch.gradient_edge(base)
        if base_edge[0] is None:
            self._grad_fn = None
            return
        from compiled_autograd.autograd.node import node_class
        from runtime.prims import PRIMS
        geometry = dispatch.view_geometry(self, base)
        self._grad_fn = node_class(PRIMS["as_strided"])(
            (base_edge,), ((self.shape, self.dtype),), (), geometry, (base.shape,),
            (base.dtype,))
        self._output_nr = 0

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad or self.grad_fn is not None

    @requires_grad.setter
    def requires_grad(self, value):
        value = bool(value)
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

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def _version(self) -> int:
        return self._version_counter.value

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def retain_grad(self):
        """Keep ``.grad`` for this non-leaf tensor after backward."""
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.is_leaf:
            return
        self._retains_grad = True
        from compiled_autograd.autograd.hooks import add_retain_grad
        add_retain_grad(self)

    def detach(self):
        """A Tensor sharing storage (and version counter) with no history."""
        t = Tensor._make(self._data)
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
        _engine.backward([self], None if gradient is None else [gradient], retain_graph,
                         create_graph, inputs=inputs)

    def register_hook(self, hook):
        from compiled_autograd.autograd.hooks import register_tensor_hook
        return register_tensor_hook(self, hook)

    def register_post_accumulate_grad_hook(self, hook):
        from compiled_autograd.autograd.hooks import register_post_accumulate_grad_hook
        return register_post_accumulate_grad_hook(self, hook)

    # ------------------------------------------------------------ metadata

    @property
    def shape(self):
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def ndim(self):
        return self._data.ndim

    def dim(self):
        return self._data.ndim

    def size(self, dim=None):
        if dim is None:
            return self._data.shape
        from runtime.prims import norm_dim
        return self._data.shape[norm_dim(dim, self.ndim)]

    def numel(self):
        return int(self._data.size)

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def numpy(self):
        """The storage as an ndarray (shared, as torch's .numpy())."""
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                               "tensor.detach().numpy() instead.")
        return self._data

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be "
                               "converted to Scalar")
        return self._data.reshape(-1)[0].item()

    def tolist(self):
        return self._data.tolist()

    def is_contiguous(self):
        return bool(self._data.flags.c_contiguous)

    def __repr__(self):
        body = np.array2string(self._data, separator=", ", prefix="tensor(")
        extra = ""
        if self.dtype != np.float32:
            extra += f", dtype={self.dtype.name}"
        if self._grad_fn is not None:
            extra += f", grad_fn=<{self._grad_fn.name()}>"
        elif self._requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    def type(self):
        return type_name(self.dtype)

    def __bool__(self):
        if self._data.size != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is "
                               "ambiguous")
        return bool(self._data.reshape(-1)[0])

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    __hash__ = object.__hash__


# Tensor methods for ops live in tensor_methods.py (installed on import).
from compiled_autograd.autograd import tensor_inplace
from compiled_autograd.autograd import tensor_methods# noqa: E402,F401
# The engine imports this module (for backward, above).
from compiled_autograd.autograd import engine as _engine# noqa: E402

__all__ = ["Tensor", "VersionCounter", "ops"]
