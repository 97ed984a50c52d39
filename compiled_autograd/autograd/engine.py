"""The eager autograd engine (torch's engine.cpp; one backward runs on one thread, but a
deeply nested reentrant backward moves to a fresh thread, see reentrant.py).

1. Roots: each output's gradient edge and its initial gradient (checked up front).
2. Dependencies: the number of edges into each node reachable from the roots.
3. exec_info (only for ``autograd.grad`` and ``backward(inputs=...)``): which nodes
   must run to reach the requested inputs; the inputs' gradients are *captured*.
4. Before anything runs, every node that will run checks its saved variables (freed,
   or modified in place): the listed errors leave the graph and ``.grad`` untouched.
5. A ready queue ordered like torch's: AccumulateGrad first, then the most recently
   created node. Input buffers sum the gradients arriving at a node. Saved values are
   released right after their node runs unless ``retain_graph``.

Gradients flow as ndarrays; under ``create_graph`` they are Tensors, so the same
derivative formulas record a differentiable graph.

The engine sits below Tensor: it makes the Tensors user hooks see with the roots'
``_make``, and it does not know compiled autograd. Entering ``ca.compiled_backward``
hands it a compiler for the duration (``push_compiler``/``pop_compiler`` on this
thread, as torch's ``set_autograd_compiler``); ``backward`` and ``grad`` then call
``compiler.run``.
"""
from __future__ import annotations

import contextvars
import heapq
import itertools
import threading
from contextlib import nullcontext

import numpy as np

from compiled_autograd.autograd import hooks as _hooks
from compiled_autograd.autograd import reentrant as _reentrant
from compiled_autograd.autograd import grad_mode as _grad_mode
from compiled_autograd.autograd.node import accumulate_into, gradient_edge
from compiled_autograd.autograd.tensor_base import TensorBase
from compiled_autograd.runtime import memory as _rt_memory
from compiled_autograd.runtime import pool as _pool
from compiled_autograd.runtime.prims import broadcast_shapes, ops, sum_to


def _shape_str(shape):
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _torch_size(shape):
    """A shape as torch's Python messages print it: torch.Size([2, 2])."""
    return f"torch.Size({_shape_str(shape)})"


def make_root_grads(tensors, grad_tensors, create_graph):
    """[((node, input_nr), initial gradient)] of a backward from ``tensors``, checked."""
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    if len(grad_tensors) != len(tensors):
        raise RuntimeError(f"grad_tensors has {len(grad_tensors)} elements but there are "
                           f"{len(tensors)} tensors")
    roots = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        if not isinstance(t, TensorBase):
            raise TypeError(f"element {i} of tensors is not a Tensor")
        edge = gradient_edge(t)
        if edge[0] is None:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not "
                               "have a grad_fn")
        if g is None:
            if t.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            g = np.empty(t.shape, dtype=t.dtype)
            g.fill(1)                  # (np.ones, in a third of the time)
            _rt_memory.on_array(g, "grad_root", "gradient")
            g = t._make(g) if create_graph else g
        else:
            if not isinstance(g, TensorBase):     # (torch's _make_grads)
                raise TypeError(f"gradients can be either Tensors or None, but got "
                                f"{type(g).__name__}")
            if tuple(g.shape) != tuple(t.shape):
                raise RuntimeError(
                    f"Mismatch in shape: grad_output[{i}] has a shape of "
                    f"{_torch_size(g.shape)} and output[{i}] has a shape of "
                    f"{_torch_size(t.shape)}.")
            if (g.dtype.kind == "c") != (t.dtype.kind == "c"):
                raise RuntimeError(f"For complex Tensors, both grad_output and output are "
                                   f"required to have the same dtype. Mismatch in dtype: "
                                   f"grad_output[{i}] has a dtype of {g.dtype} and output[{i}] "
                                   f"has a dtype of {t.dtype}.")
            if g.dtype != t.dtype:
                # As torch's validate_outputs: another real dtype (int64, bool, float64
                # for a float32 output) is cast to the output's.
                g = g.to(t.dtype) if create_graph else t._make(g._data.astype(t.dtype))
            g = g if create_graph else g._data
        roots.append((edge, g))
    return roots


_task_ids = itertools.count()
# The graph tasks running on this thread, innermost last (a ContextVar: restored
# by grad_mode.isolated, see run_task)
_running = contextvars.ContextVar("compiled_autograd.running_tasks", default=())


def run_task(task, grad_enabled, fn, *args):
    """``fn(*args)`` with ``task`` the backward running on this thread (nests), in
    that grad mode (as torch: a backward records history only under
    create_graph). Both are restored when ``fn`` returns or raises, whatever
    exception arrives, wherever (``grad_mode.isolated``: in C, with no Python
    code a KeyboardInterrupt could land in)."""
    return _grad_mode.isolated(_enter_task, task, grad_enabled, fn, args)


def _enter_task(task, grad_enabled, fn, args):
    _running.set(_running.get() + (task,))
    _grad_mode._set(grad_enabled)
    return fn(*args)


def current_graph_task():
    """The backward running on this thread (innermost), or None."""
    stack = _running.get()
    return stack[-1] if stack else None


def current_graph_task_id() -> int:
    """An id unique to the running backward; -1 outside a backward (torch's)."""
    task = current_graph_task()
    return -1 if task is None else task.id


class GraphTask:
    """One backward run: dependencies, exec_info, captures, buffers."""

    def __init__(self, roots, keep_graph, create_graph, make=None):
        self.id = next(_task_ids)
        self.keep_graph = keep_graph
        self.create_graph = create_graph
        # Tensor._make, for the Tensors user hooks see (taken from the roots' tensors)
        self.make = make
        self._dependencies = None
        self.exec_info = None    # node -> needed (only when inputs are given)
        self.captures = {}       # (node, input_nr) -> capture index
        self._root_fns = [fn for (fn, _), _ in roots]
        # nodes: every reachable node, discovery order; index: node -> its rank in
        # discovery (first sight) order, its keys in rank order.
        self._discover()

    def _discover(self):
        """Every node reachable from the roots (depth first) and each node's rank
        (the order of first sight)."""
        nodes, index, stack = [], {}, []
        self.nodes, self.index = nodes, index
        for fn in self._root_fns:
            if fn not in index:
                index[fn] = len(index)
                stack.append(fn)
        while stack:
            fn = stack.pop()
            nodes.append(fn)
            for nxt, _ in fn.next_functions:
                if nxt not in index and nxt is not None:
                    index[nxt] = len(index)
                    stack.append(nxt)

    @property
    def dependencies(self) -> dict:
        """node -> the number of edges into it (only the walks need it)."""
        if self._dependencies is None:
            index = self.index
            counts = [0] * len(index)
            for fn in self.nodes:
                for nxt, _ in fn.next_functions:
                    if nxt is not None:
                        counts[index[nxt]] += 1
            self._dependencies = {fn: n for fn, n in zip(index, counts) if n}
        return self._dependencies

    def restrict_to(self, input_edges, execute_inputs):
        """Mark the nodes needed to reach ``input_edges``; capture at those edges.
        ``execute_inputs`` (``backward(inputs=...)``): the inputs' own nodes run too
        -- a leaf's AccumulateGrad, a non-leaf's grad_fn with its hooks -- as
        torch's init_to_execute sets ``needed_`` for every output edge's node."""
        targets = {}
        for i, (fn, nr) in enumerate(input_edges):
            self.captures.setdefault((fn, nr), []).append(i)
            targets[fn] = targets.get(fn, False) or execute_inputs
        # Post-order DFS: a node is needed if it is a target to execute or any
        # child leads to a target (a child's answer is known before its parent's).
        needed, expanded = {}, set()
        stack = [(fn, False) for fn in self.nodes]
        while stack:
            fn, children_done = stack.pop()
            if children_done:
                needed[fn] = targets.get(fn, False) or any(
                    nxt is not None and (needed[nxt] or nxt in targets)
                    for nxt, _ in fn.next_functions)
            elif fn not in expanded:
                expanded.add(fn)
                stack.append((fn, True))
                stack.extend((nxt, False) for nxt, _ in fn.next_functions
                             if nxt is not None and nxt not in expanded)
        self.exec_info = needed
        self._targets = targets

    def should_flow(self, fn) -> bool:
        """Does a gradient sent to ``fn`` matter (it runs or is captured)?"""
        info = self.exec_info
        return info is None or info.get(fn, False) or fn in self._targets

    def needs_of(self, fn):
        if self.exec_info is None:
            return fn.static_needs()
        return tuple(nxt is not None and self.should_flow(nxt) for nxt, _ in fn.next_functions)

    def will_run(self, fn) -> bool:
        return self.exec_info is None or self.exec_info.get(fn, False)


def expected_shapes(fn):
    """The shape each of ``fn``'s gradients must have: its next nodes' input
    metadata (None for an edge to nothing)."""
    return [None if nxt is None else nxt.input_metadata[nr][0] for nxt, nr in fn.next_functions]


def validate(fn, grads, shapes=None):
    """Reduce/complain about gradients whose shape or dtype does not match
    (torch's validate_outputs), for gradients coming from user code. ``shapes``:
    the tracer's expected shapes (symbolic where sizes are dynamic); by default
    ``expected_shapes(fn)``."""
    out = list(grads)
    for i, ((nxt, nr), g) in enumerate(zip(fn.next_functions, grads)):
        if nxt is None or g is None:
            continue
        shape, dtype = nxt.input_metadata[nr]
        if shapes is not None:
            shape = shapes[i]
        if g.shape != shape and tuple(g.shape) != tuple(shape):
            try:  # the project's broadcast rule: keeps symbolic sizes (tracing)
                ok = len(g.shape) >= len(shape) and broadcast_shapes(
                    tuple(shape), tuple(g.shape)) == tuple(g.shape)
            except ValueError:
                ok = False
            if not ok:
                raise RuntimeError(
                    f"Function {fn.name()} returned an invalid gradient at index {i} - got "
                    f"{_shape_str(g.shape)} but expected shape compatible with {_shape_str(shape)}")
            g = sum_to(g, tuple(shape))
        if g.dtype != dtype:
            g = ops.astype(g, dtype=dtype)
        out[i] = g
    return out


def _call_function(task, fn, grads):
    """Hooks around ``fn.apply`` in torch's order; returns the output gradients."""
    if _hooks.has_hooks(fn):
        grads = _hooks.run_pre_hooks(fn, grads, task.create_graph, task.make)
    if fn.accumulates_grad:
        if grads[0] is not None:
            accumulate_into(fn.variable, grads[0])
            _hooks.run_post_accumulate_grad_hooks(fn.variable)
        if fn.__dict__.get("_post_hooks"):
            _hooks.run_post_hooks(fn, (), grads, task.create_graph, task.make)
        return ()
    if all(g is None for g in grads):
        return (None,) * len(fn.next_functions)
    outputs = fn.apply(grads, task.needs_of(fn))
    if len(outputs) != len(fn.next_functions):
        raise RuntimeError(f"function {fn.name()} returned an incorrect number of gradients "
                           f"(expected {len(fn.next_functions)}, got {len(outputs)})")
    if needs_validation(fn):     # (before the post hooks see them, as torch)
        outputs = validate(fn, outputs)
    if fn.__dict__.get("_post_hooks"):
        outputs = _hooks.run_post_hooks(fn, outputs, grads, task.create_graph, task.make)
    return outputs


def make_task(roots, keep_graph, create_graph, input_edges=None, accumulate=True,
              make=None):
    """The GraphTask of a backward from ``roots``, restricted to ``input_edges``."""
    task = GraphTask(roots, keep_graph, create_graph, make)
    if input_edges is not None:
        task.restrict_to(input_edges, execute_inputs=accumulate)
    return task


def walk(task, roots, visit, add=None):
    """Visit the nodes in torch's order: AccumulateGrad first (all share the top
    sequence number, so they go in push order), then the most recently created.

    ``visit(fn, grads) -> outputs`` gets each node's summed input gradients once
    its last dependency arrived; its outputs flow to ``fn.next_functions``. Shared
    by the eager engine, the tracer's key collection and the tracer itself, so the
    three see one order. ``add`` sums two gradients arriving at one input."""
    add = add or ops.add
    deps = dict(task.dependencies)
    buffers = {}
    for (fn, nr), g in roots:
        buf = buffers.setdefault(fn, [None] * len(fn.input_metadata))
        buf[nr] = g if buf[nr] is None else add(buf[nr], g)
    ready, pushes = [], itertools.count()

    def push(fn):
        newest_first = -fn._sequence_nr if fn._priority else 0
        heapq.heappush(ready, (fn._priority, newest_first, next(pushes), fn))

    for fn in buffers:
        if deps.get(fn, 0) == 0:
            push(fn)
    while ready:
        fn = heapq.heappop(ready)[-1]
        outputs = visit(fn, buffers.pop(fn))
        for (nxt, nr), g in zip(fn.next_functions, outputs):
            if nxt is None:
                continue
            remaining = deps[nxt] - 1
            deps[nxt] = remaining
            if task.exec_info is not None and not task.should_flow(nxt):
                continue
            buf = buffers.get(nxt)
            if buf is None:
                buf = buffers[nxt] = [None] * len(nxt.input_metadata)
            if g is not None:
                buf[nr] = g if buf[nr] is None else add(buf[nr], g)
            if remaining == 0:
                push(nxt)


def capture(task, fn, grads, captured, run_tensor_hooks):
    """Record the gradients arriving at captured edges (autograd.grad). As torch:
    tensor hooks apply to a captured gradient; a node that runs calls them itself
    (once), after the capture."""
    if not task.will_run(fn) and _hooks.has_tensor_pre_hooks(fn):
        grads = run_tensor_hooks(fn, grads)
    for nr, g in enumerate(grads):
        for idx in task.captures.get((fn, nr), ()):
            captured[idx] = g
    return grads


def execute(roots, keep_graph, create_graph, input_edges=None, accumulate=True, make=None):
    """Run a backward from ``roots`` [((node, input_nr), grad)]. With
    ``input_edges``, returns the captured gradients at those edges. ``make``:
    Tensor._make, for what user hooks see."""
    return _reentrant_aware(lambda: execute_here(roots, keep_graph, create_graph, input_edges,
                                                 accumulate, make))


def _reentrant_aware(run):
    """``run()``: one backward, eager or compiled. A reentrant backward (called
    while one runs on this thread) counts towards this thread's depth; past a
    limit it runs on a fresh thread (reentrant.py, torch's max_recursion_depth),
    which continues this thread's running graph tasks and compiler stack.
    The arrays a backward makes (its nodes', hooks' and compiled code's) come from
    compiled autograd's caching allocator (runtime/pool.c), as the C forward's
    large results do, so that the memory a step frees is kept for the next."""
    if current_graph_task() is None:
        previous = _pool.enter()
        try:
            return run()
        finally:
            _pool.leave(previous)
    if _reentrant.hop_needed():
        tasks = _running.get()
        compilers = list(getattr(_compilers, "stack", None) or ())

        def install():
            _running.set(tasks)
            _compilers.stack = list(compilers)

        return _reentrant.on_fresh_thread(lambda: _reentrant_aware(run), install)
    return _reentrant.nested(run)


def execute_here(roots, keep_graph, create_graph, input_edges, accumulate, make):
    """``execute`` on this thread, for a caller that counted this backward's
    reentrant depth itself (a compiled backward that runs eagerly)."""
    task = make_task(roots, keep_graph, create_graph, input_edges, accumulate, make=make)
    # Validate before anything runs: the errors below change nothing.
    for fn in task.nodes:
        if task.will_run(fn):
            fn.check_saved()
    captured = [None] * (len(input_edges) if input_edges is not None else 0)
    accounting = _rt_memory.active()

    def visit(fn, grads):
        if task.captures:
            grads = capture(task, fn, grads, captured, lambda f, gs: _hooks.run_tensor_pre_hooks(
                f, gs, create_graph, make))
        if not task.will_run(fn):
            return (None,) * len(fn.next_functions)
        if accounting:
            with _rt_memory.source(fn.name()):
                outputs = _call_function(task, fn, grads)
        else:
            outputs = _call_function(task, fn, grads)
        if not keep_graph:
            fn.release_variables()
        return outputs

    def run():
        with _rt_memory.category("gradient") if accounting else nullcontext():
            walk(task, roots, visit)
    run_task(task, create_graph, run)
    return captured


def needs_validation(fn) -> bool:
    """Built-in derivative formulas produce exact shapes; user code may not."""
    return fn.user_code or bool(fn.__dict__.get("_post_hooks"))


_compilers = threading.local()


def push_compiler(compiler) -> None:
    """From now on, on this thread, ``backward`` and ``grad`` run through
    ``compiler.run(roots, retain_graph, input_edges, accumulate, create_graph)``
    (compiled autograd) instead of ``execute``, until ``pop_compiler``; pushes nest, the
    innermost wins (torch's set_autograd_compiler)."""
    stack = getattr(_compilers, "stack", None)
    if stack is None:
        stack = _compilers.stack = []
    stack.append(compiler)


def pop_compiler():
    """Undo this thread's last ``push_compiler``; returns its compiler."""
    return _compilers.stack.pop()


def current_compiler():
    """This thread's innermost pushed compiler, or None for eager autograd."""
    stack = getattr(_compilers, "stack", None)
    return stack[-1] if stack else None


def edges_of(inputs, what):
    """The gradient edges of ``inputs`` (Tensors that require grad)."""
    edges = []
    for t in inputs:
        if not isinstance(t, TensorBase):
            raise TypeError(f"{what} must be Tensors")
        edge = gradient_edge(t)
        if edge[0] is None:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
        edges.append(edge)
    return edges


def _as_list(x):
    if x is None:
        return None
    return [x] if isinstance(x, TensorBase) else list(x)


def _make_of(tensors):
    """The Tensor maker hooks' values are made with (no tensors: no hook runs)."""
    return tensors[0]._make if tensors else None


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
             inputs=None):
    """Accumulate gradients of ``tensors`` into the leaves' ``.grad`` (or only into
    ``inputs``' when given)."""
    tensors = _as_list(tensors)
    grad_tensors = _as_list(grad_tensors)
    if retain_graph is None:
        retain_graph = create_graph
    compiler = current_compiler()
    roots = make_root_grads(tensors, grad_tensors, create_graph)
    if inputs is None:
        if compiler is not None:
            _reentrant_aware(lambda: compiler.run(roots, retain_graph,
                                                  create_graph=create_graph))
        else:
            execute(roots, retain_graph, create_graph, make=_make_of(tensors))
        return
    make = _make_of(tensors)
    inputs = _as_list(inputs)
    if not inputs:
        raise RuntimeError("'inputs' argument to backward() cannot be empty.")
    edges = edges_of(inputs, "inputs")
    # As torch: a non-leaf input retains its gradient (after its tensor hooks).
    for t in inputs:
        if not t.is_leaf and not t.retains_grad:
            t.retain_grad()
    if compiler is not None:
        _reentrant_aware(lambda: compiler.run(roots, retain_graph, edges, accumulate=True,
                                              create_graph=create_graph))
    else:
        execute(roots, retain_graph, create_graph, edges, accumulate=True, make=make)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False):
    """Gradients of ``outputs`` w.r.t. ``inputs``; ``.grad`` is left untouched."""
    outputs = _as_list(outputs)
    inputs = _as_list(inputs)
    if not inputs:
        raise RuntimeError("`inputs` argument to `grad()` cannot be empty.")
    grad_outputs = _as_list(grad_outputs)
    if retain_graph is None:
        retain_graph = create_graph
    compiler = current_compiler()
    roots = make_root_grads(outputs, grad_outputs, create_graph)
    edges = edges_of(inputs, "inputs")
    if compiler is not None:
        captured = _reentrant_aware(lambda: compiler.run(roots, retain_graph, edges,
                                                         accumulate=False,
                                                         create_graph=create_graph))
    else:
        captured = execute(roots, retain_graph, create_graph, edges, accumulate=False,
                           make=_make_of(outputs))
    result = []
    for t, g in zip(inputs, captured):
        if g is None:
            if not allow_unused:
                raise RuntimeError("One of the differentiated Tensors appears to not have "
                                   "been used in the graph. Set allow_unused=True if this is "
                                   "the desired behavior.")
            result.append(None)
        else:
            if not isinstance(g, TensorBase):
                g = np.array(g, copy=True)
                _rt_memory.on_array(g, "autograd.grad")
                g = t._make(g)
            result.append(g)
    return tuple(result)

