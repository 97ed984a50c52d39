"""The tracer: records a whole backward as one graph.

On a cache miss (after ``collection.collect`` gave the key and the runtime
values), ``trace`` walks the autograd graph with ``Proxy`` gradients: each node's
   ``apply_with_saved`` runs its ordinary derivative formula, whose prim calls land
   in the graph; saved values come from ``getitem(inputs, i)`` or, under
   saved-tensor hooks, from a ``call_hook(unpack_hook)`` node; hooks and gradient
   accumulation become ``call_hook`` nodes, in the order eager runs them, and so
   does a custom Function's backward (``call_backward``: it runs as Python) unless
   the Function declared it traceable (``inline_backward``).
"""
from __future__ import annotations

import contextlib

import numpy as np

from compiled_autograd.autograd import engine
from compiled_autograd.compiled.cache import ensure_handler, log, log_flags
from compiled_autograd.compiled.collection import node_hooks
from compiled_autograd.compiled.compiled_args import (INDEX_PARAMS, CompiledNodeArgs,
                                                      SwapSavedVariables)
from compiled_autograd.ir import graph as ir
from compiled_autograd.ir.graph import BOXED, Graph
from compiled_autograd.autograd.node import AccumulateGrad, plain_array
from compiled_autograd.autograd.recipe import Kept, Recipe
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

    def stride(self, dim=None):
        """A contiguous tensor's (as ``is_contiguous``: a graph value's layout is
        the backend's to choose)."""
        strides, step = [], 1
        for d in reversed(self.shape):
            strides.append(step)
            step = step * d
        strides = tuple(reversed(strides))
        return strides if dim is None else strides[dim]

    def contiguous(self):
        return self

    def view(self, *shape):
        return self.reshape(*shape)

    def __repr__(self):
        return f"Proxy({self.node.name}: {self.node.format_type()})"


class Tracer:
    """Builds the graph; knows where each runtime value sits in the boxed lists."""

    def __init__(self, collected: CompiledNodeArgs, n_roots: int, dynamic=frozenset(),
                 none_masks=None):
        self.graph = Graph()
        self.none_masks = none_masks or {}   # see cache.Family.none_masks
        self.backward_calls: dict = {}       # node rank -> gradients its call_backward gives
        self.collected = collected
        self.n_roots = n_roots
        self.dynamic = dynamic      # positions in ``sizes`` that are symbolic
        self.boxes = {name: self.graph.create_node("placeholder", name, name=name)
                      for name in BOXED}
        self.constants: list = []   # arrays baked into this graph (lifted into inputs)
        self.source = None
        self.visits = 0             # autograd nodes visited so far
        self.swaps = 0              # saved values swapped in as recipes so far
        self.user_code = 0          # > 0 while a custom Function's backward runs
        self.updated: dict = {}     # version counters of tensors stored into so far
        self._proxies: dict = {}

    # ---------------------------------------------------------- node builders

    def _meta(self, shape, dtype):
        # "visit": which autograd node's visit made the node (the memory planner
        # places a saved value where its reader's visit starts)
        if shape is None:
            return {"shape": None, "dtype": None, "nbytes": 0, "source": self.source,
                    "visit": self.visits}
        shape = tuple(shape)  # symbolic dims stay symbolic
        dtype = np.dtype(dtype)
        nbytes = int(np.prod([hint(d) for d in shape], dtype=np.int64)) * dtype.itemsize
        return {"shape": shape, "dtype": dtype, "nbytes": nbytes, "source": self.source,
                "visit": self.visits}

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
        return {k: v if k in INDEX_PARAMS else rebuild(v) for k, v in sorted(params.items())}

    def getitem(self, box, index, shape=None, dtype=None, name=None, kind=None):
        meta = self._meta(shape, dtype)
        if kind:
            meta["kind"] = kind
        container = self.boxes[box] if isinstance(box, str) else box
        return self.graph.create_node("call_function", "getitem", (container, index),
                                      name=name or (f"{box}_{index}" if isinstance(box, str)
                                                    else "getitem"), meta=meta)

    def input_index(self, slot_index):
        """Where ``inputs[slot_index]`` of the collected args sits in the boxed
        list: after the roots' gradients and the plain saved values' arrays."""
        return self.n_roots + len(self.collected.plain) + slot_index

    def call_hook(self, kind, args, shape=None, dtype=None, name=None):
        return self.graph.create_node("call_hook", kind, args, name=name or kind,
                                      meta=self._meta(shape, dtype))

    def lift_constant(self, array):
        index = self.input_index(len(self.collected.inputs)) + len(self.constants)
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
        if p is None and sv.packed_kind == "recipe":
            p = self._proxies[id(sv)] = self.recipe_proxy(sv.packed)
            # (when and in what order saved values are swapped in: a memory
            # planner derives other plans' graphs from this one)
            self.swaps += 1
            p.node.meta.setdefault("swapped", []).append((self.visits, self.swaps))
        elif p is None:
            counter = self.updated.get(id(sv._version_counter))
            if counter is not None and sv.unpack_hook is None:
                # Read after a store wrote its storage (a traced update of the
                # parameter it was saved from): eager's unpack sees the version the
                # update left and raises; so does the trace, before anything runs.
                counter.value += 1
                try:
                    sv.check(self.source or "backward")
                finally:
                    counter.value -= 1
            where = self.collected.slot[id(sv)]
            (shape,) = self.sizes(sv, (sv.shape,))
            if where[0] == "saved":
                node = self.getitem("inputs", self.n_roots + where[1], shape, sv.dtype,
                                    name="saved")
                # (its SavedVariable, plain[i], and how eager's error names it:
                # passes.saved_reads_after_callbacks)
                node.meta["saved"] = (where[1], sv.origin(self.source or "backward"))
                node.meta["strides"] = _plain_strides(plain_array(sv), shape)
            else:
                _, hook_i, packed_i = where
                hook = self.getitem("hooks", hook_i, name="hook")
                packed = self.getitem("packed_data", packed_i, name="packed")
                node = self.call_hook("unpack_hook", (hook, packed), shape, sv.dtype)
                node.meta["strides"] = _element_strides(sv, shape)
            p = self._proxies[id(sv)] = Proxy(self, node)
        return p

    def recipe_proxy(self, recipe):
        """A value recomputed from its recipe: its prim nodes (and those of the
        recipes it needs, each made once), emitted here, right before the first
        node that reads the value; they are freed after their last use like any
        other value. Kept arrays are read from ``inputs``."""
        key = ("recipe", id(recipe))
        p = self._proxies.get(key)
        if p is not None:
            return p
        args = []
        for a in recipe.inputs:
            if type(a) is Recipe:
                args.append(self.recipe_proxy(a))
            elif type(a) is Kept:
                where = ("kept", id(a.data))
                kept = self._proxies.get(where)
                if kept is None:
                    _, i = self.collected.slot[where]
                    kept = self._proxies[where] = Proxy(self, self.getitem(
                        "inputs", self.input_index(i), a.data.shape, a.data.dtype,
                        name="kept"))
                    # (its version is checked after a call into Python that comes
                    # before a recomputation from it, as eager's read checks it:
                    # passes.saved_reads_after_callbacks)
                    kept.node.meta["kept_version"] = \
                        self.collected.slot[("kept version", id(a.data))]
                args.append(kept)
            else:
                args.append(a)
        source, self.source = self.source, f"recompute_forward_{recipe.index}"
        try:
            p = self.call_prim(recipe.prim, args, recipe.params)
        finally:
            self.source = source
        p.node.meta["recipe"] = recipe.index
        p.node.meta["recomputes"] = recipe.describe()   # (eager's error names it)
        self._proxies[key] = p
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

    def release(self) -> None:
        """Drop what tracing needed (proxies, which refer back to this tracer, and
        the collected values), keeping the graph and its constants."""
        self._proxies = {}
        self.collected = None

    def mark(self):
        """The state ``rewind`` returns to."""
        return len(self.graph.nodes), len(self.constants), dict(self._proxies)

    def rewind(self, mark) -> None:
        """Drop every node, constant and proxy made since ``mark``."""
        n_nodes, n_constants, proxies = mark
        for node in reversed(self.graph.nodes[n_nodes:]):
            self.graph.erase_node(node)
        del self.constants[n_constants:]
        self._proxies = proxies

    def next_hook(self, hook):
        """The getitem of the next unused slot holding ``hook``."""
        slots = self.collected.slot[("hook", id(hook))]
        return self.getitem("hooks", slots.pop(0), name="hook")


def _plain_strides(array, shape):
    """The layout of a value saved without hooks, in elements, for compiled code to
    read it in place (an attention's q, k and v are views of one projection): the
    array's strides when the sizes are static and the layout is a non-overlapping
    one (each element in memory once), else None. A later backward that hits the
    cache with another layout gets a copy into this one (the key holds no
    strides), which is exact only because no element of the layout repeats."""
    if not isinstance(array, np.ndarray) or not all(type(d) is int for d in shape) \
            or array.size <= 1 or array.flags.c_contiguous:
        return None
    size = array.dtype.itemsize
    dims = sorted((s, n) for n, s in zip(array.shape, array.strides) if n > 1)
    reach = 1
    for stride, n in dims:      # innermost first: each dim steps past the ones inside it
        if stride < 0 or stride % size or stride // size < reach:
            return None
        reach = stride // size * n
    return tuple(s // size for s in array.strides)


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

    def inlined(self, node, trace):
        """The traced backward of a Function that declared ``inline_backward``;
        None, with the graph as it was, when tracing it fails (it reads values,
        mutates, raises...): the caller then records a call_backward node,
        which runs the same code at run time (and raises there, in eager's order,
        if it really is an error)."""
        tracer = self.tracer
        mark = tracer.mark()
        try:
            return trace()
        except Exception as e:   # noqa: BLE001 -- any failure: run it as Python
            tracer.rewind(mark)
            if "verbose" in log_flags():
                ensure_handler()
                log.info(f"{node.name()}: inline_backward could not be traced "
                         f"({type(e).__name__}: {e}); it runs as Python (call_backward)")
            return None

    def call_backward(self, node, values, grads):
        tracer = self.tracer
        # A gradient for every edge, but where the backward returned None last time.
        none = tracer.none_masks.get(self.task.index.get(node), ())
        takes = tuple(nxt is not None and not (i < len(none) and none[i])
                      for i, (nxt, _) in enumerate(node.next_functions))
        tracer.backward_calls[self.task.index.get(node)] = takes
        args = (tracer.next_hook(node), takes, len(values))
        args += tuple(None if v is None else v.node for v in values)
        args += tuple(None if g is None else g.node for g in grads)
        call = tracer.call_hook("call_backward", args)
        shapes = self.sizes(("validate", id(node)), engine.expected_shapes(node))
        outputs = []
        for i, ((nxt, nr), shape) in enumerate(zip(node.next_functions, shapes)):
            if not takes[i]:
                outputs.append(None)
            else:
                item = tracer.getitem(call, i, shape, nxt.input_metadata[nr][1], name="grad")
                outputs.append(tracer.proxy(item))
        return tuple(outputs)

    def scalar(self, owner, value):
        return self.tracer.scalar(owner, value)

    def params(self, owner, params):
        return self.tracer.params(owner, params)

    def store(self, dst, value, tensor=None):
        """Record ``dst[...] = value``: ``dst`` the graph value of ``tensor``, lifted.
        A saved value of the same storage swapped in after this is refused, as
        eager's check refuses it after the in-place write (``saved_proxy``)."""
        self.tracer.graph.create_node("call_function", "store", (dst.node, value.node),
                                      name="store", meta=self.tracer._meta(None, None))
        if tensor is not None:
            self.tracer.updated[id(tensor._version_counter)] = tensor._version_counter

    def accumulate_grad(self, variable, grad):
        leaf = self.tracer.lifted_proxy(variable, kind="leaf")
        self.tracer.call_hook("accumulate_grad", (leaf.node, grad.node), name="accumulate_grad")


# -------------------------------------------------------------- the walk

def trace(task, roots, collected, captured_count, dynamic=frozenset(), none_masks=None):
    """The graph of this backward (roots' gradients are ``inputs[0..n)``); sizes at
    the ``dynamic`` positions are symbolic; ``none_masks``: the gradients custom
    backwards returned as None (by node rank)."""
    tracer = Tracer(collected, len(roots), dynamic, none_masks)
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
        tracer.visits += 1
        if task.captures:
            grads = engine.capture(task, fn, grads, captured,
                                   lambda f, gs: run_hooks(f, gs, ("tensor_pre_hook",)))
        if not task.will_run(fn) or all(g is None for g in grads):
            return (None,) * len(fn.next_functions)
        grads = run_hooks(fn, grads, ("tensor_pre_hook", "pre_hook"))
        if isinstance(fn, AccumulateGrad):
            traced = [h for kind, _, h in node_hooks(fn) if kind == "post_acc_grad_hook"
                      and id(h) in tracer.collected.traced_hooks]
            if traced and grads[0] is not None:
                # (a traced hook takes the gradient itself: it is the only hook,
                # and .grad, None before, stays None, as its eager call leaves it)
                for hook in traced:
                    hook.apply_with_saved(fn.variable, grads[0], swap)
            elif grads[0] is not None:
                swap.accumulate_grad(fn.variable, grads[0])
                leaf = tracer.lifted_proxy(fn.variable, kind="leaf")
                for kind, _, hook in node_hooks(fn):
                    if kind == "post_acc_grad_hook":
                        # a hook may name its node (DDP's: bucket_<i>_allreduce, ...),
                        # which the generated code's comment then shows
                        name = getattr(hook, "graph_name", None)
                        node = tracer.call_hook(kind, (tracer.next_hook(hook), leaf.node),
                                                name=name)
                        if name:
                            node.meta["source"] = name
            _post_hooks(tracer, fn, (), grads)
            return ()
        outputs = fn.apply_with_saved(grads, swap)
        if outputs and engine.needs_validation(fn):    # (before the post hooks, as eager)
            shapes = swap.sizes(("validate", id(fn)), engine.expected_shapes(fn))
            outputs = engine.validate(fn, outputs, shapes)
        outputs = _post_hooks(tracer, fn, outputs, grads)
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
