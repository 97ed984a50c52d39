"""From a prim call on Tensors to a result Tensor and, when needed, an autograd Node.

``apply_prim`` (what ``Tensor.__prim_call__`` is, in C where it is built:
``use_forward_path``) runs the prim's kernel on the arrays, wraps the result (a
view Tensor when the kernel aliased its input), and records a ``<Prim>Backward``
node holding what the prim's save spec asks for. ``apply_inplace``
is the same for ``x.op_(...)``: it writes the result into ``x``'s storage, bumps the
shared version counter and rebases the history of ``x`` -- and, when ``x`` is a view,
of its base, through a CopySlices node.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from compiled_autograd.autograd import grad_mode, saved_hooks
from compiled_autograd.autograd import node as _node
from compiled_autograd.autograd.grad_mode import is_grad_enabled
from compiled_autograd.autograd.hooks import move_retain_grad
from compiled_autograd.autograd.node import (NODE_CLASSES, CopySlices, SavedVariable,
                                             grad_accumulator, gradient_edge, node_class)
from compiled_autograd.autograd.tensor_base import TensorBase, VersionCounter
from compiled_autograd.runtime import forward as _c_forward
from compiled_autograd.runtime import memory as _rt_memory
from compiled_autograd.runtime import prims as _prims
from compiled_autograd.runtime.prims import run_kernel


_OUT = object()  # stands for a saved output until the result Tensor exists


def _save(spec_item, args, edges):
    if spec_item.__class__ is tuple:
        item, cond = spec_item
        if edges[cond][0] is None:
            return None
        spec_item = item
    if spec_item.__class__ is int:
        value = args[spec_item]
        return SavedVariable(value, False) if isinstance(value, TensorBase) else value
    if spec_item == "out":
        return _OUT
    # "tail"
    return tuple(SavedVariable(a, False) if isinstance(a, TensorBase) else a
                 for a in args[1:])


def _make_node(prim, args, params, edges, out_meta):
    """The prim's backward node; its inputs are saved now (before any in-place
    write, so that an operand aliasing the target fails the version check)."""
    cls = NODE_CLASSES.get(prim.name) or node_class(prim)
    shapes, dtypes = [], []
    for a in args:
        if isinstance(a, TensorBase):
            data = a._data
            shapes.append(data.shape)
            dtypes.append(data.dtype)
        else:
            shapes.append(None)
            dtypes.append(None)
    node = cls(edges, (out_meta,), (), params, tuple(shapes), tuple(dtypes))
    node.saved = tuple([_save(s, args, edges) for s in prim.save])
    return node


def _saves_output(prim) -> bool:
    """Whether ``prim``'s save spec holds "out" (the result, saved once it exists)."""
    saves = _SAVES_OUTPUT.get(prim)
    if saves is None:
        saves = _SAVES_OUTPUT[prim] = any(
            (s[0] if s.__class__ is tuple else s) == "out" for s in prim.save)
    return saves


_SAVES_OUTPUT: dict = {}


def _save_output(node, result):
    """Replace the pending saved output by ``result`` (whose grad_fn is node)."""
    name = type(node).__name__
    node.saved = tuple(SavedVariable(result, is_output=True, grad_fn_name=name)
                       if s is _OUT else s for s in node.saved)


def _attach(node, result):
    result._grad_fn = node
    result._output_nr = 0
    if _saves_output(node.prim):
        _save_output(node, result)


def _wants_grad(prim, args, out_dtype):
    if not (prim.differentiable and is_grad_enabled() and out_dtype.kind in "fc"):
        return False
    return any(isinstance(a, TensorBase) and a.requires_grad for a in args)


# Selective checkpointing, checkpoint debugging and memory plans intercept prim
# calls on Tensors: the innermost interceptor computes (or hands back) the kernel's
# result, ``interceptor(prim, arrays, params)``, then sees the result Tensor and the
# call's arguments, ``interceptor.observe(result, args)``. Every interceptor with a
# ``before_write(tensor)`` is told of an in-place write before it happens.
_interceptors: list = []


def push_interceptor(fn) -> None:
    _interceptors.append(fn)


def pop_interceptor(fn) -> None:
    _interceptors.remove(fn)


def make_view(data, source):
    """A Tensor over ``data``, a view of ``source``'s storage: it shares the base's
    version counter and remembers how it was made."""
    t = source._make(data)
    base = source._base if source._base is not None else source
    t._base = base
    t._version_counter = base._version_counter
    t._view_version = base._version_counter.value
    if not is_grad_enabled():
        t._creation = "no_grad"
    elif source._creation is not None:
        # A view of such a view is one too (as torch); it is named by its own grad_fn.
        c = source._creation
        t._creation = c[0] if type(c) is tuple else c
    return t


def apply_prim(prim, args, params, make):
    """Run ``prim`` on Tensor (or scalar) arguments; record history if needed.
    ``make`` is Tensor._make. In C (runtime/forward.c) where it is built;
    ``apply_prim_reference`` otherwise, and for every case the C hands back.
    (``Tensor.__prim_call__`` is the C path itself, or this: ``use_forward_path``.)"""
    fast = _fast[0]
    if fast is None:
        return apply_prim_reference(prim, args, params, make)
    return fast(prim, args, params)


def apply_prim_reference(prim, args, params, make):
    """``apply_prim`` in Python: the reference the C path is tested against, and
    what runs where the C is not built and for every case it hands back
    (interceptors -- selective checkpointing, checkpoint debugging, memory
    plans --, saved-tensor hooks, memory accounting)."""
    arrays = [a._data if isinstance(a, TensorBase) else a for a in args]
    if _interceptors:
        out = _interceptors[-1](prim, arrays, params)
    else:
        out = run_kernel(prim, arrays, params)
    if type(out) is not np.ndarray:
        out = np.asarray(out)
    source = args[0] if args and isinstance(args[0], TensorBase) else None
    if prim.view and source is not None and np.may_share_memory(out, arrays[0]):
        result = make_view(out, source)
    else:
        if not out.flags.c_contiguous:
            # Bases are kept C-contiguous: a view's geometry is then its offset and
            # strides in the base's C order (what as_strided/CopySlices use).
            out = np.ascontiguousarray(out)
        result = make(out)
    if _interceptors:  # (before the node saves the result: a plan decides how)
        _interceptors[-1].observe(result, args)
    if _wants_grad(prim, args, out.dtype):
        edges = [gradient_edge(a) if isinstance(a, TensorBase) else (None, 0) for a in args]
        node = _make_node(prim, args, params, edges, (result.shape, result.dtype))
        _attach(node, result)
    return result


# [the C path (runtime/forward.c's Forward), or None]: made by set_tensor_type.
_fast: list = [None]


def set_tensor_type(tensor_type) -> None:
    """Tensor (tensor.py) hands its class over: the C path makes results of it,
    and is its ``__prim_call__`` (``use_forward_path``)."""
    _tensor_type[0] = tensor_type
    _python_make[0] = tensor_type.__dict__["_make"]
    _built[0] = _c_forward.forward(*forward_config(tensor_type))
    use_forward_path("c")


_tensor_type: list = [None]
_built: list = [None]      # the C path, when it is built
_python_make: list = [None]   # Tensor._make as tensor.py defines it (a staticmethod)


def use_forward_path(path) -> None:
    """Tensor ops on ``path``: "c", the C path where it is built (then it is
    ``Tensor.__prim_call__`` itself: no Python call between an op and the C, and
    its ``make`` is ``Tensor._make``), or "reference" (``apply_prim_reference``
    and tensor.py's ``_make``, as where the C is not built)."""
    if path not in ("c", "reference"):
        raise ValueError(f"use_forward_path: path must be 'c' or 'reference', got {path!r}")
    tensor_type = _tensor_type[0]
    _fast[0] = _built[0] if path == "c" else None
    python_make = _python_make[0]
    tensor_type.__prim_call__ = staticmethod(
        _fast[0] if _fast[0] is not None else partial(apply_prim, make=python_make.__func__))
    tensor_type._make = python_make if _fast[0] is None else staticmethod(_fast[0].make)


def forward_config(tensor_type):
    """What runtime/forward.c's Forward is made of: the classes and slot
    descriptors it writes, one plan per prim, and the state it consults."""
    plans = {p: (NODE_CLASSES.get(p.name), p.view, p.differentiable,
                 _c_forward.save_items(p.save)) for p in _prims.PRIMS.values()}
    make = tensor_type._make
    return (tensor_type,
            _c_forward.descriptors(tensor_type.__mro__, _c_forward.TENSOR_SLOTS),
            _c_forward.descriptors(_node.PrimBackward.__mro__, _c_forward.NODE_SLOTS),
            _c_forward.descriptors((SavedVariable,), _c_forward.SAVED_SLOTS),
            _c_forward.descriptors((VersionCounter,), ("value",)),
            _c_forward.descriptors((_prims.Prim,), ("kernel",)),
            plans,
            lambda prim, args, params: apply_prim_reference(prim, args, params, make),
            grad_accumulator, _node._sequence, _interceptors, _rt_memory._trackers,
            vars(_prims), grad_mode._enabled, saved_hooks._stack_var)


def view_geometry(view, base):
    """(shape, strides, offset) of ``view`` in elements of ``base``'s C order: the
    geometry ``as_strided`` applies to a C-ordered gradient of the base."""
    b, v = base._data, view._data
    item = b.itemsize
    start = v.__array_interface__["data"][0] - b.__array_interface__["data"][0]
    if b.flags.c_contiguous:
        return dict(shape=tuple(v.shape), strides=tuple(s // item for s in v.strides),
                    offset=start // item)
    # A base whose memory is not in C order (a detached view, a transposed
    # gradient): lay its C-order element indices out in memory like the base,
    # then read them back through the view's own strides.
    lo, hi = np.lib.array_utils.byte_bounds(b)
    cells = np.empty((hi - lo) // item + 1, dtype=np.int64)
    as_cells = lambda arr, at: np.lib.stride_tricks.as_strided(  # noqa: E731
        cells[(arr.__array_interface__["data"][0] - lo) // item:], shape=arr.shape,
        strides=tuple(s // item * cells.itemsize for s in arr.strides))
    as_cells(b, None)[...] = np.arange(b.size).reshape(b.shape)
    index = as_cells(v, None)
    offset = int(index.reshape(-1)[0]) if index.size else 0
    strides = tuple(int(index[(0,) * d + (1,) + (0,) * (v.ndim - d - 1)]) - offset
                    if n > 1 else 0 for d, n in enumerate(v.shape))
    return dict(shape=tuple(v.shape), strides=strides, offset=offset)


def forward_op_name(node) -> str:
    """What torch's messages call the op of a node (its forward_op_name): the custom
    Function's name for its node, else the node's name without "Backward"."""
    fwd = getattr(type(node), "_forward_cls", None)
    if fwd is not None:
        return fwd.__name__
    name = node.name()
    return name[:-len("Backward")] if name.endswith("Backward") else name


_REBASE_SUFFIX = {
    "multi_output": " This view is the output of a function that returns multiple views. "
                    "Such functions do not allow the output views to be modified inplace. You "
                    "should replace the inplace operation by an out-of-place one.",
    "no_grad": " Given that this use case is ambiguous and error-prone, it is forbidden. You "
               "can clarify your code by moving both the view and the inplace either both "
               "inside the no_grad block (if you don't want the inplace to be tracked) or "
               "both outside (if you want the inplace to be tracked).",
    "custom_function": " This view was created inside a custom Function (or because an input "
                       "was returned as-is) and the autograd logic to handle view+inplace "
                       "would override the custom backward associated with the custom "
                       "Function, leading to incorrect gradients. This behavior is forbidden. "
                       "You can fix this by cloning the output of the custom Function.",
}


def _view_rebase_error(target, indirect=False) -> RuntimeError:
    """torch's handle_view_on_rebase: why a view made in a special way (``_creation``:
    "no_grad", "custom_function", "multi_output", or (kind, output_nr, op name) for
    the outputs of split) may not be modified in place (``indirect``: its base or
    another view of it was)."""
    kind, fn, nr = target._creation, target._grad_fn, target._output_nr
    name = None if fn is None else forward_op_name(fn)
    if type(kind) is tuple:
        kind, nr, name = kind if fn is not None else (kind[0], nr, None)
    if kind == "no_grad" or name is None:
        prefix = ("A view was created in" if name is None else
                  f"Output {nr} of {name} is a view of a view which was created in")
        what = ("its base or another view of its base has been modified inplace" if indirect
                else "is being modified inplace")
        msg = f"{prefix} no_grad mode and {what} with grad mode enabled."
    else:
        msg = f"Output {nr} of {name} is a view and is being modified inplace."
    return RuntimeError(msg + _REBASE_SUFFIX[kind])


def _needs_grad(t) -> bool:
    """torch's requires_grad of a tensor (a view's includes its base's)."""
    return (t._requires_grad or t._grad_fn is not None
            or (t._base is not None and _needs_grad(t._base)))


def check_inplace(target, others=()):
    """torch's refusals of in-place ops that would give wrong or ambiguous grads
    (check_inplace in VariableTypeUtils.h: only when the op needs grad)."""
    if not is_grad_enabled():
        return
    target_needs = _needs_grad(target)
    if not (target_needs or any(isinstance(a, TensorBase) and _needs_grad(a) for a in others)):
        return
    base = target._base
    if base is not None:
        if target._creation is not None:
            raise _view_rebase_error(target)
        if target_needs and base._grad_fn is None:
            raise RuntimeError("a view of a leaf Variable that requires grad is being used in "
                               "an in-place operation.")
    elif target._requires_grad and target._grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an "
                           "in-place operation.")


def apply_inplace(prim, args, params):
    """``args[0].<prim>_(*args[1:])``: compute, write in place, rebase history."""
    target = args[0]
    check_inplace(target, args[1:])
    arrays = [a._data if isinstance(a, TensorBase) else a for a in args]
    out = run_kernel(prim, arrays, params)
    if tuple(np.shape(out)) != target.shape:
        raise RuntimeError(
            f"output with shape {list(target.shape)} doesn't match the broadcast shape "
            f"{list(np.shape(out))}")
    if not target._data.flags.writeable:
        raise RuntimeError("unsupported operation: more than one element of the written-to "
                           "tensor refers to a single memory location. Please clone() the "
                           "tensor before performing the operation.")
    for interceptor in _interceptors:   # (a memory plan keeps what its recipes read)
        before_write = getattr(interceptor, "before_write", None)
        if before_write is not None:
            before_write(target)
    node = None
    if _wants_grad(prim, args, target.dtype):
        edges = [gradient_edge(a) if isinstance(a, TensorBase) else (None, 0) for a in args]
        old = target
        if any(s == 0 or (isinstance(s, tuple) and s[0] == 0) for s in prim.save):
            # The formula needs target's old value, which is about to be overwritten.
            old = target._make(target._data.copy())
            old._grad_fn, old._output_nr = target.grad_fn, target._output_nr
        node = _make_node(prim, (old,) + tuple(args[1:]), params, edges,
                          (target.shape, target.dtype))
    np.copyto(target._data, out, casting="same_kind")
    target._version_counter.bump()
    if node is not None:
        _rebase_history(node, target)
    return target


def _rebase_history(node, target):
    old_fn, old_nr = target._grad_fn, target._output_nr
    base = target._base
    if base is None:
        _attach(node, target)
    else:
        # In-place on a view: base's new history is CopySlices(node); the view's
        # is a view (as_strided) of that.
        probe = target._make(target._data)  # stands for the result while saving
        probe._grad_fn = node
        probe._version_counter = target._version_counter
        _save_output(node, probe)
        old_base_fn, old_base_nr = base._grad_fn, base._output_nr
        base._grad_fn = CopySlices(gradient_edge(base), (base.shape, base.dtype),
                                   view_geometry(target, base), node)
        base._output_nr = 0
        if base._retains_grad:
            move_retain_grad(base, old_base_fn, old_base_nr)
        target._regenerate_view_grad_fn()
    if target._retains_grad:
        move_retain_grad(target, old_fn, old_nr)
