"""``in_backward(optimizer)``: each parameter's update runs inside the backward.

torch users do this by hand (``register_post_accumulate_grad_hook``, one optimizer per
parameter; torch's tutorial "How to save memory by fusing the optimizer step into the
backward pass"). Here one call does it for a whole optimizer: a post-accumulate-grad
hook on every parameter runs the optimizer's own update of that parameter
(``Optimizer._step_param``, the formula ``step`` runs) as soon as the gradient is
final, then sets ``.grad`` to None, so each gradient is freed while the backward goes
on, and the peak holds at most one gradient instead of all of them.

Under compiled autograd the update is part of the compiled graph: the hook is
*traceable* (it has ``compiled_args`` and ``apply_with_saved``, as a node has), so
the tracer records the optimizer's rule itself right after the parameter's last
gradient contribution -- its prims, then ``store`` nodes that write the new
parameter and state into their arrays -- and "python" and "c" run it inline, with
no call into the optimizer's Python (``optim.traced``). The parameter's and state's
arrays are the graph's runtime inputs, and every float of the rule (the learning
rate, betas, Adam's bias corrections for this step) a runtime scalar: a scheduler's
new learning rate is no recompile. The gradient never becomes ``.grad``.

The update is called as Python instead (a ``call_hook[post_acc_grad_hook]`` node,
as any hook) where the traced form cannot say the same: on a parameter's first
update where its state is made then (SGD's momentum buffer, Adam's moments), when
``.grad`` is not None before the backward (the update then takes the sum), when the
parameter has other post-accumulate-grad hooks, when an array is not C-contiguous
and writeable, or when a state array of the parameter's shape has another dtype. Each
of these is part of the cache key.

Under ``DistributedDataParallel`` the update of a parameter waits for its bucket's
all-reduce: its hook hands the update to DDP's reducer (``GradReady.after_reduce``),
which runs it with the averaged gradient right after that bucket's wait, before it
waits for the next bucket (so later buckets' transfers overlap earlier buckets'
updates). That update is Python (called from DDP's ``wait_buckets`` hook node).

What the wrapped optimizer does:

- ``step()`` updates only the parameters that still have a gradient (one set by hand,
  or one whose hooks were removed): after a backward there are none, so it is a
  no-op, and a loop written for a plain optimizer stays correct. ``step(closure)``
  runs the closure (whose backward does the updates) and returns its loss.
- ``zero_grad()`` resets what gradients remain (none after a backward).
- ``param_groups``, ``state``, ``state_dict``, ``load_state_dict`` and
  ``add_param_group`` are the wrapped optimizer's: a scheduler that changes a group's
  ``lr`` changes the next update inside the backward.
- Every backward is an update: accumulating gradients over several backwards (micro
  batches) is not possible while wrapped; ``remove()`` unregisters the hooks.
"""
from __future__ import annotations

import threading
from functools import partial

import numpy as np

from compiled_autograd.autograd.tensor_base import VersionCounter
from compiled_autograd.optim import traced
from compiled_autograd.optim.optimizer import Optimizer


class UpdateHook:
    """The post-accumulate-grad hook of one parameter: its update (called as
    Python by eager autograd, traced by compiled autograd)."""

    __slots__ = ("owner", "index", "compiled_args", "__weakref__")

    def __init__(self, owner, index):
        self.owner, self.index = owner, index     # (the optimizer's, its group's)
        # ``compiled_args(args, param) -> bool``: the owner's, for this group (a
        # partial, not a method: called per parameter at every backward)
        self.compiled_args = partial(owner._compiled_args, index)

    def __call__(self, param):
        # A parameter DistributedDataParallel averages is updated once its
        # bucket's all-reduce is done (the reducer calls back), not before.
        for hook in tuple(param._post_accumulate_grad_hooks.values()):
            defer = getattr(hook, "after_reduce", None)
            if defer is not None and defer(self.owner._update_hook):
                return
        self.owner._update_hook(param)

    def apply_with_saved(self, param, grad, swap) -> None:
        self.owner._apply_with_saved(self, param, grad, swap)

    def __repr__(self):
        return f"<update of {type(self.owner.optimizer).__name__}>"


def _flags(group) -> dict:
    """The options of ``group`` a rule may branch on while traced (no floats:
    those are ``_scalars``, runtime values)."""
    return {k: v for k, v in group.items()
            if k != "params" and (v is None or isinstance(v, (bool, str)))}


_NO_STATE: dict = {}


class OptimizerInBackward(Optimizer):
    """An optimizer whose updates run inside the backward (see the module doc)."""

    def __init__(self, optimizer):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        if isinstance(optimizer, OptimizerInBackward):
            raise RuntimeError("the optimizer's updates already run in the backward")
        self.optimizer = optimizer
        self.defaults = optimizer.defaults
        self.param_groups = optimizer.param_groups   # the same list: schedulers see it
        for name in ("step_pre", "step_post", "state_dict_pre", "state_dict_post",
                     "load_state_dict_pre", "load_state_dict_post"):
            key = f"_optimizer_{name}_hooks"   # (the same hooks: registered on either)
            setattr(self, key, getattr(optimizer, key))
        self._handles = []
        self._group_of = {}
        # Two threads' backwards may reach the hooks at once: the scratch buffers
        # and the state are the optimizer's, one update at a time.
        self._lock = threading.Lock()
        for index in range(len(self.param_groups)):
            self._hook_group(index)

    @property
    def state(self):
        return self.optimizer.state

    def _hook_group(self, index):
        for p in self.param_groups[index]["params"]:
            self._group_of[id(p)] = index
            self._handles.append(p.register_post_accumulate_grad_hook(UpdateHook(self, index)))

    def _compiled_args(self, index, args, p) -> bool:
        """Collect the traced update of ``p``, of group ``index`` (see the module
        doc), or say False. (Per parameter, at every backward: kept lean.)"""
        if p._grad is not None or len(p._post_accumulate_grad_hooks) != 1:
            return False
        data = p._data
        dtype, shape = data.dtype, data.shape
        if dtype.kind != "f" or not data.flags.carray:
            return False
        opt = self.optimizer
        state = opt.state.get(p, _NO_STATE)
        arrays = [data]
        for t in state.values():
            a = getattr(t, "_data", None)
            if a is None:   # (a loaded torch state's None momentum buffer: Python's)
                return False
            # (C-contiguous, aligned and writeable; a state array of the
            # parameter's shape in another dtype: eager computes in the
            # parameter's scratch dtype, the traced chain does not; the step
            # count is a float32 0-d array whatever the parameter's dtype)
            if not a.flags.carray or (a.dtype is not dtype and a.dtype != dtype
                                      and a.shape == shape):
                return False
            arrays.append(a)
        # What the parameters of a group share is collected once per backward (and
        # per value of what of the state the floats read: Adam's step count), as
        # one key item the parameter's own item names by its position.
        memo_key = (self, index, opt._scalars_key(state) if state else None, *state)
        shared = args.memo.get(memo_key)
        if shared is None:
            shared = args.memo[memo_key] = self._collect_shared(args, index, state)
        if shared is False:
            return False
        args.collect_arrays(arrays, ("optimizer update", shared[0]),
                            (p, *state.values()) if args.record else None)
        shared[1].append(p)
        return True

    def _collect_shared(self, args, index, state):
        """The key item the parameters of group ``index`` whose state has the keys
        and floats of ``state`` share: its position in the key, and the list of
        those updated (whose eager calls' other effects run after the backward);
        or False if their update cannot be traced."""
        opt = self.optimizer
        group = self.param_groups[index]
        if not opt._state_ready(state, group):
            return False
        # The floats: one runtime scalar per group, name and value (a group's lr is
        # one scalar for all its parameters), their positions in the key.
        gid = id(group)
        positions = tuple([args.collect_scalar((gid, name, value), value)
                           for name, value in opt._scalars(group, state).items()])
        args.collect(("optimizer update", type(opt), tuple(_flags(group).items()),
                      tuple(state), positions))
        updated = []
        args.after_run.append(partial(self._stepped, updated))
        return len(args.key) - 1, updated

    def _stepped(self, params):
        """What the updates' eager calls do besides the arithmetic, once the
        backward ran: each parameter was modified in place (a saved copy of it is
        out of date), and the optimizer stepped (a scheduler's order check)."""
        for p in params:
            p._version_counter.value += 1     # (VersionCounter.bump, counted below)
        VersionCounter.writes += len(params)
        self._opt_called = True

    def _apply_with_saved(self, hook, p, grad, swap) -> None:
        """The update of ``p`` from ``grad`` (a graph value) as graph nodes."""
        opt = self.optimizer
        group = self.param_groups[self._group_of[id(p)]]
        state = opt.state.get(p, {})
        tensors = {"": p, **state}

        def rule(last):
            buffers = {k: traced.Buffer(swap.lifted(t), swap.lifted(t), last.get(k),
                                        partial(swap.store, tensor=t))
                       for k, t in tensors.items()}
            scalars = {name: swap.scalar((id(group), name, value), value)
                       for name, value in opt._scalars(group, state).items()}
            param = buffers.pop("")
            opt._update(param, grad, buffers, _flags(group), traced.TraceScratch(), scalars,
                        traced.TRACE)
            return {"": param.writes, **{k: b.writes for k, b in buffers.items()}}
        mark = swap.tracer.mark()
        writes = rule({})               # (counts each array's writes: no store yet)
        swap.tracer.rewind(mark)
        rule(writes)                    # (each array stored at its last write)

    def _update_hook(self, param):
        """Run when ``param.grad`` is final: update ``param``, free its gradient."""
        group = self.param_groups[self._group_of[id(param)]]
        with self._lock:
            self.optimizer._step_param(param, group)   # (numpy in place: nothing to record)
            param.grad = None
        self._opt_called = True   # (a scheduler's order check: the step happened)

    def step(self, closure=None):
        """Update the parameters that still have a gradient (none after a backward)."""
        loss = self.optimizer.step(closure)
        self._opt_called = True
        return loss

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none)

    def add_param_group(self, param_group):
        self.optimizer.add_param_group(param_group)
        self._hook_group(len(self.param_groups) - 1)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def remove(self):
        """Unregister the hooks: updates happen in ``step()`` again."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __repr__(self):
        return f"in_backward({self.optimizer!r})"


def in_backward(optimizer):
    """Wrap ``optimizer`` so each parameter's update runs inside the backward, as soon
    as its gradient is final, and leaves ``.grad`` None (see the module doc)."""
    return OptimizerInBackward(optimizer)
