"""What a ``call_hook`` node does at run time, one function per hook kind (and
what a ``store`` node does: ``store``).

A compiled backward carries arrays; user hooks see Tensors, as in eager. These
functions wrap, call, check and unwrap; the interpreter and the generated code both
call them (``CALL_HOOK[kind]``).

A hook or a custom backward may modify a saved tensor in place. Eager raises when
the node that saved it unpacks it; a compiled backward read every saved value's
version when it started, so after each call into Python it checks the values read
before the next call -- only if anything was written in place since it started
(``VersionCounter.writes``): ``checking_versions``, ``after_python``.
"""
from __future__ import annotations

import functools
import threading
import warnings

import numpy as np

from compiled_autograd.autograd.hooks import (check_hook_result,
                                              check_post_accumulate_grad_result, hook_name)
from compiled_autograd.autograd.node import accumulate_into, checked_unpack
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.autograd.tensor_base import VersionCounter

_versions = threading.local()


class checking_versions:
    """While a compiled backward runs (a context manager): ``checks[k]``, the
    values read after its k-th call into Python and before the next
    (``passes.saved_reads_after_callbacks``): saved values (``plain[i]``) and kept
    arrays of a memory plan (``kept[j]``, their ``KeptVersion``)."""

    __slots__ = ("checks", "values")

    def __init__(self, checks, plain, kept=()):
        self.checks, self.values = checks, (plain, kept)

    def __enter__(self):
        stack = getattr(_versions, "stack", None)
        if stack is None:
            stack = _versions.stack = []
        stack.append([self.checks, self.values, 0, VersionCounter.writes])

    def __exit__(self, *exc):
        _versions.stack.pop()


def checking() -> bool:
    """Whether a compiled backward on this thread checks versions: a backward run
    inside one of its calls into Python (a hook's nested backward) must then be
    counted apart, even with nothing to check (its calls are not the outer's)."""
    return bool(getattr(_versions, "stack", None))


def after_python():
    """A call into Python returned: if anything was written in place since the
    backward started, the saved values read before the next call must be the
    versions they were saved at (eager's error, as the node unpacking them raises)."""
    stack = getattr(_versions, "stack", None)
    if not stack:
        return
    run = stack[-1]
    checks, (plain, kept), k, writes = run
    run[2] = k + 1
    if VersionCounter.writes != writes and k < len(checks):
        for kind, i, name, origin in checks[k]:
            if kind == "saved":
                plain[i].check_version(name, origin)
            else:
                kept[i].check(name)


def _calls_python(kind):
    """A hook kind that runs the user's code: ``after_python`` once it returned."""
    @functools.wraps(kind)
    def call(*args):
        result = kind(*args)
        after_python()
        return result
    return call


def _tensor(a):
    return None if a is None else Tensor._make(a)


def _array(result, like, hook):
    if not isinstance(result, Tensor):
        raise TypeError(f"hook '{hook_name(hook)}' returned {type(result).__name__}, "
                        "expected a Tensor or None")
    check_hook_result(result, like, hook)
    return result._data


@_calls_python
def unpack_hook(hook, packed, shape=None):
    """A saved value under saved-tensor hooks: recompute, reload, ... ``shape``:
    the saved value's, which the result must have."""
    return checked_unpack(hook(packed), shape)._data


@_calls_python
def tensor_pre_hook(hook, grad):
    """A hook registered on a tensor: may replace its gradient."""
    result = hook(_tensor(grad))
    return grad if result is None else _array(result, grad, hook)


def _replaced(result, grads, hook):
    """A node hook's replacement gradients. Which gradients are None is fixed
    when the backward is traced: a hook that drops one is refused."""
    if len(result) != len(grads):
        raise RuntimeError(f"hook '{hook_name(hook)}' returned {len(result)} values, "
                           f"expected {len(grads)}")
    out = []
    for i, (r, g) in enumerate(zip(result, grads)):
        if r is None and g is not None:
            raise RuntimeError(
                f"compiled autograd: hook '{hook_name(hook)}' returned None for gradient "
                f"{i}, which is not None; a compiled backward cannot drop a gradient (its "
                "graph is fixed when traced): return zeros, or run this backward outside "
                "ca.compiled_backward()")
        out.append(None if r is None else _array(r, g, hook))
    return tuple(out)


@_calls_python
def pre_hook(hook, *grads):
    """A node pre-hook: may replace the node's incoming gradients."""
    result = hook(tuple(_tensor(g) for g in grads))
    return grads if result is None else _replaced(result, grads, hook)


@_calls_python
def post_hook(hook, n_inputs, *grads):
    """A node post-hook ``hook(grad_inputs, grad_outputs)``: may replace grad_inputs."""
    grad_inputs, grad_outputs = grads[:n_inputs], grads[n_inputs:]
    result = hook(tuple(_tensor(g) for g in grad_inputs),
                  tuple(_tensor(g) for g in grad_outputs))
    return tuple(grad_inputs) if result is None else _replaced(result, grad_inputs, hook)


@_calls_python
def call_backward(ctx, takes, n_saved, *values):
    """A custom Function's backward, run as Python: ``values`` are its saved
    values (``n_saved`` of them), then its incoming gradients; ``takes[i]``:
    the graph goes on with gradient ``i``.

    Which gradients a backward returns as None is known once it has run: the
    graph is traced with the Nones it returned the first time (compiled.api runs
    that backward eagerly). If a later backward returns otherwise, ``learning``
    reports it, so that the next backward is traced again with what it returned;
    and this one uses zeros for a missing gradient (with a warning: eager passes
    none), or raises for an unexpected one (its graph has no use for it: going on
    would lose a gradient)."""
    grads = ctx.backward_with(values[:n_saved], values[n_saved:])
    for g, t in zip(grads, takes):
        if (g is not None) != t:
            break
    else:
        return grads
    seen = getattr(_learned, "seen", None)
    if seen is not None:
        seen.append((ctx, tuple(g is None for g in grads)))
    extra = [i for i, (g, t) in enumerate(zip(grads, takes)) if g is not None and not t]
    if extra:
        raise RuntimeError(
            f"compiled autograd: {ctx.name()} returned a gradient for input {_listed(extra)}, "
            "for which it returned None when this backward was compiled: the compiled graph "
            "has no use for it. The next backward of this structure is traced again with "
            "it; a backward whose Nones change from call to call can run as eager autograd "
            "(outside ca.compiled_backward()) or traced (inline_backward = True)")
    fixed = list(grads)
    missing = []
    for i, ((nxt, nr), t) in enumerate(zip(ctx.next_functions, takes)):
        if t and grads[i] is None:
            fixed[i] = np.zeros(*nxt.input_metadata[nr])
            missing.append(i)
    warnings.warn(f"compiled autograd: {ctx.name()} returned None for gradient "
                  f"{_listed(missing)}, which its compiled graph goes on with: this backward "
                  "used zeros there (eager autograd passes no gradient). The next backward of "
                  "this structure is traced again with the Nones it returned now.",
                  RuntimeWarning, stacklevel=2)
    return tuple(fixed)


def _listed(positions):
    return ", ".join(str(i) for i in positions)


_learned = threading.local()


class learning:
    """Collect (ctx, which gradients it returned as None) of every custom
    backward that returned Nones unlike its graph, during one run (a context
    manager: ``with learning() as seen``)."""

    __slots__ = ("previous",)

    def __enter__(self):
        self.previous = getattr(_learned, "seen", None)
        _learned.seen = seen = []
        return seen

    def __exit__(self, *exc):
        _learned.seen = self.previous


def store(dst, src):
    """A ``store`` node: ``src`` written into the input array ``dst`` (no value)."""
    np.copyto(dst, src)


@_calls_python
def post_acc_grad_hook(hook, variable):
    check_post_accumulate_grad_result(hook(variable), variable)


CALL_HOOK = {"unpack_hook": unpack_hook, "tensor_pre_hook": tensor_pre_hook,
             "pre_hook": pre_hook, "post_hook": post_hook,
             "post_acc_grad_hook": post_acc_grad_hook, "call_backward": call_backward,
             # (variable, grad, owned=False): owned, the caller made grad and holds
             # no other use of it
             "accumulate_grad": accumulate_into}
