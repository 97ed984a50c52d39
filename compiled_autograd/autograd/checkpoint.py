"""Activation checkpointing (torch.utils.checkpoint's contract), on saved-tensor hooks.

Non-reentrant (the default), as torch implements it:

- forward: ``fn`` runs under a pack hook that stores a small *holder* instead of each
  saved tensor; the segment's inputs are saved (their versions are checked later).
- backward: the first unpack of any holder in a given backward (graph task)
  recomputes the segment's forward, with grad enabled, the RNG state of the
  forward and *recompute* hooks that hand each recomputed tensor to its holder; with
  early stop, recomputation stops once every holder is filled. Each recomputed
  tensor is released as soon as it is unpacked.
- ``determinism_check="default"`` compares the shape and dtype of every recomputed
  tensor with the original and reports a different count.

Selective checkpointing (``create_selective_checkpoint_contexts``) caches the
outputs of chosen prims during the forward and reuses them during recomputation.
``use_reentrant=True`` is torch's older scheme (a custom Function that runs ``fn``
without grad and re-runs it in its backward), with its documented limits.
"""
from __future__ import annotations

import contextlib
import enum
import uuid
import warnings
import weakref
from collections import defaultdict

from compiled_autograd.autograd import dispatch
from compiled_autograd.autograd.checkpoint_debug import DebugLogs
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.autograd import random as _random
from compiled_autograd.autograd.engine import backward as _backward
from compiled_autograd.autograd.engine import current_graph_task, current_graph_task_id
from compiled_autograd.autograd.function import Function
from compiled_autograd.autograd.grad_mode import enable_grad, is_grad_enabled, set_grad_enabled
from compiled_autograd.autograd.saved_hooks import saved_tensors_hooks
from compiled_autograd.autograd.node import SavedVariable
from compiled_autograd.runtime import memory
from compiled_autograd.runtime.prims import run_kernel


class CheckpointError(RuntimeError):
    """Raised when a recomputation does not reproduce the original forward."""


class CheckpointPolicy(enum.Enum):
    MUST_SAVE = 0
    PREFER_SAVE = 1
    MUST_RECOMPUTE = 2
    PREFER_RECOMPUTE = 3


_EARLY_STOP = [True]
_DEBUG = [None]

_DEBUG_TIP = """
Tip: To see a more detailed error message, either pass `debug=True` to
`torch.utils.checkpoint.checkpoint(...)` or wrap the code block
with `with torch.utils.checkpoint.set_checkpoint_debug_enabled(True):` to
enable checkpoint-debug mode globally.
"""


@contextlib.contextmanager
def set_checkpoint_early_stop(enable: bool):
    """Stop recomputation once every needed tensor is recomputed (default True)."""
    prev = _EARLY_STOP[0]
    _EARLY_STOP[0] = bool(enable)
    try:
        yield
    finally:
        _EARLY_STOP[0] = prev


@contextlib.contextmanager
def set_checkpoint_debug_enabled(enabled):
    """Whether checkpoints made inside explain a non-deterministic recomputation with
    the operators of both runs; overrides ``checkpoint(debug=...)``, None defers to it."""
    prev = _DEBUG[0]
    _DEBUG[0] = enabled
    try:
        yield
    finally:
        _DEBUG[0] = prev


def _metadata(x):
    return {"shape": tuple(x.shape), "dtype": x.dtype.name}


class _Handle:
    """Holds the recomputed tensor; dropping it releases the tensor. (torch keys
    a WeakKeyDictionary by it: the same lifetime, without a Python callback at
    garbage collection, where a KeyboardInterrupt would be lost.)"""
    __slots__ = ("value",)


class _Holder:
    """What the forward's pack hook stores instead of a tensor."""
    __slots__ = ("handles", "alias", "__weakref__")

    def __init__(self, alias=False):
        self.handles = {}  # graph task id -> _Handle, or None once unpacked
        # True when the saved tensor is a leaf, a checkpoint input, or a view of
        # one: recomputing it allocates nothing (for memory planning).
        self.alias = alias


class _StopRecomputation(Exception):
    pass


class _Frame:
    """The state of one checkpointed call, shared by its hooks."""

    def __init__(self, recompute_fn, early_stop, check_metadata, input_roots=frozenset(),
                 debug_logs=None):
        self.recompute_fn = recompute_fn
        self.debug_logs = debug_logs     # DebugLogs under debug=True
        self.input_roots = input_roots   # ids of the inputs' storages (kept anyway)
        self.early_stop = early_stop
        self.check_metadata = check_metadata
        self.weak_holders = []
        self.x_metadatas = []
        self.recomp_counter = defaultdict(int)
        self.is_recomputed = defaultdict(bool)
        self.forward_completed = False
        self.ignore_saved_mismatch = False

    def check_recomputed_tensors_match(self, gid):
        if self.ignore_saved_mismatch:
            return
        if not self.early_stop and len(self.weak_holders) != self.recomp_counter[gid] or (
                self.early_stop and self.recomp_counter[gid] < len(self.weak_holders)):
            raise CheckpointError(
                "torch.utils.checkpoint: A different number of tensors was saved during the "
                "original forward and recomputation.\n"
                f"Number of tensors saved during forward: {len(self.weak_holders)}\n"
                f"Number of tensors saved during recomputation: {self.recomp_counter[gid]}.\n"
                f"{_DEBUG_TIP}")
        if not self.check_metadata:
            return
        different = []
        for idx, ref in enumerate(self.weak_holders):
            holder = ref()
            if holder is None or holder.handles.get(gid) is None:
                continue
            recomputed = _metadata(holder.handles[gid].value)
            if recomputed != self.x_metadatas[idx]:
                different.append((idx, self.x_metadatas[idx], recomputed))
        if different:
            detail = "".join(f"tensor at position {i}:\nsaved metadata: {a}\n"
                             f"recomputed metadata: {b}\n" for i, a, b in different)
            raise CheckpointError("torch.utils.checkpoint: Recomputed values for the following "
                                  "tensors have different metadata than during the forward "
                                  f"pass.\n{detail}.\n{_DEBUG_TIP}")


class _RecomputationHooks(saved_tensors_hooks):
    """During recomputation: each saved tensor goes to the holder of the same rank."""

    def __init__(self, frame_ref, gid):
        def pack(x):
            # As torch: only a tensor that requires grad is detached; another is kept
            # as the very object (ctx.saved_tensors gives the input itself back).
            x = x.detach() if x.requires_grad else x
            frame = frame_ref()
            idx = frame.recomp_counter[gid]
            frame.recomp_counter[gid] += 1
            if idx >= len(frame.weak_holders):
                if not frame.forward_completed:  # recomputing while still in forward
                    frame.ignore_saved_mismatch = True
                    return x
                raise CheckpointError("torch.utils.checkpoint: trying to save more tensors "
                                      "during recomputation than during the original forward "
                                      f"pass.\n{_DEBUG_TIP}")
            holder = frame.weak_holders[idx]()
            if holder is not None:  # else that saved value is no longer needed
                handle = _Handle()
                handle.value = x
                holder.handles[gid] = handle
            if frame.early_stop and frame.recomp_counter[gid] == len(frame.weak_holders):
                raise _StopRecomputation()
            return x

        super().__init__(pack, lambda x: x)


class _CheckpointHooks(saved_tensors_hooks):
    """During the forward: store holders; on first unpack in a backward, recompute."""

    kind = "checkpoint"   # packed data: a _Holder (its .alias: recomputing allocates nothing)

    def __init__(self, frame):
        def pack(x):
            root = x._base if x._base is not None else x
            holder = _Holder(alias=root._grad_fn is None or id(root) in frame.input_roots)
            frame.weak_holders.append(weakref.ref(holder))
            if frame.check_metadata:
                frame.x_metadatas.append(_metadata(x))
            return holder

        def unpack(holder):
            gid = current_graph_task_id()
            if gid == -1:  # unpacked outside a backward (e.g. ctx.saved_tensors)
                gid = int(uuid.uuid4())
            if not frame.is_recomputed[gid]:
                try:
                    with _RecomputationHooks(weakref.ref(frame), gid):
                        frame.recompute_fn()
                except _StopRecomputation:
                    pass
                frame.is_recomputed[gid] = True
                frame.check_recomputed_tensors_match(gid)
            if gid not in holder.handles:
                raise CheckpointError("torch.utils.checkpoint: a saved tensor was not "
                                      "recomputed (the recomputation saved fewer tensors).")
            if holder.handles[gid] is None:
                raise CheckpointError(
                    "torch.utils.checkpoint: Unpack is being triggered for a tensor that was "
                    "already unpacked once. If you are calling ctx.saved_tensors in backward, "
                    "make sure to do so only once. Otherwise please open an issue with details "
                    "on your use case.")
            value = holder.handles[gid].value
            holder.handles[gid] = None  # the only strong reference to the handle
            return value

        def unpack_explained(holder):
            try:
                return unpack(holder)
            except CheckpointError as e:
                raise CheckpointError(frame.debug_logs.message()) from e

        super().__init__(pack, unpack if frame.debug_logs is None else unpack_explained)


@contextlib.contextmanager
def _fork_rng(state):
    if state is None:
        yield
        return
    current = _random.get_rng_state()
    _random.set_rng_state(state)
    try:
        yield
    finally:
        _random.set_rng_state(current)


def _noop_contexts():
    return contextlib.nullcontext(), contextlib.nullcontext()


def checkpoint(function, *args, use_reentrant=False, context_fn=_noop_contexts,
               determinism_check="default", preserve_rng_state=True, debug=False, **kwargs):
    """Run ``function(*args, **kwargs)`` without keeping its saved tensors; recompute
    them during backward. Arguments and results may mix Tensors with other values."""
    if determinism_check not in ("default", "none"):
        raise ValueError("determinism_check should be one of ['default', 'none'], but got "
                         f"{determinism_check}")
    if use_reentrant:
        if context_fn is not _noop_contexts or debug:
            raise ValueError("Passing `context_fn` or `debug` is only supported when "
                             "use_reentrant=False.")
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        return _checkpoint_reentrant(function, preserve_rng_state, *args)
    debug_logs = None
    if _DEBUG[0] if _DEBUG[0] is not None else debug:
        if context_fn is not _noop_contexts:
            raise ValueError("debug=True is incompatible with non-default context_fn")
        debug_logs = DebugLogs()
        context_fn = debug_logs.contexts
    forward_ctx, recompute_ctx = context_fn()
    rng_state = _random.get_rng_state() if preserve_rng_state else None
    grad_was_enabled = is_grad_enabled()
    # The inputs are saved like any saved tensor (under enclosing hooks too, so
    # nesting works), and their versions are checked when they are reused.
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    saved_inputs = [SavedVariable(args[i], is_output=False) for i in positions]

    def recompute():
        inputs = list(args)
        for i, sv in zip(positions, saved_inputs):
            inputs[i] = sv.unpack_input("checkpoint")
        with memory.category("recomputed") if memory.active() else contextlib.nullcontext(), \
                _fork_rng(rng_state), set_grad_enabled(grad_was_enabled), recompute_ctx:
            function(*inputs, **kwargs)

    roots = frozenset(id(args[i]._base if args[i]._base is not None else args[i])
                      for i in positions)
    frame = _Frame(recompute, _EARLY_STOP[0], determinism_check == "default", roots,
                   debug_logs)
    with _CheckpointHooks(frame), forward_ctx:
        out = function(*args, **kwargs)
    frame.forward_completed = True
    return out


# ---------------------------------------------------------------- reentrant


class _CheckpointFunction(Function):
    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        ctx.run_function = run_function
        ctx.rng_state = _random.get_rng_state() if preserve_rng_state else None
        ctx.positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.non_tensor_args = [None if isinstance(a, Tensor) else a for a in args]
        ctx.save_for_backward(*[args[i] for i in ctx.positions])
        return run_function(*args)

    @staticmethod
    def backward(ctx, *grads):
        task = current_graph_task()
        if task is not None and task.exec_info is not None:
            raise RuntimeError(
                "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() "
                "or passing an `inputs` parameter to .backward(). To resolve this error, you "
                "can either set use_reentrant=False, or call .backward() without passing the "
                "`inputs` argument.")
        inputs = list(ctx.non_tensor_args)
        detached = []
        for i, t in zip(ctx.positions, ctx.saved_tensors):
            d = t.detach()
            d.requires_grad = t.requires_grad
            inputs[i] = d
            detached.append(d)
        with memory.category("recomputed") if memory.active() else contextlib.nullcontext(), \
                _fork_rng(ctx.rng_state), enable_grad():
            outputs = ctx.run_function(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads)
                 if isinstance(o, Tensor) and o.requires_grad and g is not None]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is "
                               "not necessary")
        _backward([o for o, _ in pairs], [g for _, g in pairs])
        grads_in = iter(d.grad for d in detached)
        return (None, None) + tuple(next(grads_in) if i in ctx.positions else None
                                    for i in range(len(inputs)))


def _checkpoint_reentrant(function, preserve_rng_state, *args):
    if not any(isinstance(a, Tensor) and a.requires_grad for a in args):
        warnings.warn("None of the inputs have requires_grad=True. Gradients will be None")
    return _CheckpointFunction.apply(function, preserve_rng_state, *args)


def checkpoint_sequential(functions, segments, input, use_reentrant=False, **kwargs):
    """Checkpoint all but the last of ``segments`` equal runs of ``functions`` (a
    Sequential or a list of callables)."""
    functions = list(functions.children()) if hasattr(functions, "children") else list(functions)
    if segments < 1:
        raise ValueError(f"segments must be at least 1, got {segments}")

    def run(start, end):
        def forward(x):
            for j in range(start, end + 1):
                x = functions[j](x)
            return x
        return forward

    size = len(functions) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run(start, end), input, use_reentrant=use_reentrant, **kwargs)
    return run(end + 1, len(functions) - 1)(input)


# ---------------------------------------------------------------- selective


class SelectiveCheckpointContext:
    """What a policy function receives: whether this call is the recomputation."""

    def __init__(self, is_recompute):
        self.is_recompute = is_recompute


def _policy_from(policy_fn_or_list):
    if callable(policy_fn_or_list):
        return policy_fn_or_list
    names = set(policy_fn_or_list)
    return lambda ctx, op, *args, **kwargs: (CheckpointPolicy.MUST_SAVE if op in names
                                             else CheckpointPolicy.PREFER_RECOMPUTE)


class _PrimCache:
    """Intercepts prim calls on Tensors inside a checkpointed function: during the
    forward it keeps the outputs the policy saves; during recomputation it hands
    them back instead of computing them again."""

    def __init__(self, policy, storage, recompute, allow_mutation=False):
        self.policy, self.storage, self.recompute = policy, storage, recompute
        self.allow_mutation = allow_mutation
        self.ctx = SelectiveCheckpointContext(recompute)
        self._pending = None  # the entry waiting for its result Tensor (observe)

    def __call__(self, prim, arrays, params):
        decision = self.policy(self.ctx, prim.name, *arrays, **params)
        if not isinstance(decision, CheckpointPolicy):
            raise RuntimeError(f"policy_fn must return a CheckpointPolicy, got {decision!r}")
        save = decision in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)
        if save and self.recompute:
            queue = self.storage[prim.name]
            if not queue:
                raise CheckpointError(f"selective checkpoint: no cached output left for "
                                      f"{prim.name} during recomputation")
            entry = queue.pop(0)
            counter, version = entry[1], entry[2]
            if counter is not None and counter.value != version:
                raise CheckpointError(
                    "Tensor cached during selective activation checkpoint has been mutated "
                    f"(an in-place op changed the output of {prim.name}); pass "
                    "allow_cache_entry_mutation=True to cache a copy instead")
            return entry[0]
        out = run_kernel(prim, arrays, params)
        if save:
            entry = [out.copy() if self.allow_mutation else out, None, 0]
            self.storage[prim.name].append(entry)
            self._pending = None if self.allow_mutation else entry
        return out

    def observe(self, result, args):
        """The Tensor wrapping the last kernel result: watch its version."""
        if self._pending is not None:
            self._pending[1] = result._version_counter
            self._pending[2] = result._version_counter.value
            self._pending = None

    def __enter__(self):
        dispatch.push_interceptor(self)
        return self

    def __exit__(self, *exc):
        dispatch.pop_interceptor(self)
        return False


def create_selective_checkpoint_contexts(policy_fn_or_list, allow_cache_entry_mutation=False):
    """(forward context, recompute context) for ``checkpoint(context_fn=...)``.
    The policy gets (ctx, prim name, *inputs, **params) and returns a
    CheckpointPolicy; a list of prim names means "save those, recompute the rest"."""
    policy = _policy_from(policy_fn_or_list)
    storage = defaultdict(list)
    return (_PrimCache(policy, storage, False, allow_cache_entry_mutation),
            _PrimCache(policy, storage, True, allow_cache_entry_mutation))
