"""Compiled autograd: entry points, the cache, stats, logging and the backend registry.

``with ca.compiled_backward(backend="eager"):`` routes ``.backward()`` and
``ca.autograd.grad`` through ``run``: collect the compiled args of the autograd
graph (the key and the runtime values), look the key up, trace and compile on a
miss, then call the compiled graph with the boxed lists. ``ca.trace_backward`` traces
without running anything.

Backends resolve by name through ``BACKENDS`` ("eager" is the reference
interpreter; code generators register theirs by module path, so this layer never
imports them) or are a user callable ``compiler_fn(graph) -> callable``.
"""
from __future__ import annotations

import importlib
import logging
from contextlib import nullcontext
import operator
import os
import threading
import time
from dataclasses import dataclass

from compiled_autograd.autograd import engine
from compiled_autograd.ir import passes
from compiled_autograd.compiled import tracer
from compiled_autograd.autograd.grad_mode import set_grad_enabled
from compiled_autograd.compiled.interpreter import Interpreter
from compiled_autograd.ir.symbolic import ShapeEnv, guards_hold
from runtime import memory as _memory

log = logging.getLogger("compiled_autograd")

# name -> "module:function" or a compiler callable(graph) -> callable
BACKENDS: dict = {"eager": Interpreter, "python": "codegen.python:compile_graph",
                  "c": "codegen.c_run:compile_graph"}


def register_backend(name: str, compiler) -> None:
    """Register ``compiler(graph) -> callable`` (or a "module:function" path)."""
    BACKENDS[name] = compiler


def resolve_backend(backend):
    if callable(backend):
        return backend
    try:
        compiler = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown compiled autograd backend {backend!r}; "
                         f"available: {sorted(BACKENDS)}") from None
    if isinstance(compiler, str):
        module, _, attr = compiler.partition(":")
        compiler = BACKENDS[backend] = getattr(importlib.import_module(module), attr)
    return compiler


# ---------------------------------------------------------------- stats, logging

_stats = {"captures": 0, "compiles": 0, "cache_hits": 0, "compile_seconds": 0.0}


def compiled_autograd_stats() -> dict:
    """captures (graphs traced), compiles (backend compilations), cache_hits,
    compile_seconds (time spent tracing and compiling)."""
    return dict(_stats)


def _log_flags():
    return {f.strip() for f in os.environ.get("CA_LOGS", "").split(",") if f.strip()}


def _log(kind, message):
    flags = _log_flags()
    if kind in flags or (kind == "graph" and "verbose" in flags):
        _ensure_handler()
        log.info(message)


def _ensure_handler():
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
class CompiledBackward:
    """A traced backward: its graph and the compiled callable."""
    graph: object
    fn: object
    constants: list
    key: tuple
    unpack: str
    packed_kinds: list = None

    def memory_schedule(self):
        """The planned schedule: live bytes after every node, the peak, what is
        live at the peak, each unpacked value's unpack and free step."""
        from compiled_autograd.memory.schedule import memory_schedule
        schedule = memory_schedule(self.graph, self.packed_kinds or ())
        schedule.arena = getattr(self.fn, "memory_plan", None)
        return schedule

    def c_memory_plan(self):
        """The C backend's static arena plan for this graph (no compiler needed):
        ``.size`` (the most arena bytes held at once), ``.lower_bound`` (most bytes
        live at one step), ``.total`` (all buffers without reuse), ``.offsets`` (in
        each buffer's block), ``.block_of``, ``.windows`` and ``.block_sizes`` (one
        block without callbacks; see codegen/arena.py), ``.summary()``."""
        plan = getattr(self.fn, "memory_plan", None)
        return plan if plan is not None else resolve_backend("c")(self.graph, build=False).memory_plan

    def print_tabular(self):
        """Print opcode | name | target | args | shape | bytes, one row per node."""
        print(self.graph.tabular())

    @property
    def code(self) -> str:
        """The generated straight-line Python source (backend "python")."""
        fn = self.fn
        if getattr(fn, "code", None) is None:
            fn = resolve_backend("python")(self.graph)
        return fn.code

    @property
    def c_code(self) -> str:
        """The generated C source (backend "c"); generating it needs no compiler."""
        fn = self.fn
        if getattr(fn, "c_code", None) is None:
            fn = resolve_backend("c")(self.graph, build=False)
        return fn.c_code

    def to_dot(self) -> str:
        return self.graph.to_dot()

    def to_json(self) -> str:
        return self.graph.to_json()

    def __str__(self):
        return str(self.graph)


@dataclass
class _Family:
    """The compiled graphs of one structure (one key), for different sizes."""
    dynamic: set            # positions in ``sizes`` made symbolic
    entries: list           # (static (position, value) pairs, guards, CompiledBackward)
    last_sizes: tuple = ()
    compiler: object = None  # kept alive: its id is in the key

    def lookup(self, sizes, scalars):
        for static, guards, entry in self.entries:
            if static(sizes) and (not guards or guards_hold(guards, sizes, scalars)):
                return entry
        return None


def _static_check(sizes, dynamic):
    """A C-speed test that the static sizes equal these."""
    positions = [p for p in range(len(sizes)) if p not in dynamic]
    if len(positions) == len(sizes):
        return sizes.__eq__
    if not positions:
        return lambda s: True
    pick = operator.itemgetter(*positions)
    expected = pick(sizes)
    return lambda s: pick(s) == expected


_cache: dict = {}
_cache_lock = threading.Lock()


def reset_compiled_autograd() -> None:
    """Drop the cache and zero the stats."""
    with _cache_lock:
        _cache.clear()
        for k in _stats:
            _stats[k] = 0 if k != "compile_seconds" else 0.0


def _node_type(item):
    if isinstance(item, type):
        return item
    if isinstance(item, tuple) and item and isinstance(item[0], type):
        return item[0]
    return None


def _miss_reason(collected_key):
    """Why the cache missed: the first item of the key no cached key shares."""
    best, best_len = None, -1
    for other in _cache:
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


# ---------------------------------------------------------------- options


_options = threading.local()


def current_options():
    """The innermost compiled_backward's options, or None (eager autograd)."""
    stack = getattr(_options, "stack", None)
    return stack[-1] if stack else None


class compiled_backward:
    """Context manager: ``.backward()`` and ``autograd.grad`` inside run through
    compiled autograd with ``backend`` ("eager" | a registered name | a callable)."""

    def __init__(self, backend="python", dynamic=False, unpack="progressive"):
        if unpack not in ("progressive", "upfront"):
            raise ValueError(f"unpack must be 'progressive' or 'upfront', got {unpack!r}")
        self.backend, self.dynamic, self.unpack = backend, dynamic, unpack
        self.compiler = resolve_backend(backend)

    def __enter__(self):
        stack = getattr(_options, "stack", None)
        if stack is None:
            stack = _options.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc):
        _options.stack.pop()
        return False


# ---------------------------------------------------------------- running


def _prepare(roots, input_edges, accumulate, record=True):
    task = engine.make_task(roots, keep_graph=True, create_graph=False,
                            input_edges=input_edges, accumulate=accumulate, native=not record)
    collected = tracer.collect(task, roots, record)
    return task, collected, collected.freeze()


def _compile(task, roots, collected, key, unpack, compiler, n_captures, dynamic):
    start = time.perf_counter()
    with ShapeEnv() as env:
        traced = tracer.trace(task, roots, collected, n_captures, frozenset(dynamic))
        graph = traced.graph
        passes.eliminate_dead_code(graph)
        passes.place_reads(graph, unpack)
    _stats["captures"] += 1
    fn = compiler(graph)
    _stats["compiles"] += 1
    _stats["compile_seconds"] += time.perf_counter() - start
    _log("graph", f"compiled autograd graph {_stats['captures']}:\n{graph}")
    return CompiledBackward(graph, fn, traced.constants, key, unpack,
                            packed_kinds(collected)), env.guards


def run(roots, retain_graph, input_edges=None, accumulate=True, options=None):
    """Run a backward through compiled autograd. Returns the captured gradients
    (arrays) at ``input_edges``."""
    options = options or current_options()
    task, collected, entry = lookup(roots, input_edges, accumulate, options)
    if not retain_graph:
        # The boxed lists become the only owners of the saved values: release them
        # (a prim node holds nothing else), and whatever other nodes hold.
        for sv in collected.saved:
            sv.release()
        for fn in collected.release_nodes:
            fn.release_variables()
    stack = getattr(engine._running, "stack", None)
    if stack is None:
        stack = engine._running.stack = []
    stack.append(task)
    try:
        inputs = [g for _, g in roots] + collected.inputs + list(entry.constants)
        collected.inputs.clear()    # the boxed list is their only owner: freed on last use
        # As eager: the backward (and the hooks it calls) runs without grad mode.
        # (The collected lists are the compiled function's own from here on.)
        with set_grad_enabled(False), \
                _memory.category("gradient") if _memory.active() else nullcontext():
            out = entry.fn(inputs, collected.sizes, collected.scalars,
                           collected.hooks, collected.packed_data)
    finally:
        stack.pop()
    return list(out) if out is not None else []


def lookup(roots, input_edges, accumulate, options):
    """(task, collected args, CompiledBackward): collect the key and the runtime
    values, look the key up, and on a miss trace and compile. This is all a cache
    hit costs before the compiled function runs."""
    task, collected, key = _prepare(roots, input_edges, accumulate, record=False)
    # The compiler's id is part of the key; its family holds the compiler itself,
    # so that id is never handed on to another callable while the entry exists.
    cache_key = (id(options.compiler), options.unpack, key)
    sizes, scalars = tuple(collected.sizes), collected.scalars
    family = _cache.get(cache_key)
    entry = family.lookup(sizes, scalars) if family is not None else None
    if entry is None:
        # The tracer needs to know where each value sits: collect again, recording.
        collected = tracer.collect(task, roots, record=True)
        entry = _compile_miss(cache_key, family, collected, task, roots, input_edges, options)
    else:
        _stats["cache_hits"] += 1
        family.last_sizes = sizes    # (a miss sets it itself)
    return task, collected, entry


def _compile_miss(cache_key, family, collected, task, roots, input_edges, options):
    """Trace and compile for these sizes. A size that differs from the last call of
    the same structure becomes dynamic (sizes 0 and 1 stay static, as in torch)."""
    sizes = tuple(collected.sizes)
    if family is None:
        if "verbose" in _log_flags():
            _ensure_handler()
            log.info(_miss_reason(cache_key[-1]))
        dynamic = {p for p, v in enumerate(sizes) if v not in (0, 1)} if options.dynamic else set()
        family = _Family(dynamic, [], compiler=options.compiler)
        with _cache_lock:
            _cache[cache_key] = family
    else:
        changed = {p for p, (a, b) in enumerate(zip(family.last_sizes, sizes))
                   if a != b and a not in (0, 1) and b not in (0, 1)}
        family.dynamic |= changed
        if "verbose" in _log_flags():
            names = ", ".join(f"s{p}" for p in sorted(changed)) or "none (a guard failed)"
            _ensure_handler()
            log.info(f"cache miss: sizes changed; dynamic now: {names}")
    entry, guards = _compile(task, roots, collected, cache_key, options.unpack, options.compiler,
                             len(input_edges or ()), family.dynamic)
    # Sizes 0 and 1 were traced as constants; symbolic ones stay >= 2 (as torch).
    dynamic = {p for p in family.dynamic if sizes[p] > 1}
    guards = list(guards) + [(("s", p), ">=", 2, True) for p in sorted(dynamic)]
    if collected.uncacheable_reason is None:
        family.entries.append((_static_check(sizes, dynamic), guards, entry))
    elif "verbose" in _log_flags():
        _ensure_handler()
        log.info(f"not cached: {collected.uncacheable_reason}")
    family.last_sizes = sizes
    return entry


def trace_backward(loss, inputs=None, grad_outputs=None, unpack="progressive"):
    """Trace the backward of ``loss`` into a graph; runs nothing and frees nothing."""
    from compiled_autograd.autograd.tensor import Tensor
    outputs = [loss] if isinstance(loss, Tensor) else list(loss)
    grads = None if grad_outputs is None else (
        [grad_outputs] if isinstance(grad_outputs, Tensor) else list(grad_outputs))
    roots = engine._make_root_grads(outputs, grads, create_graph=False)
    input_edges = None
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        input_edges = engine._edges_of(inputs, "inputs")
    task, collected, key = _prepare(roots, input_edges, accumulate=inputs is None)
    with ShapeEnv():
        traced = tracer.trace(task, roots, collected, len(input_edges or ()))
        passes.eliminate_dead_code(traced.graph)
        passes.place_reads(traced.graph, unpack)
    return CompiledBackward(traced.graph, None, traced.constants, key, unpack,
                            packed_kinds(collected))


def packed_kinds(collected):
    """What each packed datum is: ("checkpoint", segment, alias), ("offload", None)
    or ("hook", None) -- for planning what an unpack allocates."""
    from compiled_autograd.autograd.graph import _OffloadedTensor
    from compiled_autograd.autograd.checkpoint import _Holder
    hook_of = {}
    for sv in collected.saved:
        where = collected.slot.get(id(sv))
        if where and where[0] == "hooked":
            hook_of[where[2]] = collected.hooks[where[1]]
    segments, kinds = {}, []
    for j, packed in enumerate(collected.packed_data):
        if isinstance(packed, _Holder):
            kinds.append(("checkpoint", segments.setdefault(id(hook_of.get(j)), len(segments)),
                          packed.alias))
        elif isinstance(packed, _OffloadedTensor):
            kinds.append(("offload", None))
        else:
            kinds.append(("hook", None))
    return kinds
