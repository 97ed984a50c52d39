"""What the autograd core knows of a tensor: its storage and autograd state.

``TensorBase`` holds the fields every layer reads -- ``_data`` (an ndarray), the
version counter (shared with views), ``_requires_grad``, ``_grad_fn`` and
``_output_nr``, ``grad``, the view's ``_base`` -- and the metadata that needs nothing
else (``shape``, ``dtype``, ``item()``, ...). ``Tensor`` (tensor.py) is its one
implementation: it adds the ops, ``backward`` and the autograd properties, and it
sits *above* the Nodes, the saved variables, the engine and the hooks. So those
modules never name ``Tensor``: they test ``isinstance(x, TensorBase)`` and make a
new tensor with ``x._make(array)`` on a tensor they were given (every tensor has
``_make``, which always makes a plain ``Tensor`` with no history).
"""
from __future__ import annotations

import operator

import numpy as np

DEFAULT_FLOAT = np.dtype(np.float32)


class VersionCounter:
    __slots__ = ("value",)

    writes = 0    # in-place writes to any storage (a compiled backward asks: any since?)

    def __init__(self):
        self.value = 0

    def bump(self) -> None:
        """An in-place write to the storage this counts."""
        self.value += 1
        VersionCounter.writes += 1


def type_name(dtype) -> str:
    """torch-style type name: float32 -> FloatTensor."""
    names = {"float32": "Float", "float64": "Double", "float16": "Half", "int64": "Long",
             "int32": "Int", "int16": "Short", "bool": "Bool", "int8": "Char", "uint8": "Byte"}
    return f"ca.{names.get(np.dtype(dtype).name, np.dtype(dtype).name)}Tensor"


_META_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half",
               "int64": "long int", "int32": "int", "int16": "short int",
               "int8": "signed char", "uint8": "unsigned char", "bool": "bool"}


def _meta_name(dtype) -> str:
    """torch's TypeMeta name of a dtype in messages: float32 -> 'float'."""
    return _META_NAMES.get(np.dtype(dtype).name, np.dtype(dtype).name)


def _scalar_name(dtype) -> str:
    """torch's ScalarType name of a dtype in messages: float32 -> 'Float'."""
    return type_name(dtype)[len("ca."):-len("Tensor")]


def as_ndarray(data, dtype=None):
    """A fresh C-contiguous array; floating data defaults to float32 (DESIGN.md)."""
    if isinstance(data, TensorBase):
        data = data._data
    arr = np.array(data, dtype=None if dtype is None else np.dtype(dtype), order="C",
                   copy=True)
    if dtype is None and arr.dtype.kind == "f" and arr.dtype != DEFAULT_FLOAT:
        arr = arr.astype(DEFAULT_FLOAT)
    if dtype is None and arr.dtype.kind in "iu":
        arr = arr.astype(np.int64, copy=False)
    return arr


class TensorBase:
    """Storage, version counter and autograd state of a tensor (see the module doc)."""

    __slots__ = ("_data", "_requires_grad", "_grad_fn", "_output_nr", "_version_counter",
                 "_base", "_view_version", "_grad", "_grad_acc_ref", "_retains_grad",
                 "_backward_hooks", "_post_accumulate_grad_hooks", "_creation", "_grad_lock",
                 "__weakref__")

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
        self._grad = None
        self._grad_acc_ref = None
        self._retains_grad = False
        self._backward_hooks = None
        self._post_accumulate_grad_hooks = None
        # How a view was made, when torch forbids in-place on it later:
        # "no_grad" (made without history), "custom_function" (a Function's output)
        # or ("multi_view", i) (output i of split/chunk).
        self._creation = None
        self._grad_lock = None   # made on the first accumulation (node.accumulate_into)

    @staticmethod
    def _make(data):
        """A new plain Tensor over ``data`` with no history (defined by Tensor)."""
        raise NotImplementedError

    # ------------------------------------------------------------ .grad

    @property
    def grad(self):
        return self._grad

    @grad.setter
    def grad(self, value):
        """torch's checks (THPVariable_set_grad): a Tensor of this one's dtype and
        size, not the tensor itself, or None."""
        if value is not None:
            if not isinstance(value, TensorBase):
                raise TypeError("assigned grad expected to be a Tensor or None but got grad "
                                f"of type {type(value).__name__}")
            if value is self:
                raise RuntimeError("can't assign Variable as its own grad")
            if value.dtype != self.dtype:
                raise RuntimeError(
                    f"attempting to assign a gradient with dtype '{_meta_name(value.dtype)}' "
                    f"to a tensor with grad_dtype '{_scalar_name(self.dtype)}'. The gradient "
                    "must match the tensor's grad_dtype (defaults to the tensor's dtype).")
            if value.shape != self.shape:
                raise RuntimeError(
                    f"attempting to assign a gradient of size '{list(value.shape)}' to a "
                    f"tensor of size '{list(self.shape)}'. Please ensure that the gradient "
                    "and the tensor are the same size")
        self._grad = value

    @grad.deleter
    def grad(self):
        self._grad = None   # as torch: deleting .grad resets it

    # ------------------------------------------------------------ metadata

    @property
    def _version(self) -> int:
        return self._version_counter.value

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    # (C getters, not Python functions: the forward reads these hundreds of times
    # a step, and a Python frame per read costs more than the read)
    shape = property(operator.attrgetter("_data.shape"), doc="The array's shape.")
    dtype = property(operator.attrgetter("_data.dtype"), doc="The array's dtype.")
    ndim = property(operator.attrgetter("_data.ndim"), doc="The array's number of dims.")

    def dim(self):
        return self._data.ndim

    def numel(self):
        return int(self._data.size)

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be "
                               "converted to Scalar")
        return self._data.reshape(-1)[0].item()

    def tolist(self):
        return self._data.tolist()

    def is_contiguous(self):
        return bool(self._data.flags.c_contiguous)

    def stride(self, dim=None):
        """The steps between elements along each dim, in elements (torch's
        ``Tensor.stride``); with ``dim``, that dim's."""
        data = self._data
        if data.size:
            strides = tuple(s // data.itemsize for s in data.strides)
        else:      # (numpy may give an empty array any strides: a new one's, as torch)
            strides = tuple(int(np.prod(data.shape[d + 1:], dtype=np.int64))
                            for d in range(data.ndim))
        if dim is None:
            return strides
        if not strides:
            raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
        if not -len(strides) <= dim < len(strides):
            raise IndexError(f"Dimension out of range (expected to be in range of "
                             f"[{-len(strides)}, {len(strides) - 1}], but got {dim})")
        return strides[dim]

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

    __hash__ = object.__hash__
