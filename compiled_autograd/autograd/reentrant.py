"""Deep reentrant backwards: past a depth, the nested backward runs on a fresh thread.

A reentrant backward is one started while another runs on the same thread (a custom
Function's backward, or a reentrant checkpoint, calling ``.backward()``). Each level
costs Python frames (the engine's walk, the node, the user's backward), so a deep
enough nesting exhausts the interpreter's recursion limit. torch's engine
(engine.cpp, ``max_recursion_depth_``/``reentrant_thread_init``) counts the
reentrant depth of each thread and, from ``MAX_DEPTH`` (60) on, hands the nested
graph task to another thread, which starts again at depth 0 while the caller waits.

Here the same: ``hop_needed()`` is true from ``MAX_DEPTH`` nested backwards on this
thread on, or when half the recursion limit is used up (deep user code, heavy
backward functions); ``on_fresh_thread`` then runs the backward on a new thread
with a large stack, carrying over this thread's state (grad mode, saved-tensor
hooks, memory accounting, and what the engine hands it: its running graph tasks
and compiler stack), and re-raises in the caller whatever the backward raised.
"""
from __future__ import annotations

import contextvars
import sys
import threading

from compiled_autograd.autograd import saved_hooks as _saved_hooks
from compiled_autograd.autograd.grad_mode import is_grad_enabled, isolated, set_grad_enabled
from compiled_autograd.runtime import memory as _rt_memory

MAX_DEPTH = 60                  # torch's reentrant depth per thread
STACK_SIZE = 64 * 1024 * 1024   # each hop thread's C stack (MAX_DEPTH levels need ~1 MB)

# (a ContextVar, restored by grad_mode.isolated: see nested)
_depth = contextvars.ContextVar("compiled_autograd.reentrant_depth", default=0)
#: depth() -> int: how many reentrant backwards are running on this thread (0 on a
#: hop thread)
depth = _depth.get


def nested(fn):
    """``fn()``, counted as one more reentrant backward on this thread; the count is
    back when it returns or raises, wherever an exception arrives."""
    return isolated(_nested, fn)


def _nested(fn):
    _depth.set(_depth.get() + 1)
    return fn()


def _frames_in_use() -> int:
    n, frame = 0, sys._getframe()
    while frame is not None:
        n, frame = n + 1, frame.f_back
    return n


def hop_needed() -> bool:
    """Should the reentrant backward about to start go to a fresh thread?"""
    return depth() >= MAX_DEPTH or _frames_in_use() > sys.getrecursionlimit() // 2


def on_fresh_thread(fn, install=None):
    """``fn()`` on a new thread (which sees this thread's grad mode, saved-tensor
    hooks and memory accounting state, plus whatever ``install()`` sets up there),
    waiting for it; returns its result or re-raises its exception here."""
    grad_mode = is_grad_enabled()
    hooks = _saved_hooks.thread_state()
    accounting = _rt_memory.thread_state()
    outcome = {}

    def main():
        try:
            set_grad_enabled(grad_mode)  # (takes effect when made)
            _saved_hooks.set_thread_state(hooks)
            _rt_memory.set_thread_state(accounting)
            if install is not None:
                install()
            outcome["result"] = fn()
        except BaseException as e:       # noqa: BLE001 -- re-raised by the caller
            outcome["error"] = e

    thread = threading.Thread(target=main, name="ca-reentrant-backward", daemon=True)
    previous = threading.stack_size(STACK_SIZE)
    try:
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    if "error" in outcome:
        error = outcome.pop("error")
        try:
            raise error
        finally:
            del error                   # (no cycle through this frame)
    return outcome["result"]
