"""SavedVariable: a tensor saved for backward, with the version it had when saved.

As in torch: an input is saved as the original Tensor (no reference cycle), an output
of the node that saves it is saved as its data plus what is needed to rebuild a
Tensor whose grad_fn is that node (for double backward). On unpack the version is
checked, so an in-place change after saving fails loudly, naming the versions.
"""
from __future__ import annotations

import numpy as np

SECOND_BACKWARD_MSG = (
    "Trying to backward through the graph a second time (or directly access saved "
    "tensors after they have already been freed). Saved intermediate values of the "
    "graph are freed when you call .backward() or autograd.grad(). Specify "
    "retain_graph=True if you need to backward through the graph a second time or if "
    "you need to access saved tensors after calling backward.")


def type_name(dtype) -> str:
    """torch-style type name: float32 -> FloatTensor."""
    names = {"float32": "Float", "float64": "Double", "float16": "Half", "int64": "Long",
             "int32": "Int", "bool": "Bool", "int8": "Char", "uint8": "Byte"}
    return f"ca.{names.get(np.dtype(dtype).name, np.dtype(dtype).name)}Tensor"


class SavedVariable:
    __slots__ = ("_tensor", "_data", "_version_counter", "saved_version", "is_output",
                 "_requires_grad", "_output_nr", "_grad_fn_name", "released", "shape",
                 "dtype")

    def __init__(self, tensor, is_output: bool, grad_fn_name: str | None = None):
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

    def check(self, node_name: str) -> None:
        """Raise the torch error if this value was freed or modified in place."""
        if self.released:
            raise RuntimeError(SECOND_BACKWARD_MSG)
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
        return self._data if self._tensor is None else self._tensor._data

    def unpack(self, owner):
        """The saved value as a Tensor; an output gets ``owner`` as its grad_fn."""
        self.check(owner.name())
        if self._tensor is not None:
            return self._tensor
        from compiled_autograd.tensor import Tensor
        t = Tensor._make(self._data)
        t._version_counter = self._version_counter
        t._grad_fn = owner
        t._output_nr = self._output_nr
        return t

    def release(self) -> None:
        self._tensor = None
        self._data = None
        self.released = True
