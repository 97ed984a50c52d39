"""The cache hit's two walks over the autograd graph, in C where a compiler is.

A cache hit of compiled autograd walks every autograd node twice in Python: the
graph task's discovery (ranks and edges) and the collection of compiled args (the
key and the runtime values). At about 2 us per node that was most of a hit on a
small graph. ``native_walk.c`` (with its tables, ``native_walk_tables.c``) does the
same two walks in C: ``discover`` is
``GraphTask._discover`` line for line, and ``collect_nodes`` is ``tracer.collect``'s
node loop (``record=False``) for the common nodes only -- a prim's backward node
or an AccumulateGrad with no hooks, whose saved variables are plain arrays.
Everything else (hooks, custom Functions, checkpoint and offload saved values,
freed or modified saved values and their errors) is handed back to the Python
code, so the rules stay written once, in Python.

The module is built on first use with the system C compiler against this
interpreter's headers (``runtime.cbuild.build_extension``, the C backend's private
cache: a second process loads it without compiling). Without a compiler or the
headers, or with ``CA_NATIVE_WALK=0``, the Python walks run: same keys, same
values (tests/test_native_walk.py compares the two on every scenario), slower.
Only compiled autograd's hit path uses it; the eager engine stays pure Python.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("compiled_autograd")

# One translation unit, in this order: the tables, then the walks.
SOURCES = (Path(__file__).with_name("native_walk_tables.c"),
           Path(__file__).with_name("native_walk.c"))
_lock = threading.Lock()
_module = None
_status = None        # "native: <path>" or "python: <why>"
_enabled = os.environ.get("CA_NATIVE_WALK", "1") != "0"   # read once: hits are hot


def source() -> str:
    """The extension's C source: SOURCES joined, each behind a #line directive so
    that the compiler's messages name the right file and line."""
    return "".join(f'#line 1 "{path.name}"\n{path.read_text()}' for path in SOURCES)


def enabled() -> bool:
    return _enabled


def module():
    """The loaded C module, or None (disabled, or it could not be built)."""
    if not _enabled:
        return None
    if _status is None:
        with _lock:
            if _status is None:
                _load()
    return _module


def loaded():
    """The C module if it is already loaded, else None; never builds it."""
    return _module


@contextlib.contextmanager
def disabled():
    """The Python walks, for the duration (as ``CA_NATIVE_WALK=0`` does for a whole
    process): for comparing the two."""
    global _enabled
    old, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = old


def status() -> str:
    """Which walks a cache hit uses, and why: ``native: <library>`` or
    ``python: <reason>``."""
    if not _enabled:
        return "python: disabled by CA_NATIVE_WALK=0"
    module()
    return _status


def _load() -> None:
    global _module, _status
    from runtime.cbuild import CBuildError, build_extension
    try:
        path, _ = build_extension(source(), "_native_walk")
        spec = importlib.util.spec_from_file_location("_native_walk", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except (CBuildError, OSError, ImportError) as e:
        _status = f"python: the C walk could not be built ({str(e).splitlines()[0]})"
        log.info("compiled autograd: %s", _status)
        return
    _module, _status = mod, f"native: {path}"


def reset() -> None:
    """Forget the loaded module (tests: build it again, or under other settings)."""
    global _module, _status
    with _lock:
        _module = _status = None
