"""The cache key of a backward, kept up to date while the forward builds its graph.

A cache hit needs the backward's key and runtime values. ``compiled_args.collect``
walks the whole graph for them at backward time, 1-3 us a node in Python. Here the
same code (``compiled_args.collect_node``: each node's ``compiled_args``) runs as
the forward makes each prim's node instead (``dispatch.node_made``), into this
thread's *segment*: the nodes made since its last compiled backward, in the order
they were made (a node that arrives out of its sequence number's order spoils the
segment). That is the key's canonical order (``compiled_args.canonical_order``),
so a node's part of the key is final when it is made: its edges name nodes of the
segment by distance, and leaves by first reference. A custom Function's node
(``Function.apply`` tells ``node_made`` too) takes its place in that order, but
its part is collected at the backward, when its ctx is what the backward reads
(``_with_late``); the segment holds it by weak reference.

A backward takes the segment (``take``) when its graph is exactly the segment:
- one root, the segment's newest node, which every other node of the segment
  leads to (each was pointed to by a later one: one node is left unconsumed);
- every edge out of the segment goes to a leaf's AccumulateGrad, and no saved
  value is one a memory plan recomputes: ``pure``;
- no hook was registered on a node since the segment began (``hooks.node_hook_clock``);
- no saved value was released or modified in place: checked value by value, and
  only when the release or write clock moved since the segment began.
The leaves (whose hooks may change between forward and backward) and the roots are
collected then, with the same code, after the segment's part: the canonical order
again. The saved values' runtime values are read from the saved variables, so the
segment holds nothing the graph does not hold: under saved-tensor hooks (or with
custom Functions) at the take, else at the hand-over to the compiled function,
in one pass with their release (``SavedVariable.arrays``; ``unread_saved``). In
every other case ``take`` returns None and ``compiled_args.collect`` walks the
graph; it also raises eager's errors.

``CA_CHECK_KEY=1`` in the environment (or ``check_key(True)``) collects both ways on
every backward that takes a segment and raises on any difference: compiled_args
stays the contract and the reference (tests/test_forward_key.py runs every
compiled-autograd scenario, and the random programs, with it on).

A segment whose graph is dropped without a backward (its newest unconsumed node
dies) lets go of everything it collected at once (a weak reference's callback), and
the next node starts a new one.
"""
from __future__ import annotations

import contextlib
import operator
import os
import threading
import weakref

import numpy as np

from compiled_autograd.autograd import dispatch, engine
from compiled_autograd.autograd import hooks as _hooks
from compiled_autograd.autograd import node as _node
from compiled_autograd.autograd import tensor_base
from compiled_autograd.autograd.function import FunctionBackward
from compiled_autograd.autograd.node import SavedVariable, plain_array
from compiled_autograd.compiled.compiled_args import (_M, _P, KEY_SEED, CompiledNodeArgs, Key,
                                                      collect, collect_node, collect_roots,
                                                      encode_edge, hash_part, intern_fold)

_local = threading.local()
_check = [os.environ.get("CA_CHECK_KEY", "") not in ("", "0")]
_walk = [0]
stats = {"taken": 0, "walked": 0}   # backwards that took a segment / walked the graph


def check_key(on: bool = True) -> None:
    """Collect every backward that takes a segment the walking way too, and raise
    AssertionError on a difference (the ``CA_CHECK_KEY`` switch)."""
    _check[0] = bool(on)


@contextlib.contextmanager
def walking():
    """Backwards inside walk the graph (the keys the forwards kept go unused):
    for comparisons."""
    _walk[0] += 1
    try:
        yield
    finally:
        _walk[0] -= 1


def enable() -> None:
    """Keep segments from now on (compiled autograd's first use): until then the
    forward pays nothing."""
    dispatch.node_made = node_made


def node_made(node) -> None:
    """``dispatch.node_made``: a prim's node is whole; add it to this thread's segment."""
    segment = getattr(_local, "segment", None)
    if segment is None or segment.closed:
        segment = _local.segment = Segment()
    if segment.pure:
        segment.add(node)


class Segment:
    """One thread's prim nodes since its last compiled backward, and their part of
    the key, collected as each was made."""

    def __init__(self):
        self.args = CompiledNodeArgs(record=False)
        self.hash = KEY_SEED
        self.rank: dict = {}          # id(node) -> position (made order)
        self.leaves: dict = {}        # AccumulateGrad -> j (first reference)
        self.unconsumed: dict = {}    # position -> weak reference, for nodes no later one points to
        self.pure = True
        self.closed = False
        self.hooked = False           # some value is saved under saved-tensor hooks
        self.last_made = -1           # the newest node's sequence number
        # Custom Function nodes, collected at the backward (their ctx may change
        # until then): (weak reference to the node, edges, where its part goes in
        # the key, sizes, scalars and saved lists, the hash of the run of items
        # before it). (Weak: the graph may end in one, and be dropped.)
        self.late: list = []
        self._on_drop = _on_drop(weakref.ref(self))    # (no cycle through the segment)
        self.hook_clock = _hooks.node_hook_clock
        self.write_clock = tensor_base.write_clock
        self.release_clock = _node.release_clock

    def add(self, node) -> None:
        if node._sequence_nr <= self.last_made:
            # Made before a node already here (user code ran in between: a pack
            # hook's own ops): the segment's order would not be the key's.
            self.spoil()
            return
        self.last_made = node._sequence_nr
        # (Its own references: the segment may be dropped while this runs -- a
        # garbage collection at any allocation frees a dropped graph.)
        rank, args, unconsumed = self.rank, self.args, self.unconsumed
        i = len(rank)
        key, saved = args.key, args.saved
        n_key, n_saved = len(key), len(saved)
        try:
            edges = tuple([encode_edge(i, nxt, nr, rank, self.leaves)
                           for nxt, nr in node.next_functions])
            if isinstance(node, FunctionBackward):
                # Its part is collected at the backward; the next run of items
                # folds from 0 (the take joins the runs: ``_with_late``).
                late = self.late
                late.append((weakref.ref(node), edges, n_key, len(args.sizes),
                             len(args.scalars), n_saved, self.hash))
                self.hash = 0
                self._link(node, i, edges, rank, unconsumed)
                return
            collect_node(args, node, edges)
            h = intern_fold(key, n_key, self.hash)
        except Exception:           # (a node made elsewhere; an error the backward will raise)
            self.spoil()
            return
        if args.recipes or args.release_nodes:
            self.spoil()            # a value a memory plan recomputes: walk
            return
        # The saved values' arrays, unpack hooks and packed data are read again at
        # the backward (``_values``): the segment holds only the saved variables.
        inputs, hooks = args.inputs, args.hooks
        n_hooked = 0
        if hooks:
            n_hooked = sum(sv.unpack_hook is not None for sv in saved[n_saved:])
            if len(hooks) != n_hooked or len(args.packed_data) != n_hooked:
                self.spoil()
                return
            hooks.clear()
            args.packed_data.clear()
            self.hooked = True
        if inputs:
            if len(inputs) + n_hooked != len(saved) - n_saved:
                self.spoil()        # (only saved values are expected)
                return
            inputs.clear()
        self.hash = h
        self._link(node, i, edges, rank, unconsumed)

    def _link(self, node, i, edges, rank, unconsumed) -> None:
        """Node ``i`` is the segment's: the nodes it points to are consumed."""
        for edge in edges:
            if edge is not None and edge[0].__class__ is int:
                unconsumed.pop(i - edge[0], None)   # pointed to: its weak reference goes
        rank[id(node)] = i
        unconsumed[i] = weakref.ref(node, self._on_drop)

    def spoil(self) -> None:
        """No backward will take this segment: let go of everything, and follow no
        more nodes until it ends (``drop``)."""
        self.pure = False
        self.args = self.rank = self.leaves = self.unconsumed = self.late = None

    def drop(self) -> None:
        """End the segment: the next node starts a new one."""
        self.spoil()
        self.closed = True


def end() -> None:
    """End this thread's segment (its forward will not be differentiated)."""
    segment = getattr(_local, "segment", None)
    if segment is not None:
        _local.segment = None
        segment.drop()


def _on_drop(segment_ref):
    """The weak references' callback: a node no later node points to died, so its
    graph was dropped without a backward."""
    def dropped(_):
        segment = segment_ref()
        if segment is not None:
            segment.drop()
    return dropped


def take(roots, input_edges, accumulate):
    """(collected args, key) of this backward from this thread's segment, or None
    when the graph has to be walked (see the module doc). Either way the segment
    ends here: the next forward starts a new one."""
    segment = getattr(_local, "segment", None)
    if segment is None:
        stats["walked"] += 1
        return None
    _local.segment = None
    try:
        taken = _take(segment, roots, input_edges, accumulate) if not _walk[0] else None
    finally:
        segment.drop()
    stats["taken" if taken is not None else "walked"] += 1
    return taken


def _take(segment, roots, input_edges, accumulate):
    if not segment.pure or input_edges is not None or not accumulate or len(roots) != 1:
        return None
    (fn, _), _ = roots[0]
    rank = segment.rank
    if (rank.get(id(fn)) != len(rank) - 1 or len(segment.unconsumed) != 1
            or _hooks.node_hook_clock != segment.hook_clock):
        return None
    part = segment.args
    saved = part.saved
    if _node.release_clock != segment.release_clock:
        if any(sv.released for sv in saved):
            return None                         # (the walk raises eager's error)
    if tensor_base.write_clock != segment.write_clock:
        for sv in saved:
            if sv.unpack_hook is None and sv._version_counter.value != sv.saved_version:
                return None                     # (the walk raises eager's error)
    if segment.late:
        try:
            args, h = _with_late(segment)
        except Exception:
            return None                 # (the walk raises eager's error, in eager's order)
    else:
        args, h = part, segment.hash    # (the segment's own lists: it ends here)
        if segment.hooked:
            _values(args, saved)
        else:
            args.unread_saved = True    # (read at the hand-over, with their release)
    h = _collect_leaves(args, list(segment.leaves), h)
    key = Key(args.key, _collect_root(args, roots, h))
    if _check[0]:
        _compare(roots, args, key)
    return args, key


def _with_late(segment):
    """(args, hash) of the segment's nodes with its custom Function nodes collected
    now (``collect_node``), each in its place: the runs of items the forward
    collected between them are joined by their hash parts (a run folded from 0 is
    its addend; its multiplier is P to its length), and their saved values read
    (``_values``) in the same order as the walk reads them."""
    part, args = segment.args, CompiledNodeArgs(record=False)
    at, h = (0, 0, 0, 0), None
    for node, edges, *where, before in segment.late:
        h = before if h is None else (h * pow(_P, where[0] - at[0], _M) + before) % _M
        _join(args, part, at, where)
        n_key = len(args.key)
        collect_node(args, node(), edges)   # (alive: the root reaches every node of it)
        h = intern_fold(args.key, n_key, h)
        at = where
    end = (len(part.key), len(part.sizes), len(part.scalars), len(part.saved))
    _join(args, part, at, end)
    return args, (h * pow(_P, end[0] - at[0], _M) + segment.hash) % _M


def _join(args, part, start, end) -> None:
    """The forward's run of ``part`` from ``start`` to ``end`` (key, sizes,
    scalars, saved) onto ``args``, with its saved values' runtime values."""
    args.key.extend(part.key[start[0]:end[0]])
    args.sizes.extend(part.sizes[start[1]:end[1]])
    args.scalars.extend(part.scalars[start[2]:end[2]])
    saved = part.saved[start[3]:end[3]]
    args.saved.extend(saved)
    _values(args, saved)


def _collect_leaves(args, leaves, h):
    """Collect the leaves' part (``collect_node`` of each AccumulateGrad) into
    ``args``; returns the key's hash folded over it. A leaf's items change only
    with a hook (a hook clock moves) or its tensor's dtype or shape, so each
    tensor's part is kept (``_leaf_parts``, dropped with the tensor), and so is the
    last block of parts for these tensors, checked with one look at each (a
    training step's parameters). Neither holds an array."""
    variables = list(map(_variable_of, leaves))
    ids = tuple(map(id, variables))
    clocks = (_hooks.node_hook_clock, _hooks.leaf_hook_clock)
    block = _leaf_blocks.get(ids)
    if block is not None and block[0] == clocks:
        arrays = list(map(_data_of, variables))
        if (all(map(operator.is_, map(_leaf_parts.get, ids), block[1]))
                and list(map(_dtype_of, arrays)) == block[2]
                and list(map(_shape_of, arrays)) == block[3]):
            args.key.extend(block[4])
            args.sizes.extend(block[5])
            args.inputs.extend(variables)
            return (h * block[6] + block[7]) % _M
    n_key, n_sizes = len(args.key), len(args.sizes)
    for leaf in leaves:
        h = _collect_leaf(args, leaf, h)
    parts = tuple(map(_leaf_parts.get, ids))
    if None not in parts:                  # (no hooks: every leaf has its part)
        if len(_leaf_blocks) > 64:
            _leaf_blocks.clear()
        items = tuple(args.key[n_key:])
        _leaf_blocks[ids] = (clocks, parts, [part[0] for part in parts],
                             [part[1] for part in parts], items,
                             tuple(args.sizes[n_sizes:]), *hash_part(items))
    return h


def _collect_leaf(args, leaf, h):
    variable = leaf.variable
    data = variable._data
    part = _leaf_parts.get(id(variable))
    if (part is None or part[0] != data.dtype or part[1] != data.shape
            or _hooks.has_hooks(leaf)):
        part = _leaf_part(leaf)
    if part is None:                       # (hooks: collected afresh at every backward)
        n_key = len(args.key)
        collect_node(args, leaf, ())
        return intern_fold(args.key, n_key, h)
    args.key.extend(part[2])
    args.sizes.extend(part[3])
    args.inputs.append(variable)
    return (h * part[4] + part[5]) % _M


_variable_of = operator.attrgetter("variable")
_data_of = operator.attrgetter("_data")
_dtype_of = operator.attrgetter("dtype")
_shape_of = operator.attrgetter("shape")
# ids of the leaf tensors -> (hook clocks, their parts, dtypes, shapes, key items,
# sizes, hash part)
_leaf_blocks: dict = {}
# id(leaf tensor) -> (dtype, shape, key items, sizes, hash part); dropped with the tensor
_leaf_parts: dict = {}


def _leaf_part(leaf):
    """A leaf's part of the key when no hook is around it, kept for the next
    backwards (per tensor: its AccumulateGrad node may be made anew each step),
    valid while the tensor keeps its dtype and shape and gains no hook. None with
    hooks."""
    variable = leaf.variable
    if _hooks.has_hooks(leaf):
        _leaf_parts.pop(id(variable), None)     # (so that no block holds it)
        return None
    args = CompiledNodeArgs(record=False)
    collect_node(args, leaf, ())
    intern_fold(args.key, 0, 0)
    items = tuple(args.key)
    key = id(variable)
    if key not in _leaf_parts:
        weakref.finalize(variable, _leaf_parts.pop, key, None)
    part = _leaf_parts[key] = (variable._data.dtype, variable._data.shape, items,
                               tuple(args.sizes), *hash_part(items))
    return part


def _values(args, saved) -> None:
    """The saved values' runtime values, as ``CompiledNodeArgs._saved`` collects
    them: an array, or (under saved-tensor hooks) the unpack hook and packed data."""
    inputs, hooks, packed = args.inputs, args.hooks, args.packed_data
    for sv in saved:
        if sv.unpack_hook is None:
            inputs.append(plain_array(sv))
        else:
            hooks.append(sv.unpack_hook)
            packed.append(sv.packed)


def _collect_root(args, roots, h):
    """Collect the root's part (``collect_roots``) into ``args``; returns the key's
    hash folded over it. It depends only on the root's input number and its
    gradient's dtype and shape: each such part is kept (``_root_parts``)."""
    ((_, nr), g), = roots
    if type(g) is not np.ndarray:
        g = np.asarray(g)
    where = (nr, g.dtype, g.shape)
    part = _root_parts.get(where)
    if part is None:
        scratch = CompiledNodeArgs(record=False)
        collect_roots(scratch, roots, _root_position)
        intern_fold(scratch.key, 0, 0)
        items = tuple(scratch.key)
        if len(_root_parts) > 256:
            _root_parts.clear()
        part = _root_parts[where] = (items, *hash_part(items))
    args.key.extend(part[0])
    args.sizes.extend(g.shape)
    return (h * part[1] + part[2]) % _M


# (input number, dtype, shape) of a root gradient -> (key items, hash part)
_root_parts: dict = {}


def _root_position(fn):
    """Where the root sits in the key: 0 nodes from the newest (it is the newest)."""
    return 0


def _compare(roots, args, key) -> None:
    """The ``CA_CHECK_KEY`` check: the walk's collection equals the segment's."""
    task = engine.make_task(roots, keep_graph=True, create_graph=False)
    walked = collect(task, roots, record=False)
    frozen = walked.freeze()
    if frozen == key and hash(frozen) != hash(key):
        raise AssertionError("forward-built key: equal to compiled_args' but hashed otherwise")
    if frozen != key:
        at = next((i for i, (a, b) in enumerate(zip(walked.key, key)) if a != b),
                  min(len(walked.key), len(key)))
        raise AssertionError(
            f"forward-built key differs from compiled_args at item {at}: "
            f"{key[at] if at < len(key) else None!r} != "
            f"{walked.key[at] if at < len(walked.key) else None!r}")
    for name in ("sizes", "scalars"):
        if getattr(walked, name) != getattr(args, name):
            raise AssertionError(f"forward-built key: its {name} differ from compiled_args'")
    inputs = SavedVariable.arrays(args.saved, False) + args.inputs if args.unread_saved \
        else args.inputs
    for name, b in (("inputs", inputs), ("saved", args.saved), ("hooks", args.hooks),
                    ("packed_data", args.packed_data)):
        a = getattr(walked, name)
        if len(a) != len(b) or any(x is not y for x, y in zip(a, b)):
            raise AssertionError(f"forward-built key: its {name} differ from compiled_args'")
