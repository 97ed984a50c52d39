"""Memory accounting of array storage: every allocation and free, by category.

A storage is the root ndarray that owns a buffer (``a.base`` followed to the end);
views are not allocations. An allocation is recorded when a kernel or a Tensor
produces a new storage while a ``MemoryTracker`` is active; its free is recorded by
a ``weakref.finalize`` on the storage, i.e. when numpy really releases the buffer.

Categories: parameter, activation, saved, recomputed, reloaded, gradient,
temporary. The front end says which applies by pushing a category (``category``)
or by the default resolver it installs (``set_default_category``). A storage that
gets saved for backward is re-tagged "saved" (``retag``).

Cheap when off: the hooks test one module global.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from compiled_autograd.runtime import prims

CATEGORIES = ("parameter", "activation", "saved", "recomputed", "reloaded", "gradient",
              "temporary")

_trackers: list["MemoryTracker"] = []
class _State(threading.local):
    stack = None        # (class defaults: getattr of an unset thread-local
    source = None       # attribute costs an AttributeError raised and caught)


_state = _State()
_default_category = lambda: "temporary"  # noqa: E731  (replaced by the front end)


def active() -> bool:
    return bool(_trackers)


def set_default_category(fn) -> None:
    global _default_category
    _default_category = fn


class category:
    """Context manager: allocations inside are of category ``name``."""

    def __init__(self, name, source=None):
        if name not in CATEGORIES:
            raise ValueError(f"unknown memory category {name!r}; one of {CATEGORIES}")
        self.name, self.source = name, source

    def __enter__(self):
        stack = getattr(_state, "stack", None)
        if stack is None:
            stack = _state.stack = []
        stack.append(self.name)
        return self

    def __exit__(self, *exc):
        _state.stack.pop()
        return False


def thread_state():
    """This thread's category stack and source (for a thread continuing its work)."""
    return list(getattr(_state, "stack", None) or ()), getattr(_state, "source", None)


def set_thread_state(state) -> None:
    """Install another thread's ``thread_state()`` on this one."""
    stack, _state.source = state
    _state.stack = list(stack)


def current_category() -> str:
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else _default_category()


class source:
    """Context manager naming what allocates (an autograd node during backward)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self._prev = getattr(_state, "source", None)
        _state.source = self.name
        return self

    def __exit__(self, *exc):
        _state.source = self._prev
        return False


def _root(arr):
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


@dataclass
class Event:
    step: int        # index of the op (kernel call) during the profile
    action: str      # "alloc", "free" or "retag"
    bytes: int
    category: str    # for retag: the new category
    name: str        # what allocated it (prim, node, factory)
    storage: int     # id of the storage, to pair alloc and free


class MemoryTracker:
    """One accounting session: events, live bytes per category, the peak."""

    def __init__(self):
        self.events: list[Event] = []
        self.live: dict[int, tuple[int, str]] = {}   # storage id -> (bytes, category)
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_step = 0
        self.step = 0
        self.by_category = dict.fromkeys(CATEGORIES, 0)
        self.peak_by_category = dict(self.by_category)   # at the overall peak
        self.max_by_category = dict(self.by_category)    # each category's own maximum
        self._closed = False

    def alloc(self, arr, name, cat=None):
        root = _root(arr)
        key = id(root)
        if key in self.live or root.nbytes == 0:
            return
        cat = cat or current_category()
        nbytes = int(root.nbytes)
        self.live[key] = (nbytes, cat)
        self.live_bytes += nbytes
        self.by_category[cat] += nbytes
        self.max_by_category[cat] = max(self.max_by_category[cat], self.by_category[cat])
        self.events.append(Event(self.step, "alloc", nbytes, cat, name, key))
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_step = self.step
            self.peak_by_category = dict(self.by_category)
        weakref.finalize(root, _free_later, weakref.ref(self), key, name)

    def _free(self, key, name):
        entry = self.live.pop(key, None)
        if entry is None or self._closed:
            return
        nbytes, cat = entry
        self.live_bytes -= nbytes
        self.by_category[cat] -= nbytes
        self.events.append(Event(self.step, "free", nbytes, cat, name, key))

    def retag(self, arr, cat):
        key = id(_root(arr))
        entry = self.live.get(key)
        if entry is None or entry[1] == cat:
            return
        nbytes, old = entry
        self.live[key] = (nbytes, cat)
        self.by_category[old] -= nbytes
        self.by_category[cat] += nbytes
        self.max_by_category[cat] = max(self.max_by_category[cat], self.by_category[cat])
        self.events.append(Event(self.step, "retag", nbytes, cat, old, key))

    def close(self):
        self._closed = True


def _free_later(tracker_ref, key, name):
    tracker = tracker_ref()  # a finished profile may be gone: then nothing to record
    if tracker is not None:
        tracker._free(key, name)


def start() -> MemoryTracker:
    tracker = MemoryTracker()
    _trackers.append(tracker)
    _install()
    return tracker


def stop(tracker: MemoryTracker) -> None:
    _trackers.remove(tracker)
    tracker.close()
    _install()


# ---------------------------------------------------------------- the hooks

def on_kernel(prim, out, args):
    """Called after every kernel while tracking: ``out`` is an allocation unless it
    is a view of one of the array arguments."""
    for tracker in _trackers:
        tracker.step += 1
    if not isinstance(out, np.ndarray):
        return
    if out.base is not None:
        root = _root(out)
        for a in args:
            if isinstance(a, np.ndarray) and _root(a) is root:
                return
    name = prim.name
    src = getattr(_state, "source", None)
    if src:
        name = f"{src}:{name}"
    for tracker in _trackers:
        tracker.alloc(out, name)


def on_array(arr, name, cat=None):
    """A storage made outside a kernel (factories, copies, reloads)."""
    for tracker in _trackers:
        tracker.alloc(arr, name, cat)


def mark(label):
    """A named point in the timeline (a graph node finished), for alignment."""
    for tracker in _trackers:
        tracker.events.append(Event(tracker.step, "mark", 0, "", label, 0))


def on_retag(arr, cat):
    for tracker in _trackers:
        tracker.retag(arr, cat)


def _install():
    """Point the prim table's kernel hook at ``on_kernel`` while tracking."""
    prims.set_kernel_hook(on_kernel if _trackers else None)


def retag_saved(arr) -> None:
    """A storage saved for backward: activation -> saved."""
    key = id(_root(arr))
    for tracker in _trackers:
        entry = tracker.live.get(key)
        if entry is not None and entry[1] == "activation":
            tracker.retag(arr, "saved")
