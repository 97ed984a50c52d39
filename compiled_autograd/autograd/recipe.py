"""Recipes: a saved value replaced by how to make it again.

A forward run under a ``RecipeRecorder`` (what ``with plan:`` installs) records each
prim call as a ``Recipe``: the prim, its params and its inputs. The recorder is also
a saved-tensor pack hook of kind "recipe": a value the plan recomputes is saved as
its recipe instead of its array, so the array is freed as soon as the forward no
longer needs it. A recipe's inputs are other recipes (values recomputed too) or
``Kept`` arrays (parameters, inputs, dropout masks and every value the plan keeps):
what a recomputation starts from.

Prims are pure functions of their inputs, so a replay gives the forward's value
bit for bit; randomness (dropout) lives outside prims, in masks that are kept.
In-place writes are what a replay cannot see. A value written in place since its
prim made it is not that prim's value any more: it is saved as it is, and read as
a kept array. A kept array written in place during the forward is copied first
for the recipes that read it (``before_write``); written after the forward, it
fails its version check as a saved value does. A value saved as its recipe and
then written in place fails that check too, as it would without the plan.

The eager engine evaluates a recipe when its saved value is unpacked (``value``);
the tracer of a compiled backward turns it into prim nodes of the graph instead
(``compiled.tracer``), which the Python and C backends run inline.

A memory plan's budget was measured on one backend (each holds memory its own
way): its recipes carry that backend (``made_for``), and a backward on another one
is refused (``check_backend``): a compiled backward as it collects its saved
values, before anything runs; the eager engine as it unpacks the first recipe
(its up-front checks are node.py's, which knows nothing of plans).
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from compiled_autograd.autograd import dispatch, engine
from compiled_autograd.autograd.saved_hooks import saved_tensors_hooks
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.autograd.tensor_base import TensorBase, type_name
from compiled_autograd.runtime import memory as _rt_memory
from compiled_autograd.runtime.prims import run_kernel


class Kept:
    """A recipe's input that is kept as it is: an array and the version it had."""

    __slots__ = ("data", "version_counter", "version", "__weakref__")

    def __init__(self, data, version_counter=None):
        self.data = data
        self.version_counter = version_counter
        self.version = None if version_counter is None else version_counter.value

    def read(self, recipe) -> np.ndarray:
        self.version_check().check(recipe.describe())
        return self.data

    def version_check(self) -> "KeptVersion":
        """What checking its version needs, without holding the array."""
        return KeptVersion(self.version_counter, self.version, self.data.dtype,
                           self.data.shape)


class KeptVersion:
    """A kept array's version counter, the version it was kept at, its dtype and
    shape: a compiled backward checks it after a call into Python without keeping
    the array alive (``hook_calls.after_python``)."""

    __slots__ = ("version_counter", "version", "dtype", "shape")

    def __init__(self, version_counter, version, dtype, shape):
        self.version_counter, self.version = version_counter, version
        self.dtype, self.shape = dtype, shape

    def check(self, recipe_name: str) -> None:
        """Eager's error if the array was modified in place since it was kept."""
        counter = self.version_counter
        if counter is not None and counter.value != self.version:
            dims = ", ".join(str(d) for d in self.shape)
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified "
                f"by an inplace operation: [{type_name(self.dtype)} [{dims}]] is at "
                f"version {counter.value}; expected version {self.version} "
                f"instead. Hint: the memory plan recomputes {recipe_name} from this "
                "value; do the in-place operation on a clone, or after the backward.")


ANY_BACKEND = object()   # a recipe any backward may run (not a measured plan's)


class Recipe:
    """How a value was made: ``prim(*inputs, **params)``; ``index`` is the prim
    call's place in the recorded forward (the plan's name for the value);
    ``made_for``: the backend whose backward may run it (``check_backend``)."""

    __slots__ = ("prim", "params", "inputs", "shape", "dtype", "index", "_memo",
                 "made_for", "__weakref__")

    def __init__(self, prim, params, inputs, shape, dtype, index, made_for=ANY_BACKEND):
        self.prim, self.params, self.inputs = prim, params, inputs
        self.shape, self.dtype, self.index = tuple(shape), dtype, index
        self._memo = None
        self.made_for = made_for

    def describe(self) -> str:
        return f"{self.prim.name} (forward prim #{self.index})"

    def value(self) -> np.ndarray:
        """Recompute the value (the eager engine's unpack). A value still alive from
        an earlier evaluation in this backward is reused, not recomputed."""
        memo = self._memo() if self._memo is not None else None
        if memo is not None:
            return memo
        args = [a.value() if type(a) is Recipe else a.read(self) if type(a) is Kept else a
                for a in self.inputs]
        with _rt_memory.category("recomputed"):
            out = run_kernel(self.prim, args, self.params)
            if type(out) is not np.ndarray:
                out = np.asarray(out)
            if not (self.prim.view or out.flags.c_contiguous):
                out = np.ascontiguousarray(out)  # as the forward made it (dispatch)
        self._memo = weakref.ref(out)
        return out

    def check_backend(self) -> None:
        check_backend(self)

    def __repr__(self):
        return f"<Recipe {self.describe()} {list(self.shape)}>"


def describe_backend(backend) -> str:
    """A backend as the planner's messages name it."""
    if backend is None:
        return "the eager engine (backend=None)"
    if isinstance(backend, str):
        return f"backend {backend!r}"
    return f"the compiler {getattr(backend, '__name__', type(backend).__name__)}"


def _how_to_run(backend) -> str:
    if backend is None:
        return "a plain loss.backward(), outside ca.compiled_backward"
    return f"loss.backward() inside `with ca.compiled_backward(backend={backend!r}):`"


def check_backend(recipe, compiled=False) -> None:
    """Raise if this thread's backward runs on another backend than the one the
    recipe's plan was made (and measured) for: ``engine.current_compiler()``'s
    backend, or None for the eager engine. (``compiled``: a compiled backward's
    collection, where no compiler means ``trace_backward``, which runs nothing.)"""
    want = recipe.made_for
    if want is ANY_BACKEND:
        return
    compiler = engine.current_compiler()
    if compiled and compiler is None:
        return
    running = None if compiler is None else getattr(compiler, "backend", compiler)
    if running is want or (isinstance(running, str) and running == want):
        return
    raise RuntimeError(
        f"memory plan: this backward runs on {describe_backend(running)}, but the plan was "
        f"made for {describe_backend(want)}: its peak was predicted and measured there, and "
        "another backend holds memory otherwise. Run the backward where the plan was made "
        f"({_how_to_run(want)}), or make the plan for this backend "
        f"(ca.memory.plan_checkpoints(..., backend={running!r})).")


def unpack_recipe(recipe):
    """The unpack hook of a value saved as its recipe (the eager engine's: it
    checks the backend here, before the first recomputation)."""
    check_backend(recipe)
    return Tensor._make(recipe.value())


class RecipeRecorder:
    """``with RecipeRecorder(recompute):`` records every prim call of a forward
    and saves the values for which ``recompute(index)`` holds as their recipes.
    It is a dispatch interceptor (it runs each kernel) and a saved-tensor pack hook
    of kind "recipe". ``on_call(index, prim, arrays, params)`` sees each call
    first (a plan checks the sequence there); ``on_made(index, result, arrays)``
    sees each result."""

    def __init__(self, recompute, on_call=None, on_made=None, made_for=ANY_BACKEND):
        self.recompute = recompute
        self.on_call, self.on_made = on_call, on_made
        self.made_for = made_for   # (each recipe's: see check_backend)
        self.count = 0
        # The backward running where the forward runs (None, mostly): prims that
        # a backward inside ``with plan:`` calls (a custom Function's backward, a
        # hook, a checkpoint's recomputation) are not the forward's.
        self._task = engine.current_graph_task()
        # (interceptors are global: the plan is this thread's forward only)
        self._thread = threading.get_ident()
        # id(root storage) -> weak references to the Kept inputs that read it
        self._kept: dict = {}
        # id(array) -> (weakref to the array, its Recipe or None, index, the
        # version counter of its Tensor and the version it had)
        self._made: dict = {}
        self._pending = None
        self._hooks = None

    # ---------------------------------------------------- the dispatch interceptor

    def __call__(self, prim, arrays, params):
        if threading.get_ident() != self._thread:
            return run_kernel(prim, arrays, params)   # another thread's prim
        if engine.current_graph_task() is not self._task:
            self._pending = None
            return run_kernel(prim, arrays, params)
        index = self.count
        if self.on_call is not None:
            self.on_call(index, prim, arrays, params)
        out = run_kernel(prim, arrays, params)
        self.count += 1
        self._pending = (index, prim, arrays, params)
        return out

    def observe(self, result, args):
        if self._pending is None or threading.get_ident() != self._thread:
            return
        index, prim, arrays, params = self._pending
        self._pending = None
        data = result._data
        recipe = None
        if self.recompute(index) or self._tied(prim, arrays):
            inputs = tuple(self._input(a, arr) for a, arr in zip(args, arrays))
            recipe = Recipe(prim, params, inputs, data.shape, data.dtype, index,
                            self.made_for)
        counter = result._version_counter
        self._made[id(data)] = (weakref.ref(data), recipe, index, counter, counter.value)
        if self.on_made is not None:
            self.on_made(index, result, arrays)

    def _tied(self, prim, arrays) -> bool:
        """Whether one of the inputs ``prim``'s backward reads with its output is
        recomputed (``saved_with_output``): then so is the output."""
        for i in saved_with_output(prim):
            if isinstance(arrays[i], np.ndarray):
                entry = self._entry(arrays[i])
                if entry is not None and entry[1] is not None:
                    return True
        return False

    def _entry(self, array):
        """What was recorded of ``array``, while it holds the value its prim call
        made: not once it was written in place (its version moved on), when its
        recipe would make the value it had before."""
        entry = self._made.get(id(array))
        if entry is None or entry[0]() is not array or entry[3].value != entry[4]:
            return None
        return entry

    def _input(self, arg, array):
        if not isinstance(array, np.ndarray):
            return array  # a Python scalar: a constant of the call
        entry = self._entry(array)
        if entry is not None and entry[1] is not None:
            return entry[1]
        kept = Kept(array, arg._version_counter if isinstance(arg, TensorBase) else None)
        if kept.version_counter is not None:
            self._kept.setdefault(id(_root(array)), []).append(weakref.ref(kept))
        return kept

    def before_write(self, tensor):
        """``tensor`` is about to be written in place (dispatch.apply_inplace):
        the recipes that read its storage as it is now keep a copy of what they
        read instead. (The forward without the plan saved nothing of it, or it
        would fail the same way; the plan must not make it fail.) After the
        forward, a write fails the version check of ``Kept.read`` instead."""
        if threading.get_ident() != self._thread:
            return
        refs = self._kept.get(id(_root(tensor._data)))
        if not refs:
            return
        target, copies, alive = tensor._data, {}, []
        for ref in refs:
            kept = ref()
            if kept is None:
                continue
            counter = kept.version_counter
            if counter is None or counter.value != kept.version or \
                    not np.may_share_memory(kept.data, target):
                alive.append(ref)   # (stale already, or another part of the storage)
                continue
            copy = copies.get(id(kept.data))
            if copy is None:
                copy = copies[id(kept.data)] = kept.data.copy()
                _rt_memory.on_array(copy, f"recipe input before an in-place write "
                                          f"(forward prim #{self.count})", "saved")
            kept.data, kept.version_counter, kept.version = copy, None, None
        self._kept[id(_root(target))] = alive

    def recipe_of(self, tensor):
        """The recipe ``tensor`` is saved as, or None (it is saved as it is)."""
        entry = self._entry(tensor._data)
        return None if entry is None else entry[1]

    def index_of(self, array):
        """The prim call that made ``array`` (and whose value it still holds), or
        None."""
        entry = self._entry(array)
        return None if entry is None else entry[2]

    # ---------------------------------------------------- installing it

    def __enter__(self):
        """Record the prim calls and save values as ``pack(tensor)`` says (by
        default ``recipe_of``: a Recipe, or None to save the tensor itself)."""
        self._hooks = _RecipeHooks(self.pack, unpack_recipe)
        self._hooks.__enter__()
        dispatch.push_interceptor(self)
        return self

    def __exit__(self, *exc):
        dispatch.pop_interceptor(self)
        self._hooks.__exit__(*exc)
        self._hooks = None
        self._made.clear()   # (the recipes the saved values hold stay theirs)
        self._kept.clear()
        self._pending = None
        return False

    def pack(self, tensor):
        return self.recipe_of(tensor)


class _RecipeHooks(saved_tensors_hooks):
    kind = "recipe"   # SavedVariable asks pack() per value: a Recipe, or None


def _root(array):
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


_SAVED_WITH_OUTPUT: dict = {}


def saved_with_output(prim) -> tuple:
    """The inputs ``prim``'s backward reads together with its output (amax: its
    input, which it compares with the output; pow: both). The output of such a
    prim is recomputed whenever one of them is: they must come from one
    computation -- the "c" backend's kernels round otherwise than the forward's,
    and a recomputed input next to the forward's amax matched none of its
    elements (a gradient of 0 / 0)."""
    out = _SAVED_WITH_OUTPUT.get(prim.name)
    if out is None:
        entries = [s[0] if isinstance(s, tuple) else s for s in prim.save]
        out = _SAVED_WITH_OUTPUT[prim.name] = (
            tuple(i for i in entries if type(i) is int) if "out" in entries else ())
    return out
