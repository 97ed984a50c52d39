"""Custom ops: ``ca.autograd.Function`` (torch.autograd.Function's contract).

``MyFn.apply(*args)`` runs the static ``forward(ctx, *args)`` without recording
history, then, if any Tensor argument requires grad, makes the outputs depend on one
node, ``MyFnBackward``, whose ``apply`` calls the user's static
``backward(ctx, *grads)``. The node *is* the ctx, as in torch (and it is the analogue
of torch's PyNode: a Node that forwards ``apply`` to Python code). One node class per
Function class, made when the class is defined.
"""
from __future__ import annotations

import contextlib

import numpy as np

from compiled_autograd.autograd import dispatch
from compiled_autograd.autograd.dispatch import make_view
from compiled_autograd.autograd.engine import validate
from compiled_autograd.autograd.grad_mode import is_grad_enabled, no_grad
from compiled_autograd.autograd.node import Node, SavedVariable, gradient_edge
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.runtime import memory
from compiled_autograd.runtime.memory import on_array
from compiled_autograd.runtime.prims import ops

# Attributes of the node itself that may be set on its __dict__; anything else
# there not starting with "_" is the user's.
_NODE_ATTRS = {"user_code"}


class FunctionBackward(Node):
    """The backward node (and ctx) of a custom Function."""

    # The ctx's own state lives in slots: its __dict__ holds the user's attributes
    # (and hooks), which compiled_args scans at every backward.
    __slots__ = ("needs_input_grad", "materialize_grads", "_to_save", "_saved", "_saved_nones",
                 "_swapped", "_non_differentiable", "_tensor_inputs")
    _forward_cls = None
    user_code = True  # its gradients are validated like a hook's
    holds_only_collected = True   # (compiled_args collects every saved value)

    def _start(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.materialize_grads = True
        self._to_save = ()
        self._saved = None
        self._saved_nones = ()      # which saved values are None (a key item)
        self._swapped = None
        self._non_differentiable = set()

    # ---------------------------------------------------------- ctx API

    def save_for_backward(self, *tensors):
        """Save Tensors (or None) for backward; read them with ``saved_tensors``."""
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError("save_for_backward can only save variables, but argument "
                                f"{tensors.index(t)} is of type {type(t).__name__}")
        self._to_save = tensors

    @property
    def saved_tensors(self):
        if self._swapped is not None:
            return self._swapped
        if self._saved is None:
            return tuple(self._to_save)  # inside forward
        return tuple(None if sv is None else sv.unpack(self, Tensor._make) for sv in self._saved)

    def mark_non_differentiable(self, *tensors):
        self._non_differentiable.update(id(t) for t in tensors)

    def set_materialize_grads(self, value: bool):
        self.materialize_grads = bool(value)

    # ---------------------------------------------------------- Node API

    def saved_variables(self):
        return [sv for sv in (self._saved or ()) if sv is not None]

    def _grads_in(self, grads, shapes=None):
        """Engine gradients -> the Tensors the user's backward receives. A missing
        one is zeros (materialize_grads); ``shapes``, the tracer's (symbolic where
        dynamic), makes them a graph value of that shape."""
        like = next((g for g in grads if g is not None), None)
        out = []
        for i, (g, meta) in enumerate(zip(grads, self.input_metadata)):
            if g is None and self.materialize_grads and meta is not None:
                if shapes is not None and like is not None:
                    g = ops.full_like(like, value=0, shape=shapes[i], dtype=meta[1])
                else:
                    g = np.zeros(*meta)
                    on_array(g, "materialized_grad")
            out.append(g if g is None or isinstance(g, Tensor) else Tensor._make(g))
        return out

    def _output_shapes(self):
        return [None if m is None else m[0] for m in self.input_metadata]

    def _grads_out(self, result, keep_tensors):
        """The user's returned gradients -> one per forward argument."""
        if not isinstance(result, tuple):
            result = (result,)
        edges = self.next_functions
        n = len(edges)
        if len(result) != n:
            if len(result) < n or any(r is not None for r in result[n:]):
                raise RuntimeError(f"function {self.name()} returned an incorrect number of "
                                   f"gradients (expected {n}, got {len(result)})")
            result = result[:n]
        out = []
        for (fn, _), r, tensor_input in zip(edges, result, self._tensor_inputs):
            if r is not None and not tensor_input:
                raise RuntimeError(f"function {self.name()} returned a gradient different than "
                                   f"None at position {len(out) + 1}, but the corresponding "
                                   "forward input was not a Variable")
            if fn is None or r is None:
                out.append(None)
                continue
            if not isinstance(r, Tensor):
                raise TypeError(f"function {self.name()} returned a gradient of type "
                                f"{type(r).__name__}, expected a Tensor or None")
            out.append(r if keep_tensors else r._data)
        return tuple(out)

    def apply(self, grads, needs=None):
        create_graph = any(isinstance(g, Tensor) for g in grads)
        result = self._forward_cls.backward(self, *self._grads_in(grads))
        out = self._grads_out(result, keep_tensors=create_graph)
        # Which gradients it returned as None: a compiled backward's graph is
        # traced with them (compiled.api runs a structure's first backward eagerly).
        self._returned_none = tuple(g is None for g in out)
        return out

    # ---------------------------------------------------------- compiled autograd
    #
    # By default the user's backward stays Python: the compiled graph gets one
    # ``call_backward`` node that calls it at run time (``backward_with``), with
    # the saved values the graph unpacked. A Function whose class says
    # ``inline_backward = True`` is traced into prims instead (``_traced``),
    # falling back to the node when that fails.

    def compiled_args(self, args) -> None:
        cls = self._forward_cls
        # The class (by identity), its flags, which saved values are None: the
        # node's first key item, led by the class (cache.miss_reason names a node
        # by its first item's type).
        head = (cls, self.needs_input_grad, self.materialize_grads, self._saved_nones)
        attrs = self._user_attrs()
        inline = cls.inline_backward
        if not inline:
            # Which gradients a backward returns as None is traced into its graph
            # (compiled.api learns it); a flag on ctx often decides it: key them.
            args.collect(head + tuple([(k, v) for k, v in attrs
                                       if v is None or v.__class__ is bool]) if attrs else head)
        else:
            args.collect(head)
        args.collect_hook("call_backward", None, self)   # the ctx the node calls with
        if inline:
            args.collect_sizes(self._output_shapes(), owner=self)
            for key, value in attrs:
                # What a traced backward reads from ctx is baked into the graph:
                # key it by value.
                args.collect((key, _freeze(value, args)))
        for sv in self._saved or ():
            if sv is not None:
                args.collect_saved(sv)

    def _user_attrs(self):
        """The user's attributes on ctx, sorted: (name, value) pairs."""
        d = self.__dict__
        if not d:       # (the common case: ctx's own state is in slots)
            return []
        attrs = [(k, v) for k, v in d.items() if k[:1] != "_" and k not in _NODE_ATTRS]
        if len(attrs) > 1:
            attrs.sort()
        return attrs

    def apply_with_saved(self, grads, saved):
        if self._forward_cls.inline_backward:
            result = saved.inlined(self, lambda: self._traced(grads, saved))
            if result is not None:
                return result
        values = [None if sv is None else saved.before(sv) for sv in (self._saved or ())]
        try:
            return saved.call_backward(self, values, grads)
        finally:
            for sv in self.saved_variables():
                saved.after(sv)

    def _traced(self, grads, saved):
        """The user's backward run on ``saved``'s values (graph proxies when
        tracing): its tensor operations are what the graph records."""
        self._swapped = tuple(None if sv is None else saved.before(sv)
                              for sv in (self._saved or ()))
        originals = dict(self._user_attrs())
        for k, v in originals.items():
            self.__dict__[k] = _lift(v, saved)
        try:
            grads_in = self._grads_in(grads, saved.sizes(self, self._output_shapes()))
            with saved.user_code():
                result = self._forward_cls.backward(self, *grads_in)
            return self._grads_out(result, keep_tensors=True)
        finally:
            self._swapped = None
            for k, _ in self._user_attrs():       # (set by the traced backward)
                if k not in originals:
                    del self.__dict__[k]
            self.__dict__.update(originals)
            for sv in self.saved_variables():
                saved.after(sv)

    def backward_with(self, saved, grads):
        """Run the user's backward at run time on arrays a compiled graph gives:
        ``saved`` (one per ``save_for_backward`` argument, None where it was None)
        and the incoming gradients. Returns the gradient arrays, checked as
        eager checks them (``validate``)."""
        self._swapped = tuple([None if a is None else self._saved_tensor(sv, a)
                               for sv, a in zip(self._saved, saved)])
        make = Tensor._make
        grads_in = []
        for g in grads:
            if type(g) is not np.ndarray:    # (a gradient to materialize)
                grads_in = self._grads_in(grads)
                break
            grads_in.append(make(g))
        try:
            result = self._forward_cls.backward(self, *grads_in)
        finally:
            self._swapped = None
        return tuple(validate(self, self._grads_out(result, keep_tensors=False)))

    def _saved_tensor(self, sv, array):
        """A saved value as the user's backward sees it: an output has this node
        as its grad_fn, as eager's unpack gives it; an input requires grad if it
        did (eager gives the input itself, which a compiled backward released)."""
        t = Tensor._make(array)
        if sv.is_output:
            t._grad_fn, t._output_nr = self, sv._output_nr
        elif sv._requires_grad:
            t._requires_grad = True
        return t


_PLAIN = (int, float, str, bool, type(None))


def _freeze(value, args):
    """A ctx attribute as a key: plain data by value; Tensors (anywhere inside
    tuples, lists, dicts) become runtime inputs; anything else makes the backward
    uncacheable (traced again each time), since what backward reads from it is
    baked into the graph."""
    if isinstance(value, Tensor):
        args.collect_tensor(value)
        return ("Tensor", value.dtype.str)
    if isinstance(value, _PLAIN):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(_freeze(v, args) for v in value)
    if isinstance(value, dict) and all(isinstance(k, _PLAIN) for k in value):
        return ("dict",) + tuple((k, _freeze(v, args)) for k, v in sorted(
            value.items(), key=lambda kv: repr(kv[0])))
    args.uncacheable(f"ctx attribute of type {type(value).__name__}")
    return ("opaque", type(value).__name__)


def _lift(value, saved):
    """``value`` with its Tensors swapped for what ``saved.lifted`` gives (the same
    walk as _freeze)."""
    if isinstance(value, Tensor):
        return saved.lifted(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_lift(v, saved) for v in value)
    if isinstance(value, dict) and all(isinstance(k, _PLAIN) for k in value):
        return {k: _lift(v, saved) for k, v in value.items()}
    return value


class _FunctionMeta(type):
    def __init__(cls, name, bases, namespace):
        super().__init__(name, bases, namespace)
        cls._backward_cls = type(f"{name}Backward", (FunctionBackward,),
                                 {"_forward_cls": cls, "__module__": cls.__module__})


class Function(metaclass=_FunctionMeta):
    """Subclass with static ``forward(ctx, *args)`` and ``backward(ctx, *grads)``,
    then call ``MyFn.apply(*args)``.

    Under ``compiled_backward`` the backward runs as Python, at its place in the
    backward, every time (a ``call_backward`` node). ``inline_backward = True``
    declares it a pure function of ctx and its gradients: it is then traced into
    the graph's prims (keyed by the values of ctx's attributes), and runs as
    Python only where tracing it fails."""

    inline_backward = False

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom "
                                  "autograd.Function.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement either the backward or vjp method for "
                                  "your custom autograd.Function to use it with backward "
                                  "mode AD.")

    @classmethod
    def apply(cls, *args, **kwargs):
        needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        ctx = cls._backward_cls.__new__(cls._backward_cls)
        ctx._start(needs)
        ctx._tensor_inputs = tuple(isinstance(a, Tensor) for a in args)
        # The forward records no history, but its outputs are activations.
        with memory.category("activation") if is_grad_enabled() and memory.active() \
                else contextlib.nullcontext(), no_grad():
            outputs = cls.forward(ctx, *args, **kwargs)
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        inputs = {id(a) for a in args if isinstance(a, Tensor)}
        if not (is_grad_enabled() and any(needs)):
            # (torch marks the views made inside the forward all the same; an input
            # returned as-is comes back as an alias of it, which records nothing:
            # torch's _view_as_self_with_no_grad)
            aliased = []
            for o in outs:
                if isinstance(o, Tensor) and id(o) in inputs:
                    o = o.detach()
                elif isinstance(o, Tensor) and o._base is not None:
                    o._creation = "custom_function"
                aliased.append(o)
            return aliased[0] if single else tuple(aliased)
        edges = [gradient_edge(a) if n else (None, 0) for a, n in zip(args, needs)]
        Node.__init__(ctx, edges, [(o.shape, o.dtype) if isinstance(o, Tensor) else None
                                   for o in outs])
        differentiable = [isinstance(o, Tensor) and id(o) not in ctx._non_differentiable
                          and o.dtype.kind in "fc" for o in outs]
        # As torch: the views among the outputs may not be modified in place, those of
        # a Function with several differentiable outputs as "multiple views".
        creation = "multi_output" if sum(differentiable) > 1 else "custom_function"
        wrapped = []
        for i, o in enumerate(outs):
            if isinstance(o, Tensor):
                if id(o) in inputs:
                    o = make_view(o._data, o)  # an input returned: alias it
                    o._creation = creation
                elif o._base is not None:
                    o._creation = creation     # a view made inside the forward
                if differentiable[i]:
                    o._grad_fn, o._output_nr = ctx, i
                    # A view modified in place inside the forward keeps this grad_fn
                    # (torch's set_gradient_edge sets the view's attr_version).
                    o._view_version = o._version_counter.value
            wrapped.append(o)
        # An input returned as-is and saved is saved as the input it is.
        produced = {id(o): w for o, w in zip(outs, wrapped)
                    if isinstance(o, Tensor) and id(o) not in inputs}
        # Let go of what forward asked to save before saving it: a pack hook that
        # raises (checkpoint's early stop does) must not leave ctx -> _to_save ->
        # output -> ctx, a cycle only gc.collect() frees (torch clears to_save).
        to_save, ctx._to_save = ctx._to_save, ()
        ctx._saved = tuple(_save(t, produced, ctx) for t in to_save)
        ctx._saved_nones = tuple([sv is None for sv in ctx._saved])
        return wrapped[0] if single else tuple(wrapped)


def _save(t, produced, ctx):
    if t is None:
        return None
    out = produced.get(id(t))
    if out is not None and out._grad_fn is ctx:
        return SavedVariable(out, is_output=True, grad_fn_name=type(ctx).__name__)
    return SavedVariable(t, is_output=False)
