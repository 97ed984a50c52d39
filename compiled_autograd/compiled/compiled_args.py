"""The two objects of the compiled-autograd Node contract (PyTorch's names).

``CompiledNodeArgs`` is what ``Node.compiled_args(args)`` writes into. It collects,
node by node in walk order, (1) the *key* of the backward -- node types, non-tensor
attributes, sizes, saved-tensor metadata, edges, hook kinds -- and (2) the *runtime
values* the compiled graph will take in its boxed lists: saved arrays and leaf
tensors (``inputs``), hook callables (``hooks``), packed data of saved-tensor hooks
(``packed_data``). A cache hit needs only this collection: no tracing.

``SwapSavedVariables`` is what ``Node.apply_with_saved(grads, saved)`` reads from:
``before(sv)`` gives the value to use in place of a saved variable, ``after(sv)``
ends that use, ``needs(node)`` says which input gradients to compute. This base
class swaps each saved variable for its own unpacked value, so ``apply_with_saved``
equals ``apply``; the tracer's subclass swaps in graph proxies.
"""
from __future__ import annotations

import contextlib

import numpy as np

from compiled_autograd.autograd.node import SavedVariable, accumulate_into
from compiled_autograd.compiled import native_walk
from runtime.prims import index_param_names


class CompiledNodeArgs:
    """Key and runtime values of a backward, collected in walk order."""

    def __init__(self, record: bool = True):
        self.key: list = []
        self.saved: list = []            # SavedVariables, in collection order
        self.inputs: list = []           # runtime values taken by getitem(inputs, i)
        self.hooks: list = []            # hook callables
        self.packed_data: list = []      # packed objects of saved-tensor hooks
        self.sizes: list = []            # every collected size, flat
        self.scalars: list = []          # lifted Python floats
        self.release_nodes: list = []    # running nodes that are not prim nodes
        # ``record``: also note where each owner's values sit, for the tracer. A
        # cache hit needs only the key and the values, so it collects without.
        self.record = record
        self.slot: dict = {}             # id(obj) -> where its runtime value sits
        # Where each owner's sizes start in ``sizes`` (owner: id of a node, saved
        # variable, leaf or tensor; or ("root", i)), a node's int params, its scalars.
        self.size_pos: dict = {}
        self.param_pos: dict = {}
        self.scalar_pos: dict = {}
        self.node = None                 # the node being collected (for error messages)
        self.uncacheable_reason = None   # set when the trace must not be reused

    # ---------------------------------------------------------- key only

    def collect(self, value) -> None:
        """A non-tensor attribute (type, dims, scalars, flags, dtypes)."""
        self.key.append(value)

    def collect_sizes(self, shapes, owner=None) -> None:
        """Tensor sizes. Their number is part of the key, their values are not: the
        cache compares the values, so a size that changes can become dynamic.
        ``owner`` (a node, a saved variable, ...) lets the tracer find them again."""
        if owner is not None and self.record:
            self.size_pos[owner if owner.__class__ is tuple else id(owner)] = len(self.sizes)
        ndims = []
        for s in shapes:
            if s is None:
                ndims.append(None)
            else:
                ndims.append(len(s))
                self.sizes.extend(s)  # numpy shapes: tuples of Python ints
        self.key.append(("sizes", tuple(ndims)))

    def collect_params(self, params, owner) -> None:
        """A prim's static params. Their ints (shape arguments, dims, offsets) are
        collected as sizes -- compared, and made dynamic if they change -- and the
        rest (flags, dtypes, strings, floats) is part of the key."""
        split = _params_split(params)
        self.key.append(split[0])
        if self.record:
            self.param_pos[id(owner)] = len(self.sizes)
        self.sizes.extend(split[1])

    def collect_prim_node(self, node) -> None:
        """Everything a prim's backward node depends on, as one key item (the hot
        path of a cache hit): type, params (ints as sizes), input sizes, dtypes,
        saved values (Python floats lifted into scalars)."""
        sizes, record = self.sizes, self.record
        split = _params_split(node.params) if node.params else _NO_PARAMS
        if record:
            self.param_pos[id(node)] = len(sizes)
        sizes.extend(split[1])
        if record:
            self.size_pos[id(node)] = len(sizes)
        ndims = []
        for shape in node.shapes:
            if shape is None:
                ndims.append(None)
            else:
                ndims.append(len(shape))
                sizes.extend(shape)
        saved = []
        for i, item in enumerate(node.saved):
            cls = item.__class__
            if cls is SavedVariable:
                saved.append(self._saved(item))
            elif cls is tuple:
                saved.append(tuple([self._saved(sv) for sv in item]))
            elif cls is float:
                if record:
                    self.scalar_pos[(id(node), i)] = len(self.scalars)
                self.scalars.append(item)
                saved.append("scalar")
            else:
                saved.append(item)
        self.key.append((type(node), split[0], tuple(ndims), node.dtypes, tuple(saved)))

    # ---------------------------------------------------------- runtime values

    def collect_saved(self, sv) -> None:
        """A saved variable: its metadata is part of the key, its value is a runtime
        input -- an array, or (under saved-tensor hooks) its unpack hook and packed
        data. Checked here (freed? modified in place?) as eager checks up front."""
        self.key.append(("saved",) + self._saved(sv))

    def _saved(self, sv) -> tuple:
        """Collect a saved variable's value; return its key item."""
        hooked = sv.unpack_hook is not None
        if sv.released or (not hooked and sv._version_counter.value != sv.saved_version):
            sv.check(self.node.name() if self.node is not None else "backward")  # raises
        shape = sv.shape
        if self.record:
            self.size_pos[id(sv)] = len(self.sizes)
            self.slot[id(sv)] = (("hooked", len(self.hooks), len(self.packed_data)) if hooked
                                 else ("inputs", len(self.inputs)))
        self.sizes.extend(shape)
        self.saved.append(sv)
        if hooked:
            self.hooks.append(sv.unpack_hook)
            self.packed_data.append(sv.packed)
        else:
            self.inputs.append(sv._data if sv._tensor is None else sv._tensor._data)
        return (sv.dtype, hooked, len(shape))

    def collect_leaf(self, variable, node_type=None) -> None:
        """The leaf Tensor an AccumulateGrad writes into (and, as one key item, the
        node's type)."""
        shape = variable._data.shape
        self.key.append((node_type, "leaf", variable._data.dtype, len(shape)))
        if self.record:
            self.size_pos[id(variable)] = len(self.sizes)
            self.slot[id(variable)] = ("inputs", len(self.inputs))
        self.sizes.extend(shape)
        self.inputs.append(variable)

    def collect_tensor(self, tensor) -> None:
        """A Tensor a node's backward reads that is not a saved variable (a custom
        Function's ctx attribute)."""
        self.key.append(("tensor", tensor.dtype))
        where = ("tensor", id(tensor))   # (not id(tensor): the same Tensor may be a leaf)
        self.collect_sizes((tensor.shape,), owner=where)
        if self.record:
            self.slot[where] = ("inputs", len(self.inputs))
        self.inputs.append(tensor._data)

    def collect_hook(self, kind, nr, hook) -> None:
        """A user hook: its kind and position are the key; the callable is an input."""
        self.key.append(("hook", kind, nr))
        if self.record:
            self.slot.setdefault(("hook", id(hook)), []).append(len(self.hooks))
        self.hooks.append(hook)

    def uncacheable(self, reason) -> None:
        """This backward depends on something that cannot be keyed: trace it anew."""
        self.uncacheable_reason = self.uncacheable_reason or reason

    def freeze(self) -> "Key":
        return Key(self.key)


class Key(tuple):
    """A cache key: the tuple of key items, equal to and hashed as that plain tuple.
    Its hash is native_walk.key_hash when the C walk is loaded: the same number as
    tuple.__hash__, with the hash of every shared item (the C walk's tuples, the
    same objects at every hit) computed once instead of at every hit. Like any
    dict key, it assumes its items' hashes never change (types, dtypes, numbers,
    strings and tuples of them)."""
    __slots__ = ()

    def __hash__(self):
        walk = native_walk.loaded()
        return walk.key_hash(self) if walk is not None else tuple.__hash__(self)


_PARAM_SPLITS: dict = {}   # params items -> (key item, ints): params repeat a lot
_NO_PARAMS = (("params", ()), ())


def _params_split(params):
    items = tuple(params.items())
    split = _PARAM_SPLITS.get(items)
    if split is None:
        split = _PARAM_SPLITS[items] = _split_params(params)
    return split


# Params that index dims: part of the key by value, never symbolic sizes (each
# prim's table entry names its own: ``index_params``).
_INDEX_PARAMS = index_param_names()


def _split_params(params):
    ints = []

    def skeleton(v):
        if type(v) is int or isinstance(v, np.integer):
            ints.append(int(v))
            return "#"
        if isinstance(v, tuple):
            return tuple(skeleton(x) for x in v)
        return v
    items = tuple(sorted(params.items()))
    return ("params", tuple((k, v if k in _INDEX_PARAMS else skeleton(v))
                            for k, v in items)), tuple(ints)


class SwapSavedVariables:
    """Eager swapping: each saved variable stands for its own unpacked array."""

    def __init__(self, needs_override=None):
        self._needs = needs_override

    def before(self, sv):
        return sv.unpack_array("apply_with_saved")

    def after(self, sv) -> None:
        pass

    def lifted(self, tensor):
        """The value to use for a Tensor attribute of a node (see collect_tensor)."""
        return tensor

    def sizes(self, owner, shapes):
        """The shapes a node's formula sees (symbolic where sizes are dynamic)."""
        return shapes

    def user_code(self):
        """A context for running user code (a custom Function's backward): what it
        reads of a traced shape is specialised (TraceSwap)."""
        return contextlib.nullcontext()

    def scalar(self, owner, value):
        """The value a node's formula sees for a saved Python float."""
        return value

    def params(self, owner, params):
        """The params a node's formula sees (ints symbolic where dynamic)."""
        return params

    def needs(self, node):
        return self._needs if self._needs is not None else node.static_needs()

    def with_needs(self, needs):
        return type(self)(needs)

    def accumulate_grad(self, variable, grad) -> None:
        accumulate_into(variable, grad)
