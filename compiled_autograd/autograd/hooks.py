"""Backward hooks and the order in which the engine calls them.

As in torch's engine (``call_function``), for a node about to run:
tensor pre-hooks (registered with ``Tensor.register_hook``), then retain_grad, then
node pre-hooks (``Node.register_prehook``), the node itself, then -- for a leaf's
AccumulateGrad -- post-accumulate-grad hooks, then node post-hooks
(``Node.register_hook``). Several hooks on one object run in registration order.
The running functions take ``make`` (``Tensor._make``): they hand user hooks
Tensors, and this module sits below Tensor (the engine passes the roots' ``_make``).
"""
from __future__ import annotations

import itertools
import weakref

from compiled_autograd.autograd.tensor_base import TensorBase, type_name
from compiled_autograd.runtime.memory import on_array
from compiled_autograd.runtime.prims import ops

_handle_ids = itertools.count()


class RemovableHandle:
    """Returned by every ``register_*hook``; ``.remove()`` unregisters the hook."""

    def __init__(self, hooks_dict):
        self.id = next(_handle_ids)
        self._ref = weakref.ref(hooks_dict) if hooks_dict is not None else None

    def remove(self):
        d = self._ref() if self._ref is not None else None
        if d is not None:
            d.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class HookDict(dict):
    """An ordered id -> hook mapping that a weakref can point to."""


def _add(owner, attr, hook):
    hooks = getattr(owner, attr)
    if hooks is None:
        hooks = HookDict()
        setattr(owner, attr, hooks)
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def _node_hook_dict(node, attr, key=None):
    d = node.__dict__.get(attr)
    if d is None:
        d = {} if key is not None else HookDict()
        node.__dict__[attr] = d
        node.__dict__["_hooked"] = True   # a cheap "may have hooks" for the hot walks
    if key is None:
        return d
    return d.setdefault(key, HookDict())


def register_tensor_hook(tensor, hook):
    if not tensor.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    fn = tensor.grad_fn
    if fn is None:  # leaf: AccumulateGrad reads the tensor's own hooks
        return _add(tensor, "_backward_hooks", hook)
    hooks = _node_hook_dict(fn, "_tensor_pre_hooks", tensor._output_nr)
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def register_post_accumulate_grad_hook(tensor, hook):
    if not tensor.is_leaf:
        raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
    if not tensor.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    return _add(tensor, "_post_accumulate_grad_hooks", hook)


def add_retain_grad(tensor):
    fn = tensor.grad_fn
    retained = _node_hook_dict(fn, "_retains_grad", tensor._output_nr)
    retained[0] = weakref.ref(tensor)


def move_retain_grad(tensor, old_fn, old_nr):
    """An in-place op gave ``tensor`` a new grad_fn: retain its new gradient."""
    if old_fn is not None:
        retained = old_fn.__dict__.get("_retains_grad") or {}
        retained.pop(old_nr, None)
    add_retain_grad(tensor)


def register_node_prehook(node, hook):
    hooks = _node_hook_dict(node, "_pre_hooks")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def register_node_hook(node, hook):
    hooks = _node_hook_dict(node, "_post_hooks")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def leaf_of(node):
    """The tensor an AccumulateGrad accumulates into (its tensor hooks and
    post-accumulate-grad hooks live on it), else None. Only AccumulateGrad: a
    custom Function's ctx may well have an attribute called ``variable``."""
    return node.variable if node.accumulates_grad else None


def has_tensor_pre_hooks(node) -> bool:
    d = node.__dict__
    if d.get("_tensor_pre_hooks") or d.get("_retains_grad"):
        return True
    variable = leaf_of(node)
    return variable is not None and bool(variable._backward_hooks)


def has_hooks(node) -> bool:
    """Whether a hook may be registered around ``node`` (the hot walks' cheap test:
    False is certain; True may be stale, after a handle's removal, and the walks
    then find no hooks to run)."""
    if "_hooked" in node.__dict__:
        return True
    if not node.accumulates_grad:
        return False
    variable = node.variable
    return bool(variable._backward_hooks or variable._post_accumulate_grad_hooks)


# ---------------------------------------------------------------- running them


def hook_name(hook) -> str:
    return getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or repr(hook)


def _wrap(g, make):
    return g if g is None or isinstance(g, TensorBase) else make(g)


def _unwrap(result, like, hook, create_graph):
    """A hook's replacement gradient, checked against the one it replaces."""
    if not isinstance(result, TensorBase):
        raise TypeError(f"hook '{hook_name(hook)}' returned {type(result).__name__}, "
                        "expected a Tensor or None")
    check_hook_result(result, like, hook)
    return result if create_graph else result._data


def check_hook_result(result, like, hook):
    """A gradient a hook returned must have the shape and dtype of the one it
    replaces (torch's messages); shared with the compiled backward's hook calls."""
    if like is None:
        raise RuntimeError("can't replace a None gradient with a non-None value")
    if tuple(result.shape) != tuple(like.shape):
        raise RuntimeError(f"hook '{hook_name(hook)}' has changed the size of value: "
                           f"expected {list(like.shape)}, got {list(result.shape)}")
    if result.dtype != like.dtype:
        raise RuntimeError(f"hook '{hook_name(hook)}' has changed the type of value (was "
                           f"{type_name(like.dtype)} got {type_name(result.dtype)})")


def run_pre_hooks(fn, grads, create_graph, make):
    """Tensor pre-hooks, retain_grad, node pre-hooks (torch's order)."""
    return run_node_pre_hooks(fn, run_tensor_pre_hooks(fn, grads, create_graph, make),
                              create_graph, make)


def run_tensor_pre_hooks(fn, grads, create_graph, make):
    """Hooks registered on the tensors whose gradients ``fn`` receives, then
    retain_grad. They also run before a gradient is captured by autograd.grad."""
    grads = list(grads)
    d = fn.__dict__
    per_output = dict(d.get("_tensor_pre_hooks") or {})
    variable = leaf_of(fn)
    if variable is not None and variable._backward_hooks:
        per_output = {0: variable._backward_hooks}
    for nr, hooks in per_output.items():
        for hook in list(hooks.values()):
            if grads[nr] is None:
                continue
            result = hook(_wrap(grads[nr], make))
            if result is not None:
                grads[nr] = _unwrap(result, grads[nr], hook, create_graph)
    for nr, refs in (d.get("_retains_grad") or {}).items():
        for ref in refs.values():
            t = ref()
            if t is not None and grads[nr] is not None:
                retain(t, grads[nr])
    return grads


def run_node_pre_hooks(fn, grads, create_graph, make):
    pre = fn.__dict__.get("_pre_hooks")
    if pre:
        for hook in list(pre.values()):
            result = hook(tuple(_wrap(g, make) for g in grads))
            if result is not None:
                grads = _replaced(result, grads, hook, create_graph)
    return grads


def _replaced(result, grads, hook, create_graph):
    """The gradients a node hook returned in place of ``grads``, each checked."""
    if len(result) != len(grads):
        raise RuntimeError(f"hook '{hook_name(hook)}' returned {len(result)} values, "
                           f"expected {len(grads)}")
    return [None if r is None else _unwrap(r, g, hook, create_graph)
            for r, g in zip(result, grads)]


def retain(t, g):
    """retain_grad: ``t.grad`` becomes (or adds) ``g``, never an alias of it."""
    if isinstance(g, TensorBase):  # create_graph: a differentiable copy
        t._grad = ops.copy(g) if t._grad is None else t._grad + g
        return
    stored = g.copy() if t._grad is None else t._grad._data + g
    on_array(stored, "retain_grad")
    t._grad = t._make(stored)


def run_post_accumulate_grad_hooks(variable):
    hooks = variable._post_accumulate_grad_hooks
    if hooks:
        for hook in list(hooks.values()):
            check_post_accumulate_grad_result(hook(variable), variable)


def check_post_accumulate_grad_result(result, variable):
    """torch 2.13's checks: a post-accumulate-grad hook returns None (or the tensor
    it was given); another tensor, or anything else, is refused with its message."""
    if result is None or result is variable:
        return
    if not isinstance(result, TensorBase):
        raise TypeError(f"expected Variable, but hook returned '{type(result).__name__}'")
    raise RuntimeError("Tensor post accumulate grad hooks should return None.")


def run_post_hooks(fn, grad_inputs, grad_outputs, create_graph, make):
    """Node post-hooks: ``hook(grad_inputs, grad_outputs)`` may replace grad_inputs."""
    grad_inputs = list(grad_inputs)
    for hook in list(fn.__dict__["_post_hooks"].values()):
        result = hook(tuple(_wrap(g, make) for g in grad_inputs),
                      tuple(_wrap(g, make) for g in grad_outputs))
        if result is not None:
            grad_inputs = _replaced(result, grad_inputs, hook, create_graph)
    return tuple(grad_inputs)
