"""Autograd Nodes and the values they save: the backward graph a forward pass records.

``Node`` is the base: ``next_functions`` (one edge ``(node, input_nr)`` per input of
the forward op, None where no gradient flows), ``name()``, ``metadata``, and

- ``apply(grads)``: the eager backward of the node;
- ``compiled_args(args)``: collect everything the backward depends on (the cache key
  of compiled autograd): node type, non-tensor attributes, saved-tensor metadata;
- ``apply_with_saved(grads, saved)``: run the *same* derivative formula with each
  saved value swapped for what ``saved.before`` gives (a proxy, when tracing).

``PrimBackward`` is one class per differentiable prim (``MulBackward``, ...), made
from the prim table, so a derivative is written once, in prims, and serves both
``apply`` and ``apply_with_saved``.

``SavedVariable`` is a tensor a node saved for backward, with the version it had
when saved. As in torch: an input is saved as the original Tensor (no reference
cycle); an output of the node that saves it is saved as its data plus what is needed
to rebuild a Tensor whose grad_fn is that node (for double backward). On unpack the
version is checked, so an in-place change after saving fails loudly, naming the
versions.
"""
from __future__ import annotations

import itertools
import threading
import weakref

import numpy as np

from compiled_autograd.autograd import hooks
from compiled_autograd.autograd.saved_hooks import current_hooks, hooks_below
from compiled_autograd.autograd.tensor_base import TensorBase, type_name
from compiled_autograd.runtime import memory as _rt_memory
from compiled_autograd.runtime import slots
from compiled_autograd.runtime.memory import on_array
from compiled_autograd.runtime.prims import PRIMS, VJPContext, ops

_sequence = itertools.count()


class Node:
    """Base of every autograd node."""

    # Hooks and a custom Function's ctx attributes live in the instance __dict__.
    __slots__ = ("next_functions", "input_metadata", "_sequence_nr", "_metadata",
                 "__dict__", "__weakref__")

    # AccumulateGrad runs as soon as it is ready (torch gives it the top priority).
    _priority = 1
    accumulates_grad = False   # True for AccumulateGrad: its ``variable`` is a leaf
    user_code = False          # True where user code computes the gradients (checked)
    holds_only_collected = False   # True: compiled_args collects all it holds (collect_node)

    def __init__(self, next_functions, input_metadata):
        self.next_functions = tuple(next_functions)
        # (shape, dtype) of each gradient this node receives (= forward outputs).
        self.input_metadata = tuple(input_metadata)
        self._sequence_nr = next(_sequence)
        self._metadata = None

    def name(self) -> str:
        return type(self).__name__

    @property
    def metadata(self) -> dict:
        if self._metadata is None:
            self._metadata = {}
        return self._metadata

    def register_prehook(self, fn):
        """``fn(grad_outputs) -> new grad_outputs or None`` before the node runs."""
        return hooks.register_node_prehook(self, fn)

    def register_hook(self, fn):
        """``fn(grad_inputs, grad_outputs) -> new grad_inputs or None`` after it runs."""
        return hooks.register_node_hook(self, fn)

    def saved_variables(self):
        """The SavedVariables this node holds (for checks and release)."""
        return ()

    def check_saved(self) -> None:
        for sv in self.saved_variables():
            sv.check(self.name())

    def release_variables(self) -> None:
        for sv in self.saved_variables():
            sv.release()

    def static_needs(self):
        needs = self.__dict__.get("_static_needs")
        if needs is None:
            needs = self._static_needs = tuple(fn is not None for fn, _ in self.next_functions)
        return needs

    def apply(self, grads, needs=None):
        raise NotImplementedError(f"{self.name()}.apply")

    def compiled_args(self, args) -> None:
        raise NotImplementedError(f"{self.name()}.compiled_args")

    def apply_with_saved(self, grads, saved):
        raise NotImplementedError(f"{self.name()}.apply_with_saved")

    def __repr__(self):
        return f"<{self.name()} object at {id(self):#x}>"


class PrimBackward(Node):
    """The backward of one prim call. Subclassed once per prim (see node_class)."""

    prim = None  # set on each subclass
    holds_only_collected = True
    __slots__ = ("saved", "params", "shapes", "dtypes")

    def __init__(self, next_functions, input_metadata, saved, params, shapes, dtypes):
        super().__init__(next_functions, input_metadata)
        # saved: one entry per save-spec item: a SavedVariable, a Python scalar,
        # None (not needed), or a tuple of SavedVariables (the "tail" item).
        self.saved, self.params, self.shapes, self.dtypes = saved, params, shapes, dtypes

    def saved_variables(self):
        out = []
        for item in self.saved:
            if item.__class__ is tuple:
                out.extend(sv for sv in item if sv.__class__ is SavedVariable)
            elif item.__class__ is SavedVariable:
                out.append(item)
        return out

    def release_variables(self) -> None:
        for item in self.saved:
            if item.__class__ is SavedVariable:
                item.release()
            elif item.__class__ is tuple:
                for sv in item:
                    if sv.__class__ is SavedVariable:
                        sv.release()

    def _unpack(self, make):
        """The saved values: arrays (eager), or Tensors made by ``make`` (under
        create_graph, so that the formula records a differentiable graph)."""
        name = self.name()
        out = []
        for item in self.saved:
            if isinstance(item, tuple):
                out.append(tuple(sv.unpack(self, make) if make else sv.unpack_array(name)
                                 for sv in item))
            elif hasattr(item, "unpack_array"):
                out.append(item.unpack(self, make) if make else item.unpack_array(name))
            else:
                out.append(item)
        return tuple(out)

    def run_formula(self, grads, needs, saved_values):
        ctx = VJPContext(saved_values, self.params, self.shapes, self.dtypes, needs)
        out = self.prim.vjp(ctx, grads[0])
        # Mixed-dtype ops (float32 * float64): each gradient takes its input's dtype.
        for i, g in enumerate(out):
            if g is not None and g.dtype != self.dtypes[i]:
                out = out[:i] + (ops.astype(g, dtype=self.dtypes[i]),) + out[i + 1:]
        return out

    def apply(self, grads, needs=None):
        g = grads[0]
        make = g._make if type(g) is not np.ndarray else None   # create_graph: Tensors
        if needs is None:
            needs = self.static_needs()
        return self.run_formula(grads, needs, self._unpack(make))

    def compiled_args(self, args) -> None:
        # type, params (their ints as sizes), input sizes, dtypes, saved values;
        # saved Python floats are lifted into scalars, not keyed.
        args.collect_prim_node(self)

    def apply_with_saved(self, grads, saved):
        values = []
        for i, item in enumerate(self.saved):
            if isinstance(item, tuple):
                values.append(tuple(saved.before(sv) for sv in item))
            elif hasattr(item, "unpack_array"):
                values.append(saved.before(item))
            elif type(item) is float:
                values.append(saved.scalar((id(self), i), item))
            else:
                values.append(item)
        shapes = saved.sizes(self, self.shapes)
        params = saved.params(self, self.params)
        try:
            ctx = VJPContext(tuple(values), params, shapes, self.dtypes, saved.needs(self))
            out = self.prim.vjp(ctx, grads[0])
            return tuple(g if g is None or g.dtype == self.dtypes[i]
                         else ops.astype(g, dtype=self.dtypes[i]) for i, g in enumerate(out))
        finally:
            for item in self.saved:
                for sv in (item if isinstance(item, tuple) else (item,)):
                    if hasattr(sv, "unpack_array"):
                        saved.after(sv)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


NODE_CLASSES: dict[str, type] = {}


def node_class(prim) -> type:
    """The Node subclass for a prim, e.g. ``MulBackward`` for ``mul``."""
    cls = NODE_CLASSES.get(prim.name)
    if cls is None:
        cls = type(f"{_camel(prim.name)}Backward", (PrimBackward,),
                   {"prim": prim, "__module__": __name__,
                    "__doc__": f"Backward of the prim ``{prim.name}``."})
        NODE_CLASSES[prim.name] = cls
    return cls


for _p in PRIMS.values():
    if _p.differentiable:
        node_class(_p)


class AccumulateGrad(Node):
    """Sink of a leaf tensor: adds the incoming gradient into ``variable.grad``."""

    _priority = 0
    accumulates_grad = True
    holds_only_collected = True
    __slots__ = ("variable",)

    def __init__(self, variable):
        super().__init__((), ((variable.shape, variable.dtype),))
        self.variable = variable

    def apply(self, grads, needs=None):
        accumulate_into(self.variable, grads[0])
        return ()

    def compiled_args(self, args) -> None:
        args.collect_leaf(self.variable, type(self))

    def apply_with_saved(self, grads, saved):
        saved.accumulate_grad(self.variable, grads[0])
        return ()


def accumulate_into(variable, g, owned=False) -> None:
    """torch's AccumulateGrad: the first gradient is stored (a copy, since arrays
    flowing through the backward may be shared views, unless the caller ``owned``
    a fresh C-contiguous array nobody else holds); later ones are added in place,
    so ``.grad`` stays the same object. Under create_graph (Tensor gradients)
    accumulation is out of place and differentiable. Under the leaf's lock, as
    torch's: two threads' backwards may accumulate into one leaf at once."""
    lock = variable._grad_lock
    if lock is None:
        lock = _leaf_lock(variable)
    # (``with``: a KeyboardInterrupt landing between acquire() and a try would
    # leave the lock held, and the next backward into this leaf would hang)
    with lock:
        grad = variable._grad
        if type(g) is not np.ndarray:
            # A copy (differentiable): g may be shared with another leaf or be the
            # caller's own gradient tensor.
            variable._grad = ops.copy(g) if grad is None else grad + g
            return
        if grad is None:
            dtype = variable._data.dtype
            if owned and g.dtype == dtype and g.flags.c_contiguous:
                stored = g
            else:
                stored = np.array(g, dtype=dtype, order="C", copy=True)
                on_array(stored, "AccumulateGrad")
            variable._grad = variable._make(stored)
        elif grad.requires_grad:
            stored = np.add(grad._data, g)
            on_array(stored, "AccumulateGrad")
            variable._grad = variable._make(stored)
        else:
            np.add(grad._data, g, out=grad._data, casting="same_kind")
            grad._version_counter.bump()


def gradient_edge(t):
    """Where the gradient of ``t`` goes: (grad_fn, output_nr), the leaf's
    AccumulateGrad, or None when ``t`` does not require grad."""
    fn = t.grad_fn
    if fn is not None:
        return fn, t._output_nr
    if t._requires_grad:
        return grad_accumulator(t), 0
    return None, 0


# Makes a leaf's AccumulateGrad node and its accumulation lock, once each, whichever
# thread comes first (torch's autograd_meta mutex).
_leaf_state_lock = threading.Lock()


def _leaf_lock(variable):
    with _leaf_state_lock:
        if variable._grad_lock is None:
            variable._grad_lock = threading.Lock()
        return variable._grad_lock


def grad_accumulator(tensor) -> AccumulateGrad:
    """The (cached, weakly held) AccumulateGrad node of a leaf that requires grad:
    one node per leaf, even when threads' forwards ask for it at once."""
    ref = tensor._grad_acc_ref
    acc = ref() if ref is not None else None
    if acc is None:
        with _leaf_state_lock:
            ref = tensor._grad_acc_ref
            acc = ref() if ref is not None else None
            if acc is None:
                acc = AccumulateGrad(tensor)
                tensor._grad_acc_ref = weakref.ref(acc)
    return acc


class CopySlices(Node):
    """An in-place op on a view, seen from the base (torch's CopySlices; see the
    note "View + Inplace update for base tensor"). ``fn`` is the in-place op's
    node; the view is recovered from the base's gradient by its geometry
    (as_strided), and the gradient of the view's old value is written back."""

    def __init__(self, base_edge, base_meta, geometry, fn):
        super().__init__((base_edge,) + fn.next_functions[1:], (base_meta,))
        self.geometry = geometry  # dict(shape=, strides=, offset=) in base elements
        self.fn = fn

    def saved_variables(self):
        return self.fn.saved_variables()

    def _run(self, g, needs, call_fn, geometry=None):
        geometry = geometry or self.geometry
        view_grad = ops.as_strided(g, **geometry)
        # The view's old value needs a gradient exactly when the base's old value
        # does, whatever fn's own edge says (the note's exec_info point).
        fn_needs = (needs[0],) + tuple(needs[1:])
        res = call_fn(view_grad, fn_needs)
        grad_base = None
        if needs[0]:
            src = res[0] if res[0] is not None else ops.full_like(view_grad, value=0)
            grad_base = ops.as_strided_scatter(g, src, **geometry)
        return (grad_base,) + tuple(res[1:])

    def apply(self, grads, needs=None):
        if needs is None:
            needs = self.static_needs()
        return self._run(grads[0], needs, lambda vg, n: self.fn.apply([vg], n))

    def compiled_args(self, args) -> None:
        args.collect(type(self))
        args.collect_params(self.geometry, owner=self)
        self.fn.compiled_args(args)

    def apply_with_saved(self, grads, saved):
        geometry = saved.params(self, self.geometry)
        return self._run(grads[0], saved.needs(self),
                         lambda vg, n: self.fn.apply_with_saved([vg], saved.with_needs(n)),
                         geometry)


# ---------------------------------------------------------------- saved values
SECOND_BACKWARD_MSG = (
    "Trying to backward through the graph a second time (or directly access saved "
    "tensors after they have already been freed). Saved intermediate values of the "
    "graph are freed when you call .backward() or autograd.grad(). Specify "
    "retain_graph=True if you need to backward through the graph a second time or if "
    "you need to access saved tensors after calling backward.")


def checked_unpack(value, shape):
    """What an unpack hook returned, checked: a Tensor of the saved ``shape`` (None:
    any shape) -- eager's unpack and the compiled backward's."""
    if not isinstance(value, TensorBase):
        raise TypeError("Output of saved tensor unpack_hook expected to be a Tensor but "
                        f"got result of type {type(value).__name__}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise RuntimeError(f"saved tensor unpack_hook returned a tensor of shape "
                           f"{list(value.shape)}, but the saved tensor had shape {list(shape)}")
    return value


_PACK = object()  # "call the pack hook" (a memory plan's pack was called already)


class SavedVariable:
    """A saved tensor. Under saved-tensor hooks it holds ``pack(tensor)`` and the
    unpack hook instead of the tensor (PyTorch's SavedVariableHooks)."""

    __slots__ = ("_tensor", "_data", "_version_counter", "saved_version", "is_output",
                 "_requires_grad", "_output_nr", "_grad_fn_name", "released", "shape",
                 "dtype", "packed", "unpack_hook", "_grad_fn", "_leaf", "strides",
                 "packed_kind", "_tensor_ref")

    def __init__(self, tensor, is_output: bool, grad_fn_name: str | None = None):
        hooks = current_hooks()
        if hooks is not None:
            # A memory plan's pack (kind "recipe") saves the values it recomputes
            # as their recipes; every other value (None) goes to the hooks under
            # it, if any, or is saved as it is.
            packed = _PACK
            while hooks is not None and hooks[2] == "recipe":
                packed = hooks[0](tensor)
                if packed is not None:
                    break
                hooks, packed = hooks_below(hooks), _PACK
            if hooks is not None:
                self._init_hooked(tensor, is_output, hooks, packed)
                if self.packed_kind == "recipe":
                    self._init_recipe(tensor, is_output, grad_fn_name)
                return
        self.packed = self.unpack_hook = self._grad_fn = self._leaf = self.packed_kind = None
        self._tensor_ref = None
        if _rt_memory._trackers:
            _rt_memory.retag_saved(tensor._data)
        self._version_counter = tensor._version_counter
        self.saved_version = self._version_counter.value
        self.is_output = is_output
        self.shape = tensor.shape
        self.dtype = tensor.dtype
        self.released = False
        self._output_nr = tensor._output_nr
        self._grad_fn_name = grad_fn_name
        # (What the unpacked value's requires_grad is, kept for a compiled
        # backward's unpack, which happens after the value was released.)
        self._requires_grad = tensor.requires_grad
        if is_output and tensor._grad_fn is not None:
            # Saving the output Tensor itself would make node -> tensor -> node.
            self._tensor = None
            self._data = tensor._data
        else:
            self._tensor = tensor
            self._data = None

    def _init_recipe(self, tensor, is_output, grad_fn_name):
        """A value saved as its recipe (a memory plan) is what the tensor holds
        now: as a value saved as it is, it must not be modified in place before
        the backward (the recipe would make the old value, the run without the
        plan would fail). Its version is checked; the tensor is not kept (its
        storage is what the plan frees), only a weak reference for the message."""
        self._version_counter = tensor._version_counter
        self.saved_version = tensor._version_counter.value
        self._grad_fn_name = grad_fn_name
        self._tensor_ref = (None if is_output and tensor._grad_fn is not None
                            else weakref.ref(tensor))

    def _init_hooked(self, tensor, is_output, hooks, packed=_PACK):
        pack, unpack, self.packed_kind = hooks
        self._tensor_ref = None
        self.shape, self.dtype = tensor.shape, tensor.dtype
        self._requires_grad = tensor.requires_grad
        # The layout the value had (bytes): a recomputation gives it again, so
        # compiled code may read the unpacked value in place (compiled_autograd.codegen.c).
        self.strides = tensor._data.strides
        self.is_output = is_output
        self.released = False
        self._output_nr = tensor._output_nr
        # The edge to restore on unpack; an output's grad_fn is the owner node
        # (given at unpack), so only an input's is kept (no reference cycle). A
        # leaf that requires grad is kept itself: its AccumulateGrad is fetched at
        # unpack (leaves are normally alive anyway: parameters, user inputs).
        self._grad_fn = None if is_output else tensor._grad_fn
        self._leaf = tensor if (not is_output and tensor._grad_fn is None
                                and tensor._requires_grad) else None
        self._tensor = self._data = None
        self._version_counter = None
        version = tensor._version_counter.value
        self.packed = pack(tensor) if packed is _PACK else packed  # once per save
        if tensor._version_counter.value != version:
            raise RuntimeError(
                "A saved tensor pack hook is modifying its input in place. Tensors provided "
                "as input to pack hook cannot be modified by in-place operations as this can "
                "lead to unexpected side-effects. Please open an issue if you need to perform "
                "in-place operations on the input to a pack hook.")
        self.unpack_hook = unpack

    def _call_unpack_hook(self):
        return checked_unpack(self.unpack_hook(self.packed), self.shape)

    def check(self, node_name: str) -> None:
        """Raise the torch error if this value was freed or modified in place."""
        if self.released:
            raise RuntimeError(SECOND_BACKWARD_MSG)
        if self.unpack_hook is not None and self.packed_kind != "recipe":
            return  # the hooks own the value: no version to check (as torch)
        self.check_version(node_name)

    def check_version(self, node_name: str, origin: str | None = None) -> None:
        """Raise the torch error if this value was modified in place (also once
        released: a compiled backward's check after a call into Python)."""
        if (current := self._version_counter.value) != self.saved_version:
            origin = self.origin(node_name) if origin is None else origin
            dims = ", ".join(str(d) for d in self.shape)
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified "
                f"by an inplace operation: [{type_name(self.dtype)} [{dims}]]{origin} is "
                f"at version {current}; expected version {self.saved_version} instead. "
                "Hint: the backward of " + node_name + " needs this value; do the "
                "in-place operation on a clone, or after the backward.")

    def origin(self, node_name: str) -> str:
        """How the error names the value: ", which is output k of <node>," or ""."""
        tensor = self._tensor
        if self.packed_kind == "recipe":   # (as the value saved as it is would say)
            tensor = self._tensor_ref() if self._tensor_ref is not None else None
        if tensor is not None and tensor._grad_fn is not None:
            return f", which is output {self._output_nr} of {tensor._grad_fn.name()},"
        if tensor is None and (self.packed_kind != "recipe" or self._tensor_ref is None):
            return f", which is output {self._output_nr} of {node_name},"
        return ""

    def unpack_array(self, node_name: str):
        """The saved value as an ndarray (the eager engine's fast path)."""
        self.check(node_name)
        if self.unpack_hook is not None:
            return self._call_unpack_hook()._data
        return plain_array(self)

    def unpack(self, owner, make):
        """The saved value as a Tensor; an output gets ``owner`` as its grad_fn.
        ``make``: Tensor._make (a tensor's; this layer is below Tensor)."""
        self.check(owner.name())
        if self.unpack_hook is not None:
            value = self._call_unpack_hook()
            grad_fn = owner if self.is_output else self._edge_fn()
            if grad_fn is None:
                return value
            t = value._make(value._data)
            t._grad_fn, t._output_nr = grad_fn, self._output_nr
            return t
        if self._tensor is not None:
            return self._tensor
        t = make(self._data)
        t._version_counter = self._version_counter
        t._grad_fn = owner
        t._output_nr = self._output_nr
        return t

    def _edge_fn(self):
        """The node gradients of the unpacked value flow to (under hooks)."""
        if self._leaf is not None:
            return grad_accumulator(self._leaf)
        return self._grad_fn

    def unpack_input(self, context: str):
        """A saved *input* (not an output) as a Tensor, outside any node."""
        self.check(context)
        if self.unpack_hook is not None:
            value = self._call_unpack_hook()
            grad_fn = self._edge_fn()
            if grad_fn is not None:
                t = value._make(value._data)
                t._grad_fn, t._output_nr = grad_fn, self._output_nr
                return t
            return value
        return self._tensor

    def release(self) -> None:
        self._tensor = self._data = self._tensor_ref = None
        self.packed = self.unpack_hook = self._grad_fn = self._leaf = None
        self.released = True

    @staticmethod
    def arrays(saved, release: bool) -> list:
        """The arrays of ``saved`` (values saved without hooks: ``plain_array``)
        and, with ``release``, ``release`` of each (their other fields are None
        already): a compiled backward's hand-over of its saved values. One C pass
        where it is built (runtime/slots.c); this loop is the reference."""
        if not _reader:     # (made at the first call: it may build the extension)
            _reader.append(slots.reader(SavedVariable._tensor, SavedVariable._data,
                                        SavedVariable.released, TensorBase._data))
        read = _reader[0]
        if read is not None:
            try:
                return read(saved, release)
            except LookupError:     # (released since it was collected: another thread)
                raise RuntimeError(SECOND_BACKWARD_MSG) from None
        arrays = []
        for sv in saved:        # (each read, then released, in turn)
            if sv.released:
                raise RuntimeError(SECOND_BACKWARD_MSG)
            arrays.append(plain_array(sv))
            if release:
                sv._tensor = sv._data = None
                sv.released = True
        return arrays


def plain_array(sv):
    """The array a value saved without hooks holds: its own (an output) or its
    tensor's (an input)."""
    return sv._data if sv._tensor is None else sv._tensor._data


_reader: list = []     # [compiled_autograd.runtime.slots' Reader, or None]: made once (CA_C_SLOTS read then)
