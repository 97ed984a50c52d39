"""From a prim call on Tensors to a result Tensor and, when needed, an autograd Node.

``apply_prim`` is ``Tensor.__prim_call__``: it runs the prim's kernel on the arrays,
wraps the result (a view Tensor when the kernel aliased its input), and records a
``<Prim>Backward`` node holding what the prim's save spec asks for. ``apply_inplace``
is the same for ``x.op_(...)``: it writes the result into ``x``'s storage, bumps the
shared version counter and rebases the history of ``x`` -- and, when ``x`` is a view,
of its base, through a CopySlices node.
"""
from __future__ import annotations

import numpy as np

from compiled_autograd.grad_mode import is_grad_enabled
from compiled_autograd.node import CopySlices, grad_accumulator, node_class
from compiled_autograd.saved_variable import SavedVariable


def gradient_edge(t):
    """Where the gradient of ``t`` goes: (grad_fn, output_nr), the leaf's
    AccumulateGrad, or None when ``t`` does not require grad."""
    fn = t.grad_fn
    if fn is not None:
        return fn, t._output_nr
    if t._requires_grad:
        return grad_accumulator(t), 0
    return None, 0


def _save(spec_item, args, result, needs, node_name):
    from compiled_autograd.tensor import Tensor
    if isinstance(spec_item, tuple):
        item, cond = spec_item
        if not needs[cond]:
            return None
        spec_item = item
    if spec_item == "out":
        return SavedVariable(result, is_output=True, grad_fn_name=node_name)
    if spec_item == "tail":
        return tuple(SavedVariable(a, False) if isinstance(a, Tensor) else a for a in args[1:])
    value = args[spec_item]
    return SavedVariable(value, is_output=False) if isinstance(value, Tensor) else value


def _record(prim, args, params, result, edges):
    """Create the prim's backward node for ``result`` with the given input edges."""
    from compiled_autograd.tensor import Tensor
    cls = node_class(prim)
    needs = tuple(fn is not None for fn, _ in edges)
    shapes = tuple(a.shape if isinstance(a, Tensor) else None for a in args)
    dtypes = tuple(a.dtype if isinstance(a, Tensor) else None for a in args)
    node = cls(edges, ((result.shape, result.dtype),), (), params, shapes, dtypes)
    result._grad_fn = node
    result._output_nr = 0
    # Saved after the node exists, so that a saved output can name it.
    node.saved = tuple(_save(s, args, result, needs, cls.__name__) for s in prim.save)
    return node


def _wants_grad(prim, args, out_dtype):
    from compiled_autograd.tensor import Tensor
    if not (prim.differentiable and is_grad_enabled() and out_dtype.kind in "fc"):
        return False
    return any(isinstance(a, Tensor) and a.requires_grad for a in args)


def apply_prim(prim, args, params):
    """Run ``prim`` on Tensor (or scalar) arguments; record history if needed."""
    from compiled_autograd.tensor import Tensor
    arrays = [a._data if isinstance(a, Tensor) else a for a in args]
    out = prim.kernel(*arrays, **params)
    if type(out) is not np.ndarray:
        out = np.asarray(out)
    source = args[0] if args and isinstance(args[0], Tensor) else None
    if prim.view and source is not None and np.may_share_memory(out, arrays[0]):
        result = Tensor._make_view(out, source)
    else:
        if not out.flags.c_contiguous:
            # Bases are kept C-contiguous: a view's geometry is then its offset and
            # strides in the base's C order (what as_strided/CopySlices use).
            out = np.ascontiguousarray(out)
        result = Tensor._make(out)
    if _wants_grad(prim, args, out.dtype):
        edges = [gradient_edge(a) if isinstance(a, Tensor) else (None, 0) for a in args]
        _record(prim, args, params, result, edges)
    return result


def view_geometry(view, base):
    """(shape, strides, offset) of ``view`` in elements of ``base``'s C order."""
    item = base._data.itemsize
    start = view._data.__array_interface__["data"][0] - base._data.__array_interface__["data"][0]
    return dict(shape=tuple(view.shape),
                strides=tuple(s // item for s in view._data.strides),
                offset=start // item)


def check_inplace(target):
    if is_grad_enabled() and target._requires_grad and target._grad_fn is None:
        if target._base is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an "
                               "in-place operation.")
    base = target._base
    if is_grad_enabled() and base is not None and base._grad_fn is None and base._requires_grad:
        raise RuntimeError("a view of a leaf Variable that requires grad is being used in "
                           "an in-place operation.")


def apply_inplace(prim, args, params):
    """``args[0].<prim>_(*args[1:])``: compute, write in place, rebase history."""
    from compiled_autograd.tensor import Tensor
    target = args[0]
    check_inplace(target)
    arrays = [a._data if isinstance(a, Tensor) else a for a in args]
    out = prim.kernel(*arrays, **params)
    if tuple(np.shape(out)) != target.shape:
        raise RuntimeError(
            f"output with shape {list(target.shape)} doesn't match the broadcast shape "
            f"{list(np.shape(out))}")
    if not target._data.flags.writeable:
        raise RuntimeError("unsupported operation: more than one element of the written-to "
                           "tensor refers to a single memory location. Please clone() the "
                           "tensor before performing the operation.")
    record = _wants_grad(prim, args, target.dtype)
    if record:
        edges = [gradient_edge(a) if isinstance(a, Tensor) else (None, 0) for a in args]
        old = target
        if any(s == 0 or (isinstance(s, tuple) and s[0] == 0) for s in prim.save):
            # The formula needs target's old value, which is about to be overwritten.
            old = Tensor._make(target._data.copy())
            old._grad_fn, old._output_nr = target.grad_fn, target._output_nr
        inputs = (old,) + tuple(args[1:])
    np.copyto(target._data, out, casting="same_kind")
    target._version_counter.value += 1
    if record:
        _rebase_history(prim, inputs, params, target, edges)
    return target


def _rebase_history(prim, inputs, params, target, edges):
    from compiled_autograd.tensor import Tensor
    base = target._base
    if base is None:
        _record(prim, inputs, params, target, edges)
        return
    # In-place on a view: base's new history is CopySlices(fn); the view's is a
    # view (as_strided) of that.
    geometry = view_geometry(target, base)
    fn = node_class(prim)(edges, ((target.shape, target.dtype),), (), params,
                          tuple(a.shape if isinstance(a, Tensor) else None for a in inputs),
                          tuple(a.dtype if isinstance(a, Tensor) else None for a in inputs))
    probe = Tensor._make(target._data)  # stands for the result while saving
    probe._grad_fn = fn
    probe._version_counter = target._version_counter
    needs = tuple(e is not None for e, _ in edges)
    fn.saved = tuple(_save(s, inputs, probe, needs, fn.name()) for s in prim.save)
    base_edge = gradient_edge(base)
    base._grad_fn = CopySlices(base_edge, (base.shape, base.dtype), geometry, fn)
    base._output_nr = 0
    target._regenerate_view_grad_fn()
