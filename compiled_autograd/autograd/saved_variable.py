"""SavedVariable: a tensor saved for backward, with the version it had when saved.

As in torch: an input is saved as the original Tensor (no reference cycle), an output
of the node that saves it is saved as its data plus what is needed to rebuild a
Tensor whose grad_fn is that node (for double backward). On unpack the version is
checked, so an in-place change after saving fails loudly, naming the versions.
"""
from __future__ import annotations

import numpy as np

from compiled_autograd.autograd.saved_hooks import current_hooks
from runtime import memory as _rt_memory

SECOND_BACKWARD_MSG = (
    "Trying to backward through the graph a second time (or directly access saved "
    "tensors after they have already been freed). Saved intermediate values of the "
    "graph are freed when you call .backward() or autograd.grad(). Specify "
    "retain_graph=True if you need to backward through the graph a second time or if "
    "you need to access saved tensors after calling backward.")


def retag_saved(arr):
    from compiled_autograd.memory.profile import retag_saved as retag
    retag(arr)


def checked_unpack(value, shape):
    """What an unpack hook returned, checked: a Tensor of the saved ``shape`` (None:
    any shape) -- eager's unpack and the compiled backward's."""
    from compiled_autograd.autograd.tensor import Tensor
    if not isinstance(value, Tensor):
        raise TypeError("Output of saved tensor unpack_hook expected to be a Tensor but "
                        f"got result of type {type(value).__name__}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise RuntimeError(f"saved tensor unpack_hook returned a tensor of shape "
                           f"{list(value.shape)}, but the saved tensor had shape {list(shape)}")
    return value


def type_name(dtype) -> str:
    """torch-style type name: float32 -> FloatTensor."""
    names = {"float32": "Float", "float64": "Double", "float16": "Half", "int64": "Long",
             "int32": "Int", "bool": "Bool", "int8": "Char", "uint8": "Byte"}
    return f"ca.{names.get(np.dtype(dtype).name, np.dtype(dtype).name)}Tensor"


class SavedVariable:
    """A saved tensor. Under saved-tensor hooks it holds ``pack(tensor)`` and the
    unpack hook instead of the tensor (PyTorch's SavedVariableHooks)."""

    __slots__ = ("_tensor", "_data", "_version_counter", "saved_version", "is_output",
                 "_requires_grad", "_output_nr", "_grad_fn_name", "released", "shape",
                 "dtype", "packed", "unpack_hook", "_grad_fn", "_leaf", "strides")

    def __init__(self, tensor, is_output: bool, grad_fn_name: str | None = None):
        hooks = current_hooks()
        if hooks is not None:
            self._init_hooked(tensor, is_output, hooks)
            return
        self.packed = self.unpack_hook = self._grad_fn = self._leaf = None
        if _rt_memory._trackers:
            retag_saved(tensor._data)
        self._version_counter = tensor._version_counter
        self.saved_version = self._version_counter.value
        self.is_output = is_output
        self.shape = tensor.shape
        self.dtype = tensor.dtype
        self.released = False
        self._output_nr = tensor._output_nr
        self._grad_fn_name = grad_fn_name
        if is_output and tensor._grad_fn is not None:
            # Saving the output Tensor itself would make node -> tensor -> node.
            self._tensor = None
            self._data = tensor._data
            self._requires_grad = True
        else:
            self._tensor = tensor
            self._data = None
            self._requires_grad = False

    def _init_hooked(self, tensor, is_output, hooks):
        pack, unpack = hooks
        self.shape, self.dtype = tensor.shape, tensor.dtype
        # The layout the value had (bytes): a recomputation gives it again, so
        # compiled code may read the unpacked value in place (codegen.c).
        self.strides = tensor._data.strides
        self.is_output = is_output
        self.released = False
        self._output_nr = tensor._output_nr
        # The edge to restore on unpack; an output's grad_fn is the owner node
        # (given at unpack), so only an input's is kept (no reference cycle). A
        # leaf that requires grad is kept itself: its AccumulateGrad is fetched at
        # unpack (leaves are normally alive anyway: parameters, user inputs).
        self._grad_fn = None if is_output else tensor._grad_fn
        self._leaf = tensor if (not is_output and tensor._grad_fn is None
                                and tensor._requires_grad) else None
        self._tensor = self._data = None
        self._version_counter = None
        self.packed = pack(tensor)  # once per save
        self.unpack_hook = unpack

    def _call_unpack_hook(self):
        return checked_unpack(self.unpack_hook(self.packed), self.shape)

    def check(self, node_name: str) -> None:
        """Raise the torch error if this value was freed or modified in place."""
        if self.released:
            raise RuntimeError(SECOND_BACKWARD_MSG)
        if self.unpack_hook is not None:
            return  # the hooks own the value: no version to check (as torch)
        current = self._version_counter.value
        if current != self.saved_version:
            if self._tensor is not None and self._tensor._grad_fn is not None:
                origin = f", which is output {self._output_nr} of {self._tensor._grad_fn.name()},"
            elif self._tensor is None:
                origin = f", which is output {self._output_nr} of {node_name},"
            else:
                origin = ""
            dims = ", ".join(str(d) for d in self.shape)
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified "
                f"by an inplace operation: [{type_name(self.dtype)} [{dims}]]{origin} is "
                f"at version {current}; expected version {self.saved_version} instead. "
                "Hint: the backward of " + node_name + " needs this value; do the "
                "in-place operation on a clone, or after the backward.")

    def unpack_array(self, node_name: str):
        """The saved value as an ndarray (the eager engine's fast path)."""
        self.check(node_name)
        if self.unpack_hook is not None:
            return self._call_unpack_hook()._data
        return self._data if self._tensor is None else self._tensor._data

    def unpack(self, owner):
        """The saved value as a Tensor; an output gets ``owner`` as its grad_fn."""
        self.check(owner.name())
        from compiled_autograd.autograd.tensor import Tensor
        if self.unpack_hook is not None:
            value = self._call_unpack_hook()
            grad_fn = owner if self.is_output else self._edge_fn()
            if grad_fn is None:
                return value
            t = Tensor._make(value._data)
            t._grad_fn, t._output_nr = grad_fn, self._output_nr
            return t
        if self._tensor is not None:
            return self._tensor
        t = Tensor._make(self._data)
        t._version_counter = self._version_counter
        t._grad_fn = owner
        t._output_nr = self._output_nr
        return t

    def _edge_fn(self):
        """The node gradients of the unpacked value flow to (under hooks)."""
        if self._leaf is not None:
            from compiled_autograd.autograd.node import grad_accumulator
            return grad_accumulator(self._leaf)
        return self._grad_fn

    def unpack_input(self, context: str):
        """A saved *input* (not an output) as a Tensor, outside any node."""
        self.check(context)
        if self.unpack_hook is not None:
            value = self._call_unpack_hook()
            grad_fn = self._edge_fn()
            if grad_fn is not None:
                from compiled_autograd.autograd.tensor import Tensor
                t = Tensor._make(value._data)
                t._grad_fn, t._output_nr = grad_fn, self._output_nr
                return t
            return value
        return self._tensor

    def release(self) -> None:
        self._tensor = self._data = None
        self.packed = self.unpack_hook = self._grad_fn = self._leaf = None
        self.released = True
