"""Grad mode: whether ops record autograd history (thread-local, as in torch).

The mode is a ``ContextVar`` (each thread has its own context, so it is
thread-local; a new thread starts with grad mode on). ``isolated(fn, ...)`` runs
``fn`` in a copy of the context: whatever ``fn`` changes -- grad mode, the
engine's running graph tasks -- is undone when it returns or raises, by
``Context.run`` in C. No Python runs between ``fn``'s end and that restoration,
so a KeyboardInterrupt (Ctrl-C, a signal handler) cannot land in it and leave
the thread's state behind, as it could in a ``finally:`` or an ``__exit__``.
torch's engine restores its thread-local state with C++ guards, the same way.
"""
from __future__ import annotations

import contextvars
import functools
import inspect

_enabled = contextvars.ContextVar("compiled_autograd.grad_enabled", default=True)

#: is_grad_enabled() -> bool: whether ops record autograd history on this thread
is_grad_enabled = _enabled.get
_set = _enabled.set


def isolated(fn, *args):
    """``fn(*args)``; this thread's grad mode and engine state are back as they
    were when it returns or raises, whatever exception arrives and wherever."""
    return contextvars.copy_context().run(fn, *args)


class _GradMode:
    _enabled: bool

    def __new__(cls, fn=None):
        # ``@no_grad`` without a call decorates ``fn`` directly (as torch).
        self = super().__new__(cls)
        return self if fn is None else self(fn)

    def __enter__(self):
        self._prev = is_grad_enabled()
        _set(self._enabled)
        return self

    def __exit__(self, *exc):
        _set(self._prev)
        return False

    def __call__(self, fn):
        """Use as a decorator (of a generator function too: its body runs in this
        mode at every step, as torch's _wrap_generator)."""
        if inspect.isgeneratorfunction(fn):
            return _wrap_generator(type(self), fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)
        return wrapper


def _wrap_generator(mode, fn):
    """``fn``'s generator, each of its steps (and its close) run under ``mode()``; the
    caller's mode is back whenever the generator yields."""
    @functools.wraps(fn)
    def generator_context(*args, **kwargs):
        gen = fn(*args, **kwargs)
        try:
            with mode():
                response = gen.send(None)
            while True:
                try:
                    request = yield response
                except GeneratorExit:
                    with mode():
                        gen.close()
                    raise
                except BaseException as e:   # thrown in by the caller: forwarded
                    with mode():
                        response = gen.throw(e)
                else:
                    with mode():
                        response = gen.send(request)
        except StopIteration as e:
            return e.value
    return generator_context


class no_grad(_GradMode):
    """Context manager / decorator: ops inside record no autograd history."""
    _enabled = False


class enable_grad(_GradMode):
    """Context manager / decorator: re-enable history recording (e.g. inside no_grad)."""
    _enabled = True


class set_grad_enabled(_GradMode):
    """Context manager / function: set grad mode to ``mode``."""

    def __new__(cls, mode):
        return object.__new__(cls)

    def __init__(self, mode: bool):
        self._enabled = bool(mode)
        self._prev = is_grad_enabled()
        _set(self._enabled)  # torch: takes effect on construction too

    def __enter__(self):
        return self

    def __call__(self, fn):
        raise TypeError("set_grad_enabled cannot be used as a decorator without a mode")
