"""The saved-tensor hook stack (thread-local, innermost pair wins). Public names are
re-exported by ``ca.autograd.graph``; this module has no dependencies so that
SavedVariable can consult it.

The stack and the disabling message are ``ContextVar``s (thread-local: each thread
has its own context): whatever a backward pushes -- a checkpoint's recomputation
hooks -- is gone when the backward ends, however it ends (``grad_mode.isolated``),
even if a KeyboardInterrupt lands in the ``__exit__`` that pops it."""
from __future__ import annotations

import contextvars

_stack_var = contextvars.ContextVar("compiled_autograd.saved_tensors_hooks", default=())
_disabled = contextvars.ContextVar("compiled_autograd.saved_tensors_hooks_disabled",
                                   default=None)


def _stack() -> tuple:
    return _stack_var.get()


def thread_state():
    """This thread's hook stack and disabling message (for a thread that continues
    this thread's work: the engine's reentrant backward on a fresh thread)."""
    return _stack_var.get(), _disabled.get()


def set_thread_state(state) -> None:
    """Install ``thread_state()`` of another thread on this one."""
    stack, disabled = state
    _stack_var.set(tuple(stack))
    _disabled.set(disabled)


def current_hooks():
    """The innermost (pack, unpack, kind) triple, or None. Hot path: keep it cheap."""
    stack = _stack_var.get()
    return stack[-1] if stack else None


def hooks_below(hooks):
    """The triple under ``hooks`` (the innermost ``hooks`` on the stack), or None:
    what a memory plan's pack (kind "recipe") hands a value it does not recompute."""
    stack = _stack()
    for i in range(len(stack) - 1, 0, -1):
        if stack[i] is hooks:
            return stack[i - 1]
    return None


class saved_tensors_hooks:
    """Context manager installing a (pack_hook, unpack_hook) pair."""

    # What the packed data of these hooks is, recorded on each saved value
    # (SavedVariable.packed_kind): "hook" (a user's), "checkpoint", "offload".
    kind = "hook"

    def __init__(self, pack_hook, unpack_hook):
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self):
        message = _disabled.get()
        if message is not None and self.kind != "recipe":
            # (a memory plan's are no user's hooks: they replace values by how to
            # make them again, exactly; disabling hooks does not refuse them)
            raise RuntimeError(message)
        _stack_var.set(_stack_var.get() + ((self.pack_hook, self.unpack_hook, self.kind),))
        return self

    def __exit__(self, *exc):
        _stack_var.set(_stack_var.get()[:-1])
        return False


class disable_saved_tensors_hooks:
    """Inside, registering saved-tensor hooks raises ``error_message``."""

    def __init__(self, error_message):
        self.error_message = error_message

    def __enter__(self):
        if any(hooks[2] != "recipe" for hooks in _stack()):
            raise RuntimeError(self.error_message)  # as torch: hooks already active
        self._prev = _disabled.get()
        _disabled.set(self.error_message)
        return self

    def __exit__(self, *exc):
        _disabled.set(self._prev)
        return False
