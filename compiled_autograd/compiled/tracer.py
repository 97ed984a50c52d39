"""The tracer: records a whole backward as one graph.

1. ``collect``: walk the autograd graph in the eager engine's order (``engine.walk``)
   and let every node write its ``compiled_args``, plus its hooks and edges, into a
   ``CompiledNodeArgs``: the cache key and the runtime values.
2. ``trace`` (on a cache miss): walk again, now with ``Proxy`` gradients: each node's
   ``apply_with_saved`` runs its ordinary derivative formula, whose prim calls land
   in the graph; saved values come from ``getitem(inputs, i)`` or, under
   saved-tensor hooks, from a ``call_hook(unpack_hook)`` node; hooks and gradient
   accumulation become ``call_hook`` nodes, in the order eager runs them.
"""
from __future__ import annotations

import contextlib

import numpy as np

from compiled_autograd.autograd import engine
from compiled_autograd.autograd import hooks as _hooks
from compiled_autograd.compiled import native_walk
from compiled_autograd.compiled.compiled_args import (_INDEX_PARAMS, _NO_PARAMS, _PARAM_SPLITS,
                                             CompiledNodeArgs, SwapSavedVariables,
                                             _params_split)
from compiled_autograd.ir import graph as ir
from compiled_autograd.ir.graph import BOXED, Graph
from compiled_autograd.autograd.node import (NODE_CLASSES, AccumulateGrad, PrimBackward,
                                             SavedVariable)
from compiled_autograd.ir.symbolic import SymFloat, SymInt, hint
from compiled_autograd.autograd.tensor import Tensor


class Proxy(Tensor):
    """A Tensor standing for a graph value while tracing. Prims called on it record
    graph nodes; reading its values is an error (there are none yet)."""

    __slots__ = ("node", "tracer")
    __prim_priority__ = 2

    def __init__(self, tracer, node):
        self.node, self.tracer = node, tracer
        self._init_state()  # a tensor with no history (its _data is never set)

    @property
    def _data(self):
        raise RuntimeError("compiled autograd: the values of a traced tensor cannot be read "
                           "while tracing; backward code must use tensor operations (not "
                           ".numpy(), .item(), or control flow on values)")

    @staticmethod
    def __prim_call__(prim, args, params):
        tracer = next(a.tracer for a in args if isinstance(a, Proxy))
        return tracer.call_prim(prim, args, params)

    @property
    def shape(self):
        shape = tuple(self.node.meta["shape"])
        if self.tracer.user_code:
            # A custom Function's backward may compute with a size in ways that
            # cannot stay symbolic (1.0 / n): it sees plain ints, each symbolic
            # one pinned by a guard.
            return tuple(int(d) for d in shape)
        return shape

    # numel/len of a symbolic shape specialise it (with a guard), which is correct.
    dtype = property(lambda self: self.node.meta["dtype"])
    ndim = property(lambda self: len(self.node.meta["shape"]))

    def dim(self):
        return self.ndim

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self):
        return self.shape[0]

    def is_contiguous(self):
        return True

    def contiguous(self):
        return self

    def view(self, *shape):
        return self.reshape(*shape)

    def __repr__(self):
        return f"Proxy({self.node.name}: {self.node.format_type()})"


class Tracer:
    """Builds the graph; knows where each runtime value sits in the boxed lists."""

    def __init__(self, collected: CompiledNodeArgs, n_roots: int, dynamic=frozenset()):
        self.graph = Graph()
        self.collected = collected
        self.n_roots = n_roots
        self.dynamic = dynamic      # positions in ``sizes`` that are symbolic
        self.boxes = {name: self.graph.create_node("placeholder", name, name=name)
                      for name in BOXED}
        self.constants: list = []   # arrays baked into this graph (lifted into inputs)
        self.source = None
        self.user_code = 0          # > 0 while a custom Function's backward runs
        self._proxies: dict = {}

    # ---------------------------------------------------------- node builders

    def _meta(self, shape, dtype):
        if shape is None:
            return {"shape": None, "dtype": None, "nbytes": 0, "source": self.source}
        shape = tuple(shape)  # symbolic dims stay symbolic
        dtype = np.dtype(dtype)
        nbytes = int(np.prod([hint(d) for d in shape], dtype=np.int64)) * dtype.itemsize
        return {"shape": shape, "dtype": dtype, "nbytes": nbytes, "source": self.source}

    def sizes(self, owner, shapes):
        """``shapes`` with the dims at dynamic positions made symbolic."""
        if not self.dynamic:
            return shapes
        pos = self.collected.size_pos.get(owner if isinstance(owner, tuple) else id(owner))
        if pos is None:
            return shapes
        out = []
        for shape in shapes:
            if shape is None:
                out.append(None)
                continue
            out.append(tuple(SymInt.size(d, pos + j) if pos + j in self.dynamic and d > 1
                             else d for j, d in enumerate(shape)))
            pos += len(shape)
        return tuple(out)

    def scalar(self, owner, value):
        return SymFloat.scalar(value, self.collected.scalar_pos[owner])

    def params(self, owner, params):
        """Params with their ints (collected as sizes, sorted by key) symbolic
        where dynamic."""
        if not self.dynamic:
            return params
        pos = [self.collected.param_pos[id(owner)]]

        def rebuild(v):
            if type(v) is int or isinstance(v, np.integer):
                p = pos[0]
                pos[0] += 1
                return SymInt.size(int(v), p) if p in self.dynamic and v > 1 else v
            if isinstance(v, tuple):
                return tuple(rebuild(x) for x in v)
            return v
        return {k: v if k in _INDEX_PARAMS else rebuild(v) for k, v in sorted(params.items())}

    def getitem(self, box, index, shape=None, dtype=None, name=None, kind=None):
        meta = self._meta(shape, dtype)
        if kind:
            meta["kind"] = kind
        container = self.boxes[box] if isinstance(box, str) else box
        return self.graph.create_node("call_function", "getitem", (container, index),
                                      name=name or (f"{box}_{index}" if isinstance(box, str)
                                                    else "getitem"), meta=meta)

    def input_index(self, slot_index):
        return self.n_roots + slot_index

    def call_hook(self, kind, args, shape=None, dtype=None, name=None):
        return self.graph.create_node("call_hook", kind, args, name=name or kind,
                                      meta=self._meta(shape, dtype))

    def lift_constant(self, array):
        index = self.n_roots + len(self.collected.inputs) + len(self.constants)
        self.constants.append(array)
        return self.getitem("inputs", index, array.shape, array.dtype, name="constant")

    def call_prim(self, prim, args, params):
        node_args = []
        for a in args:
            if isinstance(a, Proxy):
                node_args.append(a.node)
            elif isinstance(a, Tensor):
                node_args.append(self.lift_constant(a._data))
            elif isinstance(a, np.ndarray):
                node_args.append(self.lift_constant(a))
            elif isinstance(a, np.generic):
                node_args.append(a.item())
            else:
                node_args.append(a)
        shape, dtype = prim.meta(*[_graph_aval(a) for a in node_args], **params)
        node = self.graph.create_node("call_function", prim.name, node_args, params,
                                      name=prim.name, meta=self._meta(shape, dtype))
        return Proxy(self, node)

    def proxy(self, node):
        return Proxy(self, node)

    # ---------------------------------------------------------- runtime values

    def saved_proxy(self, sv):
        """The graph value standing for a saved variable."""
        p = self._proxies.get(id(sv))
        if p is None:
            where = self.collected.slot[id(sv)]
            (shape,) = self.sizes(sv, (sv.shape,))
            if where[0] == "inputs":
                node = self.getitem("inputs", self.input_index(where[1]), shape, sv.dtype,
                                    name="saved")
            else:
                _, hook_i, packed_i = where
                hook = self.getitem("hooks", hook_i, name="hook")
                packed = self.getitem("packed_data", packed_i, name="packed")
                node = self.call_hook("unpack_hook", (hook, packed), shape, sv.dtype)
                node.meta["strides"] = _element_strides(sv, shape)
            p = self._proxies[id(sv)] = Proxy(self, node)
        return p

    def lifted_proxy(self, obj, kind=None):
        """The graph value of a leaf Tensor (kind "leaf": the Tensor itself, whose
        .grad an accumulation writes) or of a ctx Tensor attribute (its values)."""
        where = id(obj) if kind == "leaf" else ("tensor", id(obj))
        p = self._proxies.get(where)
        if p is None:
            _, i = self.collected.slot[where]
            (shape,) = self.sizes(obj if kind == "leaf" else where, (obj.shape,))
            node = self.getitem("inputs", self.input_index(i), shape, obj.dtype,
                                name="leaf" if kind == "leaf" else "input", kind=kind)
            p = self._proxies[where] = Proxy(self, node)
        return p

    def next_hook(self, hook):
        """The getitem of the next unused slot holding ``hook``."""
        slots = self.collected.slot[("hook", id(hook))]
        return self.getitem("hooks", slots.pop(0), name="hook")


def _element_strides(sv, shape):
    """The layout a checkpoint's recomputation gives the saved value back in: its
    strides at pack time, in elements (static sizes, no negative or partial-element
    strides), else None. Other unpack hooks (a reload from disk, a user's) return
    arrays of their own making: no layout is promised, so none is recorded (a
    compiled backward would have to copy them into it)."""
    strides = getattr(sv, "strides", None)
    size = sv.dtype.itemsize
    if strides is None or sv.packed_kind != "checkpoint" or \
            not all(type(d) is int for d in shape) or any(s < 0 or s % size for s in strides):
        return None
    return tuple(s // size for s in strides)


def _graph_aval(a):
    return ir.Aval.of(a) if isinstance(a, ir.Node) else a


class TraceSwap(SwapSavedVariables):
    """Swaps saved variables for graph values; needs come from the graph task."""

    def __init__(self, tracer, task, needs_override=None):
        super().__init__(needs_override)
        self.tracer, self.task = tracer, task

    def before(self, sv):
        return self.tracer.saved_proxy(sv)

    def lifted(self, tensor):
        return self.tracer.lifted_proxy(tensor)

    def needs(self, node):
        return self._needs if self._needs is not None else self.task.needs_of(node)

    def with_needs(self, needs):
        return TraceSwap(self.tracer, self.task, needs)

    def sizes(self, owner, shapes):
        return self.tracer.sizes(owner, shapes)

    @contextlib.contextmanager
    def user_code(self):
        self.tracer.user_code += 1
        try:
            yield
        finally:
            self.tracer.user_code -= 1

    def scalar(self, owner, value):
        return self.tracer.scalar(owner, value)

    def params(self, owner, params):
        return self.tracer.params(owner, params)

    def accumulate_grad(self, variable, grad):
        leaf = self.tracer.lifted_proxy(variable, kind="leaf")
        self.tracer.call_hook("accumulate_grad", (leaf.node, grad.node), name="accumulate_grad")


# -------------------------------------------------------------- hooks of a node

def node_hooks(fn):
    """(kind, input_nr, callable) of every hook around ``fn``, in eager's order:
    tensor pre-hooks and retain_grad, node pre-hooks, post-accumulate-grad hooks,
    node post-hooks."""
    d = fn.__dict__
    out = []
    variable = _hooks.leaf_of(fn)
    per_output = dict(d.get("_tensor_pre_hooks") or {})
    if variable is not None and variable._backward_hooks:
        per_output = {0: variable._backward_hooks}
    for nr, hooks in per_output.items():
        out += [("tensor_pre_hook", nr, h) for h in hooks.values()]
    retainers = d.setdefault("_retainer_fns", {}) if d.get("_retains_grad") else {}
    for nr, refs in (d.get("_retains_grad") or {}).items():
        for key, ref in refs.items():
            # One closure per retained tensor, so both walks see the same callable.
            fn_ = retainers.get((nr, key, id(ref)))
            if fn_ is None:
                fn_ = retainers[(nr, key, id(ref))] = _retainer(ref)
            out.append(("tensor_pre_hook", nr, fn_))
    out += [("pre_hook", None, h) for h in (d.get("_pre_hooks") or {}).values()]
    if variable is not None and variable._post_accumulate_grad_hooks:
        out += [("post_acc_grad_hook", None, h)
                for h in variable._post_accumulate_grad_hooks.values()]
    out += [("post_hook", None, h) for h in (d.get("_post_hooks") or {}).values()]
    return out


def _retainer(ref):
    """retain_grad as a tensor hook that stores the gradient and changes nothing."""
    def retain_grad(grad):
        t = ref()
        if t is not None:
            _hooks.retain(t, grad._data)
    return retain_grad


# -------------------------------------------------------------- the two walks

def collect(task, roots, record=True):
    """The key and runtime values of this backward. Nodes are visited in the graph
    task's discovery order (a deterministic walk of the structure) and named by
    their rank in it; runtime values are found again by identity, so the trace may
    visit in eager's order. ``record=False`` (a cache hit) skips noting where each
    value sits, which only the tracer needs."""
    args = CompiledNodeArgs(record)
    index = task.index
    args.collect(("roots", tuple((index[fn], nr, np.asarray(g).dtype)
                                 for (fn, nr), g in roots)))
    for i, (_, g) in enumerate(roots):
        args.collect_sizes((np.shape(g),), owner=("root", i))
    captures = task.captures
    if captures:
        # An input the roots do not reach (allow_unused) is captured by no node:
        # its gradient is None. Only its position is part of the key.
        args.collect(("captures", tuple(sorted((index[fn], nr, tuple(idx))
                                               for (fn, nr), idx in captures.items()
                                               if fn in index)),
                      tuple(sorted(i for (fn, _), idx in captures.items()
                                   if fn not in index for i in idx))))
    exec_info = task.exec_info
    walk = native_walk.module() if not record and exec_info is None else None
    if walk is not None:
        # The same loop in C for the plain nodes; it calls _collect_node for the rest.
        walk.collect_nodes(task.nodes, task.edges, args,
                           (args.key, args.saved, args.inputs, args.sizes, args.scalars),
                           _plain_node_kinds(), SavedVariable, _PARAM_SPLITS, _params_split,
                           _NO_PARAMS, _collect_node)
        return args
    captured_fns = {fn for fn, _ in captures}
    for fn, edges in zip(task.nodes, task.edges):
        runs = True
        if exec_info is not None:
            # Not every node runs: the key says which (by rank) and whether.
            runs = exec_info.get(fn, False)
            if not runs and fn not in captured_fns:
                continue
            args.key.append(("node", index[fn], runs))
        _collect_node(args, fn, edges, runs)
    return args


def _collect_node(args, fn, edges, runs=True):
    """One node's hooks, compiled args and edges."""
    args.node = fn
    if _hooks.has_hooks(fn):
        for kind, nr, h in node_hooks(fn):
            if runs or kind == "tensor_pre_hook":
                args.collect_hook(kind, nr, h)
    if runs:
        fn.compiled_args(args)
        if engine.needs_validation(fn):
            # What user code must return: symbolic where dynamic, as the sizes
            # the returned gradients are checked against (tracer.visit).
            args.collect_sizes(engine.expected_shapes(fn), owner=("validate", id(fn)))
        if not isinstance(fn, (PrimBackward, AccumulateGrad)):   # hold saved values
            args.release_nodes.append(fn)
        args.key.append(("edges", tuple(edges)))


_kinds: dict = {}


def _plain_node_kinds() -> dict:
    """{node type: 1 (a prim's backward), 2 (AccumulateGrad) or 0 (Python
    collects it)}: whose compiled args native_walk may collect itself. Every node
    class is listed, so a new one (NODE_CLASSES grows lazily) rebuilds it once."""
    if len(_kinds) != len(NODE_CLASSES) + 1:
        _kinds.clear()
        _kinds.update({cls: 1 if cls.compiled_args is PrimBackward.compiled_args else 0
                       for cls in NODE_CLASSES.values()})
        _kinds[AccumulateGrad] = 2
    return _kinds


def trace(task, roots, collected, captured_count, dynamic=frozenset()):
    """The graph of this backward (roots' gradients are ``inputs[0..n)``); sizes at
    the ``dynamic`` positions are symbolic."""
    tracer = Tracer(collected, len(roots), dynamic)
    root_proxies = []
    for i, ((fn, nr), g) in enumerate(roots):
        (shape,) = tracer.sizes(("root", i), (np.shape(g),))
        node = tracer.getitem("inputs", i, shape, np.asarray(g).dtype, name="grad_root")
        root_proxies.append(((fn, nr), tracer.proxy(node)))
    swap = TraceSwap(tracer, task)
    captured = [None] * captured_count

    def run_hooks(fn, grads, kinds):
        grads = list(grads)
        for kind, nr, hook in node_hooks(fn):
            if kind not in kinds:
                continue
            h = tracer.next_hook(hook)
            if kind == "tensor_pre_hook":
                if grads[nr] is None:
                    continue
                g = grads[nr].node
                out = tracer.call_hook(kind, (h, g), g.meta["shape"], g.meta["dtype"])
                grads[nr] = tracer.proxy(out)
            elif kind == "pre_hook":
                result = tracer.call_hook(kind, (h,) + tuple(
                    None if g is None else g.node for g in grads))
                grads = [None if g is None else tracer.proxy(tracer.getitem(
                    result, i, g.shape, g.dtype, name="pre_hook_grad"))
                    for i, g in enumerate(grads)]
        return grads

    def visit(fn, grads):
        tracer.source = fn.name()
        if task.captures:
            grads = engine.capture(task, fn, grads, captured,
                                   lambda f, gs: run_hooks(f, gs, ("tensor_pre_hook",)))
        if not task.will_run(fn) or all(g is None for g in grads):
            return (None,) * len(fn.next_functions)
        grads = run_hooks(fn, grads, ("tensor_pre_hook", "pre_hook"))
        if isinstance(fn, AccumulateGrad):
            if grads[0] is not None:
                swap.accumulate_grad(fn.variable, grads[0])
                leaf = tracer.lifted_proxy(fn.variable, kind="leaf")
                for kind, _, hook in node_hooks(fn):
                    if kind == "post_acc_grad_hook":
                        tracer.call_hook(kind, (tracer.next_hook(hook), leaf.node))
            _post_hooks(tracer, fn, (), grads)
            return ()
        outputs = fn.apply_with_saved(grads, swap)
        outputs = _post_hooks(tracer, fn, outputs, grads)
        if outputs and engine.needs_validation(fn):
            shapes = swap.sizes(("validate", id(fn)), engine.expected_shapes(fn))
            outputs = engine.validate(fn, outputs, shapes)
        return tuple(outputs)

    engine.walk(task, root_proxies, visit)
    tracer.source = None
    tracer.graph.create_node("output", "output", (tuple(
        None if c is None else c.node for c in captured),), name="output")
    return tracer


def _post_hooks(tracer, fn, outputs, grads):
    posts = [h for kind, _, h in node_hooks(fn) if kind == "post_hook"]
    for hook in posts:
        h = tracer.next_hook(hook)
        args = (h, len(outputs)) + tuple(None if g is None else g.node
                                        for g in list(outputs) + list(grads))
        result = tracer.call_hook("post_hook", args)
        outputs = tuple(None if g is None else tracer.proxy(tracer.getitem(
            result, i, g.shape, g.dtype, name="post_hook_grad")) for i, g in enumerate(outputs))
    return outputs
