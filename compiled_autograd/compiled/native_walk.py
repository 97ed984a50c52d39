"""The cache hit's two walks over the autograd graph, in C where a compiler is.

A cache hit of compiled autograd walks every autograd node twice in Python: the
graph task's discovery (ranks and edges) and the collection of compiled args (the
key and the runtime values). At about 2 us per node that was most of a hit on a
small graph. ``native_walk.c`` (with its tables, ``native_walk_tables.c``) does the
same two walks in C: ``discover`` is
``GraphTask._discover`` line for line, and ``collect_nodes`` is ``compiled_args.collect``'s
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

from pathlib import Path

from runtime.extension import Extension

# One translation unit, in this order: the tables, then the walks.
SOURCES = (Path(__file__).with_name("native_walk_tables.c"),
           Path(__file__).with_name("native_walk.c"))
_EXTENSION = Extension("_native_walk", SOURCES, "the C walk", "CA_NATIVE_WALK")

source = _EXTENSION.source
enabled = _EXTENSION.enabled
module = _EXTENSION.module        # the loaded C module, or None
loaded = _EXTENSION.loaded        # the module if already loaded; never builds it
disabled = _EXTENSION.disabled    # the Python walks for the duration (comparisons)
status = _EXTENSION.status        # "native: <library>" or "python: <reason>"
reset = _EXTENSION.reset
