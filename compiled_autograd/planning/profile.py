"""What a recomputation planner needs to know about one forward and backward.

``profile_for_planning(fn, args, kwargs, backend)`` runs ``fn`` three times:

1. warm-up: forward and backward (a compiled backend compiles here, outside any
   measurement);
2. baseline: forward and backward under ``ca.memory.profile()``, no plan: the peak
   a budget fraction refers to;
3. recording: the forward under a ``RecipeRecorder`` that saves *every* value it
   can as its recipe, so that each array is freed as soon as the forward's own
   Python code lets go of it. It records each prim call (a ``Value``: prim, inputs,
   bytes, FLOPs, whether a backward node saved it, when it was freed) and the live
   bytes after each call; then the backward of that forward is traced (not run):
   a graph in which every saved value is recomputed from the forward's inputs;
   and its saved values are released, as a backward would release them: the
   storages that only they held (values saved as they are, values the forward's
   own saved-tensor hooks hold) are freed after their last use in the backward.

A plan keeps some values and recomputes the others: ``simulate`` derives its
backward graph from the recorded one (kept values become graph inputs, dead
recomputation is dropped) and plans its memory with ``memory_schedule``, the
planner every backend's accounting is compared against. Gradients the profiling
runs accumulate are put back as they were, and so is the random number generator
(each run starts from the state it had: dropout draws the same masks).
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from compiled_autograd.autograd.random import get_rng_state, set_rng_state
from compiled_autograd.autograd.recipe import RecipeRecorder
from compiled_autograd.compiled.api import backward_on, trace_with_values
from compiled_autograd.ir.graph import Graph
from compiled_autograd.memory.profile import profile
from compiled_autograd.runtime import memory as _rt
from compiled_autograd.runtime.prims import PRIMS

# Reference rates of the recompute cost (a numpy kernel on one core, roughly):
# cost in seconds = FLOPs / FLOP_RATE + bytes read and written / BYTE_RATE.
FLOP_RATE = 10e9
BYTE_RATE = 5e9

_HEAVY = {"gelu": 20, "erf": 20, "exp": 8, "log": 8, "tanh": 8, "sigmoid": 8, "sin": 8,
          "cos": 8, "pow": 8, "sqrt": 4, "layer_norm": 8, "layer_norm_affine": 10, "softmax": 10,
          "log_softmax": 10, "scaled_softmax": 11}


def prim_flops(name, in_shapes, out_shape) -> int:
    """An estimate of a prim's floating-point operations: 2 M N K for a matrix
    product, a per-element weight for transcendental and normalizing prims, one
    per element otherwise (reductions count their input), none for a view."""
    prim = PRIMS[name]
    out = int(np.prod(out_shape)) if out_shape is not None else 0
    if prim.view:
        return 0
    if name in ("matmul", "linear"):
        return 2 * out * int(in_shapes[0][-1]) if in_shapes[0] else out
    biggest = max([int(np.prod(s)) for s in in_shapes if s is not None] + [out])
    return _HEAVY.get(name, 1) * biggest


@dataclass
class Value:
    """One prim call of the recorded forward and the value it made."""
    index: int
    prim: str
    inputs: tuple          # per input: ("value", j), ("kept", array id) or a constant
    shape: tuple
    dtype: object
    nbytes: int            # bytes of its own storage (0: a view of its input's)
    storage: int | None    # the value owning its storage (None: an array from outside)
    flops: int
    cost: float            # seconds at the reference rates
    saved: bool = False    # a backward node saved it
    freed_at: int | None = None   # prim calls done when the forward freed its storage
    # Its storage outlived the forward only for the backward: saved as it is (a
    # value written in place since its prim made it), or held by the packed data
    # of the forward's own saved-tensor hooks. Backward nodes that read it have
    # meta "storage" (its index); it is freed after the last of them.
    freed_with_graph: bool = False


@dataclass
class PlanningProfile:
    values: list                  # Value per prim call
    signature: list               # (prim, input shapes) per call: what a plan checks
    baseline_peak: int            # forward+backward, no plan, ca.memory.profile()
    forward_live: list            # live bytes after each prim call (recording run)
    backward_start: int           # live bytes when the backward starts (recording run)
    graph: Graph                  # the recorded backward: every saved value recomputed
    packed_kinds: list
    backend: object
    seconds: float = 0.0
    baseline_profile: object = None
    node_of: dict = field(default_factory=dict)   # value index -> recipe node


def _leaves(loss):
    """The leaf Tensors a backward of ``loss`` accumulates into."""
    out, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        variable = getattr(fn, "variable", None)
        if variable is not None:
            out.append(variable)
        stack.extend(f for f, _ in fn.next_functions)
    return out


def _backward(loss, backend):
    """``loss.backward()`` on ``backend`` (None: the eager engine), leaving every
    leaf's .grad as it was."""
    leaves = _leaves(loss)
    before = [leaf.grad for leaf in leaves]
    for leaf in leaves:
        leaf.grad = None
    try:
        backward_on(loss, backend)
    finally:
        for leaf, g in zip(leaves, before):
            leaf.grad = g


def _scalar_loss(fn, args, kwargs):
    loss = fn(*args, **kwargs)
    if getattr(loss, "grad_fn", None) is None or loss.shape not in ((), (1,)):
        raise RuntimeError("plan_checkpoints: fn must return a scalar loss that requires "
                           "grad (a Tensor of shape () with a grad_fn), got "
                           f"{type(loss).__name__} {getattr(loss, 'shape', '')}")
    return loss


class _Recording:
    """The recorder's callbacks during the recording run."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.values, self.signature, self.live = [], [], []
        self.recorder = None
        self.done = False
        self.dropping_graph = False
        self.roots = {}   # id(storage) -> (weak reference to it, its value's index)

    def on_call(self, index, prim, arrays, params):
        self.signature.append(signature_of(prim, arrays))

    def on_made(self, index, result, arrays):
        data = result._data
        rec = self.recorder
        inputs, in_shapes, read = [], [], 0
        for a in arrays:
            if isinstance(a, np.ndarray):
                j = rec.index_of(a)
                inputs.append(("value", j) if j is not None else ("kept", id(a)))
                in_shapes.append(a.shape)
                read += a.nbytes
            else:
                inputs.append(a)
                in_shapes.append(None)
        prim = PRIMS[self.signature[index][0]]
        root = _root(data)
        storage, nbytes = index, root.nbytes
        sharing = [rec.index_of(a) for a in arrays
                   if isinstance(a, np.ndarray) and _root(a) is root]
        if sharing:  # a view: of a recorded value, or of an array from outside
            storage = next((self.values[j].storage for j in sharing if j is not None), None)
            nbytes = 0
        flops = prim_flops(prim.name, in_shapes, data.shape)
        written = 0 if prim.view else data.nbytes
        self.values.append(Value(index, prim.name, tuple(inputs), data.shape, data.dtype,
                                 nbytes, storage, flops,
                                 flops / FLOP_RATE + (read + written) / BYTE_RATE))
        if storage == index:
            weakref.finalize(root, self._freed, index)
            self.roots[id(root)] = (weakref.ref(root), index)
        self.live.append(self.tracker.live_bytes)

    def _freed(self, index):
        value = self.values[index]
        if value.freed_at is None and not self.done:  # (after the forward: alive at its end)
            value.freed_at = self.recorder.count
        elif self.dropping_graph:
            value.freed_with_graph = True

    def storage_of(self, array):
        """The index of the value owning ``array``'s storage, or None."""
        root = _root(array)
        entry = self.roots.get(id(root))
        return entry[1] if entry is not None and entry[0]() is root else None

    def mark_reads(self, graph, inputs, packed_data):
        """meta "storage" on the nodes of the recorded backward that read a
        recorded value's storage as it is: a value saved without a recipe
        (``getitem(inputs, i)``) or an unpack hook's Tensor (its packed data)."""
        for node in graph.nodes:
            if node.op == "call_function" and node.target == "getitem" and \
                    getattr(node.args[0], "target", None) == "inputs":
                value = inputs[node.args[1]]
            elif node.op == "call_hook" and node.target == "unpack_hook" and \
                    getattr(node.args[1], "target", None) == "getitem":
                value = packed_data[node.args[1].args[1]]
            else:
                continue
            value = getattr(value, "_data", value)   # (a Tensor: its array)
            if isinstance(value, np.ndarray):
                index = self.storage_of(value)
                if index is not None:
                    node.meta["storage"] = index

    def pack(self, tensor):
        recipe = self.recorder.recipe_of(tensor)
        if recipe is not None:
            self.values[recipe.index].saved = True
        return recipe


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def signature_of(prim, arrays) -> tuple:
    return (prim.name, tuple(a.shape if isinstance(a, np.ndarray) else None for a in arrays))


def _release(collected, rec):
    """Release the saved values of the recording run's backward (which is never
    run) as a backward would: the storages only they held are freed now
    (``Value.freed_with_graph``)."""
    saved, holders = list(collected.saved), list(collected.release_nodes)
    collected.clear()
    rec.dropping_graph = True
    try:
        while saved:
            saved.pop().release()
        while holders:
            holders.pop().release_variables()
    finally:
        rec.dropping_graph = False


def profile_for_planning(fn, args, kwargs, backend="python") -> PlanningProfile:
    start = time.perf_counter()
    rng = get_rng_state()   # (each run draws the same numbers; then as if none ran)
    try:
        return _profile(fn, args, kwargs, backend, start, rng)
    finally:
        set_rng_state(rng)


def _profile(fn, args, kwargs, backend, start, rng):
    _backward(_scalar_loss(fn, args, kwargs), backend)            # warm-up
    set_rng_state(rng)
    with profile(tracemalloc_witness=False) as base:
        _backward(_scalar_loss(fn, args, kwargs), backend)
    set_rng_state(rng)
    with profile(tracemalloc_witness=False):
        tracker = _rt._trackers[-1]
        rec = _Recording(tracker)
        recorder = rec.recorder = RecipeRecorder(lambda i: True, rec.on_call, rec.on_made)
        recorder.pack = rec.pack   # (notes which values backward nodes saved)
        with recorder:
            loss = _scalar_loss(fn, args, kwargs)
        rec.done = True
        # (and the backward makes the root's gradient first, outside its graph)
        backward_start = tracker.live_bytes + loss._data.nbytes
        traced, inputs, collected = trace_with_values(loss)
        rec.mark_reads(traced.graph, inputs, collected.packed_data)
        del inputs, loss
        _release(collected, rec)
    node_of = {n.meta["recipe"]: n for n in traced.graph.nodes if "recipe" in n.meta}
    return PlanningProfile(rec.values, rec.signature, base.peak_bytes, rec.live,
                           backward_start, traced.graph, traced.packed_kinds or [],
                           backend, time.perf_counter() - start, base, node_of)


def measure_plan(plan, fn, args, kwargs, backend) -> int:
    """The measured peak of forward plus backward under ``plan`` on ``backend``:
    a warm run (the first compiles), every leaf's .grad None at the start (as
    the plan assumes), then put back with the random generator."""
    rng = get_rng_state()
    try:
        for _ in range(2):
            set_rng_state(rng)
            with profile(tracemalloc_witness=False) as prof:
                with plan:
                    loss = _scalar_loss(fn, args, kwargs)
                _backward(loss, backend)
                del loss
        return prof.peak_bytes
    finally:
        set_rng_state(rng)
