"""The cache of compiled autograd, its stats and its logs.

A backward's key is what its nodes' ``compiled_args`` collected (structure, types,
attributes, hook kinds); its sizes are compared apart, so that a size that changes
between calls of one structure becomes dynamic (``Family``: the compiled graphs of
one key, for different sizes, each with its guards). ``CA_LOGS=graph`` logs each new
graph, ``CA_LOGS=verbose`` also why the cache missed, through the logger
``compiled_autograd``.

The cache is bounded as torch's (``torch._dynamo.config.recompile_limit``, 8): a
structure holds at most ``recompile_limit`` graphs (``CA_RECOMPILE_LIMIT``, default
8). Past it, its backwards run on the eager engine, and a warning says so once,
naming the sizes that kept changing (e.g. a LayerNorm over 300 widths, whose
width the graph specializes on). So a lookup is one dict probe for the structure
and at most ``recompile_limit`` guard checks, whatever the number of entries.
"""
from __future__ import annotations

import logging
import operator
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field

from compiled_autograd.ir.symbolic import guards_hold

log = logging.getLogger("compiled_autograd")

# ---------------------------------------------------------------- stats, logging

stats = {"captures": 0, "compiles": 0, "cache_hits": 0, "compile_seconds": 0.0}


def compiled_autograd_stats() -> dict:
    """captures (graphs traced), compiles (backend compilations), cache_hits,
    compile_seconds (time spent tracing and compiling)."""
    return dict(stats)


def log_flags():
    return {f.strip() for f in os.environ.get("CA_LOGS", "").split(",") if f.strip()}


def log_event(kind, message):
    flags = log_flags()
    if kind in flags or (kind == "graph" and "verbose" in flags):
        ensure_handler()
        log.info(message)


def ensure_handler():
    """CA_LOGS alone shows the logs (like TORCH_LOGS): attach a stderr handler to
    the ``compiled_autograd`` logger unless the application configured one."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[compiled_autograd] %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)


# ---------------------------------------------------------------- the cache


@dataclass
class Family:
    """The compiled graphs of one structure (one key), for different sizes."""
    dynamic: set            # positions in ``sizes`` made symbolic
    entries: list           # (static (position, value) pairs, guards, CompiledBackward)
    last_sizes: tuple = ()  # (or the list a hit collected)
    compiler: object = None  # kept alive: its id is in the key
    # node rank -> which gradients that custom Function's backward returned as
    # None, learned at run time (``hook_calls.call_backward``); the tracer
    # makes them None in the graph.
    none_masks: dict = field(default_factory=dict)
    nones_seen: bool = False   # a backward of this structure ran eagerly to learn them
    warned: bool = False       # over_limit warned

    def over_limit(self, sizes):
        """A miss past ``recompile_limit``: warn once, naming the sizes that changed."""
        if self.warned:
            return
        self.warned = True
        changed = [f"s{p}: {a} -> {b}" for p, (a, b) in enumerate(zip(self.last_sizes, sizes))
                   if a != b]
        what = ", ".join(changed) if changed else "none (a guard on a scalar or size failed)"
        warnings.warn(f"compiled autograd: this backward's structure reached the recompile "
                      f"limit ({recompile_limit} graphs, CA_RECOMPILE_LIMIT); its backwards "
                      f"now run on the eager engine. The values that changed since the last "
                      f"graph: {what}. (Sizes that change every call: compiled_backward("
                      f"dynamic=True) lifts them from the start.)", RuntimeWarning,
                      stacklevel=_user_stacklevel())

    def lookup(self, sizes, scalars):
        for static, guards, entry in self.entries:
            if static(sizes) and (not guards or guards_hold(guards, sizes, scalars)):
                return entry
        return None


def static_check(sizes, dynamic):
    """A C-speed test that the static sizes equal these (it takes a list: what
    ``CompiledNodeArgs.sizes`` is)."""
    positions = [p for p in range(len(sizes)) if p not in dynamic]
    if len(positions) == len(sizes):
        return list(sizes).__eq__
    if not positions:
        return lambda s: True
    pick = operator.itemgetter(*positions)
    expected = pick(sizes)
    return lambda s: pick(s) == expected


def _user_stacklevel():
    """The warnings stacklevel of the first caller outside this package (the
    user's ``backward()``), seen from ``Family.over_limit``."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(package):
        level, frame = level + 1, frame.f_back
    return level


#: The most graphs one structure (one key) compiles; then it runs eagerly (torch's
#: recompile_limit)
recompile_limit = int(os.environ.get("CA_RECOMPILE_LIMIT", "8"))

families: dict = {}   # key -> Family
lock = threading.Lock()


def reset_compiled_autograd() -> None:
    """Drop the cache and zero the stats."""
    with lock:
        families.clear()
        for k in stats:
            stats[k] = 0 if k != "compile_seconds" else 0.0


def _node_type(item):
    if isinstance(item, type):
        return item
    if isinstance(item, tuple) and item and isinstance(item[0], type):
        return item[0]
    return None


def miss_reason(collected_key):
    """Why the cache missed: the first item of the key no cached key shares."""
    best, best_len = None, -1
    for other in families:
        n = 0
        for a, b in zip(other[-1], collected_key):
            if a != b:
                break
            n += 1
        if n > best_len:
            best, best_len = other, n
    if best is None:
        return "cache miss: empty cache"
    # Name the autograd node whose collected args differ (NodeCall = its rank in
    # the walk): every node's args end with its edges.
    call = sum(1 for item in collected_key[:best_len]
               if isinstance(item, tuple) and item[:1] == ("edges",))
    item = collected_key[best_len] if best_len < len(collected_key) else None
    theirs = best[-1][best_len] if best_len < len(best[-1]) else None
    ours_type = _node_type(item)
    if ours_type is not None and ours_type is not _node_type(theirs):
        return f"cache miss: new autograd node {ours_type.__name__} (NodeCall {call})"
    node_type = next((_node_type(k) for k in reversed(collected_key[:best_len + 1])
                      if _node_type(k) is not None), None)
    what = node_type.__name__ if node_type else "graph"
    return f"cache miss: changed args of {what} (NodeCall {call}): {item!r}"
