"""The two objects of the compiled-autograd Node contract (PyTorch's names).
``collection.collect`` walks the graph and has every node write into the first.

``CompiledNodeArgs`` is what ``Node.compiled_args(args)`` writes into. It collects,
node by node in that order, (1) the *key* of the backward -- node types, non-tensor
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
from compiled_autograd.autograd.recipe import Kept, Recipe, check_backend
from compiled_autograd.runtime.prims import index_param_names


class CompiledNodeArgs:
    """Key and runtime values of a backward, collected in walk order."""

    def __init__(self, record: bool = True):
        self.key: list = []
        self.saved: list = []            # SavedVariables, in collection order
        # The values saved without hooks: their arrays come first in the boxed
        # ``inputs``, read (and released) at the hand-over in one pass
        # (``runtime_inputs``); slot ("saved", i).
        self.plain: list = []
        self.inputs: list = []           # the other runtime values; slot ("inputs", j)
        self.hooks: list = []            # hook callables
        self.packed_data: list = []      # packed objects of saved-tensor hooks
        self.sizes: list = []            # every collected size, flat
        self.scalars: list = []          # lifted Python floats
        self.release_nodes: list = []    # running nodes that are not prim nodes
        self.traced_hooks: set = set()   # ids of hooks traced into the graph (see collect_hook)
        # What traced hooks do besides their graph, run once the compiled backward
        # has run (a parameter's version bump): never at collection, which a
        # backward may repeat, or follow by running eagerly instead.
        self.after_run: list = []
        self.memo: dict = {}             # what a traced hook computes once per backward
        # ``record``: also note where each owner's values sit, for the tracer. A
        # cache hit needs only the key and the values, so it collects without.
        self.record = record
        self.slot: dict = {}             # id(obj) -> where its runtime value sits
        # Where each owner's sizes start in ``sizes`` (owner: id of a node, saved
        # variable, leaf or tensor; or ("root", i)), a node's int params, its scalars.
        self.size_pos: dict = {}
        self.param_pos: dict = {}
        self.scalar_pos: dict = {}
        self.shared_scalars: dict = {}   # owner -> position (collect_scalar)
        self.recipes: dict = {}          # id(Recipe) -> its number in this backward
        self.recipe_objects: list = []   # the Recipes numbered
        self.kept: dict = {}             # id(kept array) -> its slot in inputs
        self.kept_versions: list = []    # each kept array's KeptVersion, in that order
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
        shapes = tuple(shapes)    # (numpy shapes: tuples of Python ints; or None)
        split = _SHAPE_SPLITS.get(shapes)
        if split is None:
            split = _shape_split(shapes)
        self.sizes.extend(split[1])
        self.key.append(("sizes", split[0]))

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
        shapes = node.shapes
        split_shapes = _SHAPE_SPLITS.get(shapes)
        if split_shapes is None:
            split_shapes = _shape_split(shapes)
        sizes.extend(split_shapes[1])
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
        self.key.append((type(node), split[0], split_shapes[0], node.dtypes, tuple(saved)))

    # ---------------------------------------------------------- runtime values

    def collect_saved(self, sv) -> None:
        """A saved variable: its metadata is part of the key, its value is a runtime
        input -- an array, or (under saved-tensor hooks) its unpack hook and packed
        data. Checked here (freed? modified in place?) as eager checks up front."""
        self.key.append(("saved",) + self._saved(sv))

    def _saved(self, sv) -> tuple:
        """Collect a saved variable's value; return its key item."""
        if sv.packed_kind == "recipe" and not sv.released:
            if sv._version_counter.value != sv.saved_version:
                sv.check(self.node.name() if self.node is not None else "backward")  # raises
            self.saved.append(sv)
            return ("recipe", self._recipe(sv.packed))
        hooked = sv.unpack_hook is not None
        if sv.released or (not hooked and sv._version_counter.value != sv.saved_version):
            sv.check(self.node.name() if self.node is not None else "backward")  # raises
        shape = sv.shape
        if self.record:
            self.size_pos[id(sv)] = len(self.sizes)
            self.slot[id(sv)] = (("hooked", len(self.hooks), len(self.packed_data)) if hooked
                                 else ("saved", len(self.plain)))
        self.sizes.extend(shape)
        self.saved.append(sv)
        if hooked:
            self.hooks.append(sv.unpack_hook)
            self.packed_data.append(sv.packed)
        else:
            self.plain.append(sv)
        return (sv.dtype, hooked, len(shape))

    def _recipe(self, recipe) -> tuple:
        """A value saved as its recipe (``autograd.recipe``): the recipe's shape --
        prims, params, static sizes, which recipes and kept arrays it shares with
        the ones collected before -- is the key item; its kept arrays are runtime
        inputs, checked (version) as saved values are."""
        seen = self.recipes.get(id(recipe))
        if seen is not None:
            return ("seen", seen)
        check_backend(recipe, compiled=True)   # (a plan's recipes run where it was made)
        items = []
        for a in recipe.inputs:
            if type(a) is Recipe:
                items.append(self._recipe(a))
            elif type(a) is Kept:
                a.read(recipe)  # raises if it was modified in place
                slot = self.kept.get(id(a.data))
                if slot is None:
                    slot = self.kept[id(a.data)] = ("inputs", len(self.inputs))
                    if self.record:
                        self.slot[("kept", id(a.data))] = slot
                        self.slot[("kept version", id(a.data))] = len(self.kept_versions)
                    self.inputs.append(a.data)
                    self.kept_versions.append(a.version_check())
                items.append(("kept", slot[1], a.data.dtype, a.data.shape))
            else:
                items.append(a)
        self.recipes[id(recipe)] = len(self.recipes)
        self.recipe_objects.append(recipe)  # (alive while ids are keys)
        return (recipe.prim.name, tuple(sorted(recipe.params.items())), recipe.shape,
                recipe.dtype, tuple(items))

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

    def collect_arrays(self, arrays, what, tensors=None) -> None:
        """The arrays of ``tensors`` (a traced hook's parameter and state), runtime
        inputs, as ``collect_tensor`` collects each, in one key item: ``what`` (a
        tuple), then each one's dtype and number of dimensions. ``tensors`` (their
        owners, in the same order) only when recording."""
        sizes, inputs = self.sizes, self.inputs
        if tensors is not None:
            for tensor in tensors:
                where = ("tensor", id(tensor))
                self.size_pos[where] = len(sizes)
                self.slot[where] = ("inputs", len(inputs))
                sizes += tensor._data.shape
                inputs.append(tensor._data)
        else:
            inputs += arrays
        item = list(what)
        for data in arrays:
            shape = data.shape
            if tensors is None:
                sizes += shape
            item += (data.dtype, len(shape))
        self.key.append(tuple(item))

    def collect_scalar(self, owner, value) -> int:
        """A Python float lifted into the runtime ``scalars`` (a traced hook's
        learning rate): a new value is not a new graph; ``owner`` finds it again.
        Returns its position, which an owner collected before in this backward
        shares (the caller puts the position in the key: a group's learning rate,
        one scalar for all its parameters)."""
        pos = self.shared_scalars.get(owner)
        if pos is None:
            pos = self.shared_scalars[owner] = len(self.scalars)
            if self.record:
                self.scalar_pos[owner] = pos
            self.scalars.append(float(value))
        return pos

    def collect_hook(self, kind, nr, hook, variable=None) -> bool:
        """A user hook: its kind and position are the key; the callable is an input.

        A post-accumulate-grad hook that is *traceable* (it has ``compiled_args``
        and ``apply_with_saved``, as a node has: ``ca.optim.in_backward``'s update)
        is asked first: ``hook.compiled_args(args, variable)`` collects what its
        graph depends on and returns True, and the tracer then records its
        ``apply_with_saved`` (prims and ``store`` nodes) in place of a call; or it
        returns False (collecting nothing), and it is called as Python. Returns
        whether it is traced."""
        if kind == "post_acc_grad_hook" and hasattr(hook, "apply_with_saved"):
            if hook.compiled_args(self, variable):
                self.key.append(("traced_hook", kind, nr))
                if self.record:
                    self.traced_hooks.add(id(hook))
                return True
        self.key.append(("hook", kind, nr))
        if self.record:
            self.slot.setdefault(("hook", id(hook)), []).append(len(self.hooks))
        self.hooks.append(hook)
        return False

    def uncacheable(self, reason) -> None:
        """This backward depends on something that cannot be keyed: trace it anew."""
        self.uncacheable_reason = self.uncacheable_reason or reason

    def runtime_inputs(self, release: bool) -> list:
        """The boxed ``inputs`` after the roots' gradients: the arrays of the values
        saved without hooks, then the other runtime values; with ``release``, each
        of those saved values is released as its array is read (one C pass,
        ``SavedVariable.arrays``), so that the boxed list becomes their owner."""
        return SavedVariable.arrays(self.plain, release) + self.inputs

    def clear(self) -> None:
        """Let go of the runtime values (a backward that will not use them)."""
        for values in (self.saved, self.plain, self.inputs, self.hooks, self.packed_data,
                       self.release_nodes, self.recipe_objects, self.recipes, self.kept,
                       self.kept_versions,
                       self.after_run):
            values.clear()

    def freeze(self) -> tuple:
        """The cache key: the key items as one tuple (hashed and compared in C)."""
        return tuple(self.key)


_SHAPE_SPLITS: dict = {}   # a node's input shapes -> (ndims, their sizes flat): they repeat


def _shape_split(shapes):
    ndims, flat = [], []
    for shape in shapes:
        if shape is None:
            ndims.append(None)
        else:
            ndims.append(len(shape))
            flat.extend(shape)
    if len(_SHAPE_SPLITS) > 100_000:
        _SHAPE_SPLITS.clear()
    split = _SHAPE_SPLITS[shapes] = (tuple(ndims), tuple(flat))
    return split


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
INDEX_PARAMS = index_param_names()


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
    return ("params", tuple((k, v if k in INDEX_PARAMS else skeleton(v))
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

    def inlined(self, node, trace):
        """``trace()``: a custom Function's backward run on these values (it
        declared itself traceable, ``inline_backward``). The tracer's subclass
        returns None when that fails, and the node calls the backward instead."""
        return trace()

    def call_backward(self, node, values, grads):
        """A custom Function's backward run as Python on ``values`` (its saved
        values, as ``before`` gave them): here at once, in the tracer as a
        ``call_backward`` node."""
        return node.backward_with(values, grads)

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
