"""Compiled autograd's entry points: ``compiled_backward``, ``trace_backward``, and
the run of one compiled backward.

``with ca.compiled_backward(backend="eager"):`` routes ``.backward()`` and
``ca.autograd.grad`` through ``run``: collect the compiled args of the autograd
graph (the key and the runtime values), look the key up, trace and compile on a
miss, then call the compiled graph with the boxed lists. ``ca.trace_backward`` traces
without running anything.

Entering ``compiled_backward`` hands the engine this module's compiler for the
duration (``engine.push_compiler``): the engine never imports compiled autograd.
Backends are resolved in ``backends``; the cache, its stats and logs are ``cache``.
"""
from __future__ import annotations

import time
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field

from compiled_autograd.autograd import engine
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.compiled import cache, collection, hook_calls, tracer
from compiled_autograd.compiled.backends import resolve_backend
from compiled_autograd.compiled.graph_module import GraphModule
from compiled_autograd.compiled.cache import (Family, ensure_handler, families, lock, log,
                                              log_event, log_flags, miss_reason, static_check,
                                              stats)
from compiled_autograd.ir import passes
from compiled_autograd.ir.symbolic import ShapeEnv
from compiled_autograd.memory.schedule import memory_schedule
from compiled_autograd.runtime import memory as _memory


@dataclass
class CompiledBackward:
    """A traced backward: its graph and the compiled callable."""
    graph: object
    fn: object
    constants: list
    key: tuple
    unpack: str
    packed_kinds: list = None
    # node rank -> which gradients its call_backward node gives the graph
    backward_calls: dict = None
    # per call into Python, the saved values read after it (passes.saved_reads_after_callbacks)
    version_checks: tuple = ()
    # the cache's Family of its structure, a weak reference (set on a miss; the
    # Family holds its entries: no cycle, so that dropping the cache frees them)
    family: object = field(default=lambda: None, repr=False, compare=False)

    def memory_schedule(self):
        """The planned schedule: live bytes after every node, the peak, what is
        live at the peak, each unpacked value's unpack and free step."""
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
        if plan is None:
            plan = resolve_backend("c")(self.graph, build=False).memory_plan
        return plan

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


# ---------------------------------------------------------------- the context manager


class compiled_backward:
    """Context manager: ``.backward()`` and ``autograd.grad`` inside run through
    compiled autograd with ``backend``: "eager" | a registered name (its compiler
    gets the Graph) | a callable ``compiler_fn(gm)`` (it gets a GraphModule)."""

    def __init__(self, backend="python", dynamic=False, unpack="progressive"):
        if unpack not in ("progressive", "upfront"):
            raise ValueError(f"unpack must be 'progressive' or 'upfront', got {unpack!r}")
        self.backend, self.dynamic, self.unpack = backend, dynamic, unpack
        self.compiler = resolve_backend(backend)
        self.takes_module = callable(backend)    # a user's compiler_fn(gm)

    def __enter__(self):
        engine.push_compiler(self)    # this thread's engine runs backwards through run
        return self

    def __exit__(self, *exc):
        engine.pop_compiler()
        return False

    def run(self, roots, retain_graph, input_edges=None, accumulate=True, create_graph=False):
        """The engine's call: run this backward compiled (see ``run``). A backward
        with ``create_graph=True`` runs on the eager engine: the compiled code
        computes on arrays and records no graph of its own gradients, which a
        double backward needs."""
        if create_graph:
            if "verbose" in log_flags():
                ensure_handler()
                log.info("create_graph=True: this backward runs on the eager engine (a "
                         "compiled backward records no graph of the gradients it computes)")
            return engine.execute_here(roots, retain_graph, True, input_edges, accumulate,
                                       make=Tensor._make)
        return run(roots, retain_graph, input_edges, accumulate, self)


def backward_on(loss, backend) -> None:
    """``loss.backward()`` on ``backend``: None is the eager engine, anything else a
    compiled backward with it (``compiled_backward(backend=backend)``)."""
    if backend is None:
        loss.backward()
        return
    with compiled_backward(backend=backend):
        loss.backward()


# ---------------------------------------------------------------- running


def _prepare(roots, input_edges, accumulate, record=True):
    task = engine.make_task(roots, keep_graph=True, create_graph=False,
                            input_edges=input_edges, accumulate=accumulate)
    collected = collection.collect(task, roots, record)
    return task, collected, collected.freeze()


def _compile(task, roots, collected, key, context, n_captures, dynamic, none_masks):
    start = time.perf_counter()
    with ShapeEnv() as env:
        traced = tracer.trace(task, roots, collected, n_captures, frozenset(dynamic),
                              none_masks)
        graph = traced.graph
        passes.eliminate_dead_code(graph)
        passes.place_reads(graph, context.unpack)
    traced.release()   # its proxies refer back to it: no cycle left holding values
    stats["captures"] += 1
    fn = context.compiler(GraphModule(graph) if context.takes_module else graph)
    stats["compiles"] += 1
    stats["compile_seconds"] += time.perf_counter() - start
    log_event("graph", f"compiled autograd graph {stats['captures']}:\n{graph}")
    return CompiledBackward(graph, fn, traced.constants, key, context.unpack,
                            packed_kinds(collected), traced.backward_calls,
                            passes.saved_reads_after_callbacks(graph)), env.guards


def run(roots, retain_graph, input_edges, accumulate, context):
    """Run a backward through compiled autograd as ``context`` (the
    compiled_backward in force) says. Returns the captured gradients (arrays) at ``input_edges``."""
    task, collected, entry = lookup(roots, input_edges, accumulate, context)
    if entry is None:         # past the recompile limit (cache.recompile_limit): eager
        collected.clear()     # the eager engine's nodes own the saved values
        return list(engine.execute_here(roots, retain_graph, False, input_edges, accumulate,
                                        make=Tensor._make))
    calls_python = bool(entry.backward_calls)      # (a graph with call_backward nodes)
    family = entry.family() if calls_python else None
    if family is not None and not family.nones_seen:
        # Custom backwards run as Python: which gradients they return as None is
        # known once they ran. The structure's first backward runs eagerly, and
        # its graph is traced again if they returned otherwise than it assumed.
        # (Until one such run succeeded, every backward of it runs so: eager is
        # always right.)
        collected.clear()      # the eager engine's nodes own the saved values
        out = _run_eagerly(task, roots, retain_graph, input_edges, accumulate, entry)
        family.nones_seen = True
        return out
    checks = entry.version_checks
    # The boxed list becomes the only owner of the saved values: release them
    # (most nodes hold nothing else: Node.holds_only_collected), and whatever
    # other nodes hold.
    release = not retain_graph
    values = collected.runtime_inputs(release)
    if release:
        for sv in collected.saved:      # (the plain ones are released already)
            if not sv.released:
                sv.release()
        collected.recipe_objects.clear()  # (their kept arrays now live in the inputs only)
        for fn in collected.release_nodes:
            fn.release_variables()
    inputs = [g for _, g in roots] + values + list(entry.constants)
    collected.inputs.clear()    # the boxed list is their only owner: freed on last use
    del values
    # As eager: the backward (and the hooks it calls) runs without grad mode.
    # (The collected lists are the compiled function's own from here on.)
    try:
        with hook_calls.checking_versions(checks, collected.plain, collected.kept_versions) \
                if checks or hook_calls.checking() else nullcontext():
            if not calls_python and not _memory.active():
                out = engine.run_task(task, False, entry.fn, inputs, collected.sizes,
                                      collected.scalars, collected.hooks, collected.packed_data)
            else:
                out = engine.run_task(task, False, _call_learning, task, entry, calls_python,
                                      inputs, collected)
    finally:
        # (also after a failure: its stores may have run)
        for effect in collected.after_run:
            effect()
    return list(out) if out is not None else []


def _call_learning(task, entry, calls_python, inputs, collected):
    """The compiled function's call, noting which gradients custom backwards
    return as None, and accounting memory while a profile records."""
    with hook_calls.learning() if calls_python else nullcontext() as returned_nones, \
            _memory.category("gradient") if _memory.active() else nullcontext():
        try:
            return entry.fn(inputs, collected.sizes, collected.scalars, collected.hooks,
                            collected.packed_data)
        finally:
            if returned_nones:
                _relearn(entry.key, task, returned_nones)


def _run_eagerly(task, roots, retain_graph, input_edges, accumulate, entry):
    """This backward on the eager engine, noting which gradients its custom
    backwards returned as None (``FunctionBackward.apply``)."""
    for fn in task.index:
        fn.__dict__.pop("_returned_none", None)     # (from an earlier backward)
    # (engine.backward counted this backward's reentrant depth already)
    captured = engine.execute_here(roots, retain_graph, False, input_edges, accumulate,
                                   make=Tensor._make)
    returned = []
    for fn, rank in task.index.items():
        takes = entry.backward_calls.get(rank)
        none = fn.__dict__.get("_returned_none")
        if takes is not None and none is not None and none != tuple(not t for t in takes):
            returned.append((fn, none))
    if returned:
        _relearn(entry.key, task, returned)
    return list(captured)


def _relearn(cache_key, task, returned_nones):
    """Custom backwards returned Nones unlike their graph: note which, and drop
    the structure's graphs, so that the next backward is traced with them."""
    family = families.get(cache_key)
    if family is None:
        return
    with lock:
        for ctx, none in returned_nones:
            family.none_masks[task.index[ctx]] = none
        family.entries.clear()


def lookup(roots, input_edges, accumulate, context):
    """(task, collected args, CompiledBackward): collect the key and the runtime
    values by walking the graph, look the key up, and on a miss trace and compile.
    This is all a cache hit costs before the compiled function runs. The
    CompiledBackward is None for a structure past ``cache.recompile_limit`` graphs:
    it runs eagerly."""
    task, collected, key = _prepare(roots, input_edges, accumulate, record=False)
    # The compiler's id is part of the key; its family holds the compiler itself,
    # so that id is never handed on to another callable while the entry exists.
    cache_key = (id(context.compiler), context.unpack, key)
    sizes, scalars = collected.sizes, collected.scalars     # (a list: static_check's)
    family = families.get(cache_key)
    entry = family.lookup(sizes, scalars) if family is not None else None
    if entry is None:
        if family is not None and len(family.entries) >= cache.recompile_limit:
            family.over_limit(sizes)     # warns once: this backward runs eagerly
            return task, collected, None
        # The tracer needs to know where each value sits: collect again, recording.
        collected = collection.collect(task, roots, record=True)
        entry = _compile_miss(cache_key, family, collected, task, roots, input_edges, context)
    else:
        stats["cache_hits"] += 1
        family.last_sizes = sizes    # (a miss sets it itself)
    return task, collected, entry


def _compile_miss(cache_key, family, collected, task, roots, input_edges, context):
    """Trace and compile for these sizes. A size that differs from the last call of
    the same structure becomes dynamic (sizes 0 and 1 stay static, as in torch)."""
    sizes = tuple(collected.sizes)
    if family is None:
        if "verbose" in log_flags():
            ensure_handler()
            log.info(miss_reason(cache_key[-1]))
        dynamic = {p for p, v in enumerate(sizes) if v not in (0, 1)} if context.dynamic else set()
        family = Family(dynamic, [], compiler=context.compiler)
        with lock:
            families[cache_key] = family
    else:
        changed = {p for p, (a, b) in enumerate(zip(family.last_sizes, sizes))
                   if a != b and a not in (0, 1) and b not in (0, 1)}
        family.dynamic |= changed
        if "verbose" in log_flags():
            names = ", ".join(f"s{p}" for p in sorted(changed)) or "none (a guard failed)"
            ensure_handler()
            log.info(f"cache miss: sizes changed; dynamic now: {names}")
    entry, guards = _compile(task, roots, collected, cache_key, context,
                             len(input_edges or ()), family.dynamic, family.none_masks)
    entry.family = weakref.ref(family)
    # Sizes 0 and 1 were traced as constants; symbolic ones stay >= 2 (as torch).
    dynamic = {p for p in family.dynamic if sizes[p] > 1}
    # (each guard once: a traced update records the same ones for every parameter)
    guards = list(dict.fromkeys(guards)) + [(("s", p), ">=", 2, True) for p in sorted(dynamic)]
    if collected.uncacheable_reason is None:
        family.entries.append((static_check(sizes, dynamic), guards, entry))
    elif "verbose" in log_flags():
        ensure_handler()
        log.info(f"not cached: {collected.uncacheable_reason}")
    family.last_sizes = sizes
    return entry


def trace_backward(loss, inputs=None, grad_outputs=None, unpack="progressive"):
    """Trace the backward of ``loss`` into a graph; runs nothing and frees nothing."""
    return trace_with_values(loss, inputs, grad_outputs, unpack)[0]


def trace_with_values(loss, inputs=None, grad_outputs=None, unpack="progressive"):
    """``trace_backward``, and what a compiled run would take: (traced, inputs,
    collected), ``inputs`` the boxed list whole (the roots' gradients first, the
    constants last), ``collected`` the CompiledNodeArgs (packed data, saved
    variables, nodes holding values)."""
    outputs = [loss] if isinstance(loss, Tensor) else list(loss)
    grads = None if grad_outputs is None else (
        [grad_outputs] if isinstance(grad_outputs, Tensor) else list(grad_outputs))
    roots = engine.make_root_grads(outputs, grads, create_graph=False)
    input_edges = None
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        input_edges = engine.edges_of(inputs, "inputs")
    task, collected, key = _prepare(roots, input_edges, accumulate=inputs is None)
    with ShapeEnv():
        traced = tracer.trace(task, roots, collected, len(input_edges or ()))
        passes.eliminate_dead_code(traced.graph)
        passes.place_reads(traced.graph, unpack)
    traced.release()
    return (CompiledBackward(traced.graph, None, traced.constants, key, unpack,
                             packed_kinds(collected)),
            [g for _, g in roots] + collected.runtime_inputs(False) + list(traced.constants),
            collected)


def packed_kinds(collected):
    """What each packed datum is: ("checkpoint", segment, alias), ("offload", None)
    or ("hook", None) -- for planning what an unpack allocates. Each saved value
    says what its packed data is (``packed_kind``); a checkpoint's holder says
    whether recomputing it allocates (``alias``)."""
    kinds = [None] * len(collected.packed_data)
    segments = {}
    for sv in collected.saved:
        where = collected.slot.get(id(sv))
        if not where or where[0] != "hooked":
            continue
        _, hook_i, j = where
        if sv.packed_kind == "checkpoint":
            segment = segments.setdefault(id(collected.hooks[hook_i]), len(segments))
            kinds[j] = ("checkpoint", segment, collected.packed_data[j].alias)
        else:
            kinds[j] = (sv.packed_kind, None)
    return kinds
