"""The two objects of the compiled-autograd Node contract (PyTorch's names).

``CompiledNodeArgs`` is what ``Node.compiled_args(args)`` writes into: everything the
node's backward depends on, in a fixed order -- node type, non-tensor attributes,
sizes, saved-tensor metadata -- which together form the cache key.

``SwapSavedVariables`` is what ``Node.apply_with_saved(grads, saved)`` reads from:
``before(sv)`` gives the value to use in place of a saved variable, ``after(sv)``
ends that use, ``needs(node)`` says which input gradients to compute and
``accumulate_grad`` receives a leaf's gradient. This base class swaps each saved
variable for its own unpacked value, so ``apply_with_saved`` equals ``apply`` (the
reference the tracer's proxy-swapping subclass is tested against).
"""
from __future__ import annotations

from compiled_autograd.node import accumulate_into


class CompiledNodeArgs:
    """Collects, node by node in walk order, the key of a backward graph."""

    def __init__(self):
        self.key: list = []
        self.saved: list = []   # SavedVariables, in collection order

    def collect(self, value) -> None:
        """A non-tensor attribute (type, dims, scalars, flags, dtypes)."""
        self.key.append(value)

    def collect_sizes(self, shapes) -> None:
        """Tensor sizes; the tracer may later make some of them dynamic."""
        self.key.append(("sizes", tuple(None if s is None else tuple(s) for s in shapes)))

    def collect_saved(self, sv) -> None:
        """A saved variable: its metadata is part of the key, its value is not."""
        self.key.append(("saved", tuple(sv.shape), sv.dtype.str))
        self.saved.append(sv)

    def freeze(self) -> tuple:
        return tuple(self.key)


class SwapSavedVariables:
    """Eager swapping: each saved variable stands for its own unpacked array."""

    def __init__(self, needs_override=None):
        self._needs = needs_override

    def before(self, sv):
        return sv.unpack_array("apply_with_saved")

    def after(self, sv) -> None:
        pass

    def needs(self, node):
        return self._needs if self._needs is not None else node.static_needs()

    def with_needs(self, needs):
        return type(self)(needs)

    def accumulate_grad(self, variable, grad) -> None:
        accumulate_into(variable, grad)
