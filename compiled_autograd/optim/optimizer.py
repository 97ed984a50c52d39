"""Optimizer: param_groups, state, zero_grad, state_dict, as torch.optim.Optimizer.

A subclass says what state a parameter starts with (``_init_state``) and how one
parameter is updated (``_update``, on ndarrays). ``step`` runs that update over every
parameter with a gradient, in place, as torch's ``foreach`` path does: no array is
made per parameter per step. The state is made once, on a parameter's first update;
the temporaries live in two scratch buffers per dtype (``Scratch``), the size of the
largest parameter, made once and reused by every parameter of every step.

The update of one parameter is the same function whether ``step`` runs it or a
post-accumulate-grad hook does (``in_backward``): one formula, written once.
"""
from __future__ import annotations

import copy
import warnings
from collections import defaultdict
from itertools import chain

import numpy as np

from compiled_autograd.autograd.grad_mode import enable_grad, no_grad
from compiled_autograd.autograd.hooks import HookDict, RemovableHandle
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.runtime.memory import on_array


class _Required:
    def __repr__(self):
        return "<required parameter>"


required = _Required()


class Scratch:
    """Two reusable temporaries per dtype, grown to the largest parameter seen."""

    def __init__(self):
        self._buffers = {}
        self._views = {}     # (dtype, shape, i) -> the view, made once

    def get(self, like: np.ndarray, i: int) -> np.ndarray:
        """Temporary ``i`` (0 or 1) viewed with ``like``'s shape and dtype."""
        view = self._views.get((like.dtype, like.shape, i))
        if view is not None:
            return view
        key = (like.dtype, i)
        buf = self._buffers.get(key)
        if buf is None or buf.size < like.size:
            buf = np.empty(like.size, dtype=like.dtype)
            on_array(buf, "optimizer scratch", "temporary")
            self._buffers[key] = buf
            self._views = {k: v for k, v in self._views.items() if k[0] != like.dtype or
                           k[2] != i}
        view = self._views[(like.dtype, like.shape, i)] = buf[:like.size].reshape(like.shape)
        return view


def state_tensor(arr: np.ndarray) -> Tensor:
    on_array(arr, "optimizer state", "parameter")
    return Tensor._make(arr)


def zeros_state(p) -> Tensor:
    return state_tensor(np.zeros_like(p._data))


def step_state(value=0.0) -> Tensor:
    """The step count: a float32 0-d tensor, as torch's (``_get_scalar_dtype``)."""
    return Tensor._make(np.array(value, dtype=np.float32))


class Optimizer:
    """Base class of ca.optim's optimizers (torch.optim.Optimizer's behaviour)."""

    def __init__(self, params, defaults):
        self.defaults = defaults
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable "
                            f"of Tensors or dicts, but got {type(params).__name__}")
        self.state = defaultdict(dict)
        self.param_groups = []
        self._scratch = Scratch()
        self._optimizer_step_pre_hooks = HookDict()
        self._optimizer_step_post_hooks = HookDict()
        self._optimizer_state_dict_pre_hooks = HookDict()
        self._optimizer_state_dict_post_hooks = HookDict()
        self._optimizer_load_state_dict_pre_hooks = HookDict()
        self._optimizer_load_state_dict_post_hooks = HookDict()
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    def __repr__(self):
        out = type(self).__name__ + " ("
        for i, group in enumerate(self.param_groups):
            out += f"\nParameter Group {i}\n"
            for key in sorted(group):
                if key != "params":
                    out += f"    {key}: {group[key]}\n"
        return out + ")"

    # ------------------------------------------------------------ groups

    def add_param_group(self, param_group):
        """Add a group of parameters (with its own options) to ``param_groups``."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group)}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        else:
            params = list(params)
        names = [p[0] for p in params if isinstance(p, tuple)]
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
        if names and len(names) != len(tensors):
            raise ValueError("all optimizer params should be with/without names. Some param "
                             "names are missing")
        for p in tensors:
            if not isinstance(p, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is "
                                f"{type(p).__module__}.{type(p).__name__}")
            if not (p.is_leaf or p.retains_grad):
                raise ValueError("can't optimize a non-leaf Tensor")
        group = dict(param_group)
        group["params"] = tensors
        if names:
            group["param_names"] = names
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError("parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            group.setdefault(name, default)
        if len(tensors) != len(set(map(id, tensors))):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; "
                          "in future, this will cause an error; see github.com/pytorch/"
                          "pytorch/issues/40967 for more information", stacklevel=3)
        seen = set()
        for other in self.param_groups:
            seen.update(map(id, other["params"]))
            if ("param_names" in group) != ("param_names" in other):
                which = "with names" if "param_names" in group else "without names"
                raise ValueError("all optimizer param groups should be with/without names. "
                                 f"cannot add param group {which} to the optimizer")
        if seen.intersection(map(id, tensors)):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)
        self._on_new_group(group)

    def _on_new_group(self, group):
        """A hook for optimizers whose state starts with the group (Adagrad)."""

    # ------------------------------------------------------------ grads and steps

    def zero_grad(self, set_to_none=True):
        """Reset the gradients: to None (default), or to zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    g = p.grad
                    if g.grad_fn is not None:
                        g.detach_()
                    else:
                        g.requires_grad_(False)
                    g._data.fill(0)
                    g._version_counter.bump()

    def step(self, *args, **kwargs):
        """Update every parameter that has a gradient; ``closure`` (re-evaluating the
        model, returning the loss) runs first, with grad enabled. The step hooks run
        around it, as torch's: ``pre(optimizer, args, kwargs)`` (``args`` start with
        the optimizer) may return new ``(args, kwargs)``."""
        args = (self,) + args
        for hook in tuple(self._optimizer_step_pre_hooks.values()):
            result = hook(self, args, kwargs)
            if result is not None:
                if isinstance(result, tuple) and len(result) == 2:
                    args, kwargs = result
                else:
                    raise RuntimeError(f"{type(self).__name__}.step must return None or a "
                                       f"tuple of (new_args, new_kwargs), but got {result}.")
        loss = self._step(*args[1:], **kwargs)
        for hook in tuple(self._optimizer_step_post_hooks.values()):
            hook(self, args, kwargs)
        return loss

    def _step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        todo = [(p, group) for group in self.param_groups for p in group["params"]
                if p._grad is not None]    # (none after a backward that updated them)
        if todo:
            with no_grad():
                for p, group in todo:
                    self._step_param(p, group)
        return loss

    # ------------------------------------------------------------ hooks (torch's)

    @staticmethod
    def _register(hooks, hook, prepend=False):
        handle = RemovableHandle(hooks)
        if prepend:
            rest = list(hooks.items())
            hooks.clear()
            hooks[handle.id] = hook
            hooks.update(rest)
        else:
            hooks[handle.id] = hook
        return handle

    def register_step_pre_hook(self, hook):
        """``hook(optimizer, args, kwargs) -> None or (args, kwargs)`` before ``step``."""
        return self._register(self._optimizer_step_pre_hooks, hook)

    def register_step_post_hook(self, hook):
        """``hook(optimizer, args, kwargs)`` after ``step``."""
        return self._register(self._optimizer_step_post_hooks, hook)

    def register_state_dict_pre_hook(self, hook, prepend=False):
        """``hook(optimizer)`` before ``state_dict`` builds the dict."""
        return self._register(self._optimizer_state_dict_pre_hooks, hook, prepend)

    def register_state_dict_post_hook(self, hook, prepend=False):
        """``hook(optimizer, state_dict) -> None or a new state_dict``."""
        return self._register(self._optimizer_state_dict_post_hooks, hook, prepend)

    def register_load_state_dict_pre_hook(self, hook, prepend=False):
        """``hook(optimizer, state_dict) -> None or the state_dict to load``."""
        return self._register(self._optimizer_load_state_dict_pre_hooks, hook, prepend)

    def register_load_state_dict_post_hook(self, hook, prepend=False):
        """``hook(optimizer)`` after ``load_state_dict``."""
        return self._register(self._optimizer_load_state_dict_post_hooks, hook, prepend)

    def _step_param(self, p, group):
        """Update ``p`` from ``p.grad`` by the rule of ``group`` (in place)."""
        grad = p.grad
        state = self.state.get(p)
        if not state:
            state = {}
            self._init_state(p, group, state)
        g = grad._data
        if g.dtype != p._data.dtype or g.shape != p._data.shape:
            raise RuntimeError(f"the gradient of a parameter of shape {list(p.shape)} and "
                               f"dtype {p.dtype} is of shape {list(grad.shape)} and dtype "
                               f"{grad.dtype}")
        self._update(p._data, g, state, group, self._scratch, self._scalars(group, state))
        if state:   # (SGD without momentum keeps none, as torch)
            self.state[p] = state
        p._version_counter.bump()

    def _init_state(self, p, group, state):
        raise NotImplementedError

    def _state_ready(self, state, group) -> bool:
        """Whether ``state`` holds every array an update of ``group`` writes (a
        traced update has no first step: it writes arrays that exist). Depends on
        the group and the state's keys only (asked once per backward for them)."""
        return bool(state)

    def _scalars_key(self, state):
        """What of ``state`` the floats of ``_scalars`` read (None: they read only the
        group): a traced update collects the floats once per backward, group and
        value of this."""
        return float(state["step"]._data)

    def _scalars(self, group, state) -> dict:
        """The floats this update computes with (``sc`` of ``_update``): every
        option a scheduler may change, and what depends on the step count. The
        rule reads no float of ``group`` itself, so that traced (``in_backward``)
        they are the graph's runtime scalars."""
        raise NotImplementedError

    def _update(self, p, g, state, group, scratch, sc, xp=np):
        """One parameter's rule, in place: ``p`` (its array) from ``g`` and
        ``state``, with the floats ``sc`` and the array functions of ``xp``
        (numpy; ``optim.traced.TRACE`` when traced into a compiled backward)."""
        raise NotImplementedError

    # ------------------------------------------------------------ state_dict

    def state_dict(self):
        """``{'state': {index: {...}}, 'param_groups': [{..., 'params': [indices]}]}``:
        torch's format; the state's tensors are the optimizer's own (not copies)."""
        for hook in tuple(self._optimizer_state_dict_pre_hooks.values()):
            hook(self)
        mapping = {}
        start = 0
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                mapping.setdefault(id(p), i)
            packed["params"] = [mapping[id(p)] for p in group["params"]]
            start += len(packed["params"])
            groups.append(packed)
        state = {(mapping[id(k)] if isinstance(k, Tensor) else k): v
                 for k, v in self.state.items()}
        out = {"state": state, "param_groups": groups}
        for hook in tuple(self._optimizer_state_dict_post_hooks.values()):
            result = hook(self, out)
            if result is not None:
                out = result
        return out

    def load_state_dict(self, state_dict):
        """Load a ``state_dict()`` (this optimizer's or another's of the same kind):
        the state is copied (unlike torch, which may share the loaded tensors)."""
        state_dict = dict(state_dict)
        for hook in tuple(self._optimizer_load_state_dict_pre_hooks.values()):
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        groups = self.param_groups
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))
        state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = {key: _cast(param, key, value) for key, value in v.items()}
            else:
                state[k] = copy.deepcopy(v)
        for group, new in zip(groups, saved_groups):
            new["params"] = group["params"]
            if "param_names" in group and "param_names" not in new:
                new["param_names"] = group["param_names"]
            for key, default in self.defaults.items():   # an older state_dict (torch's
                new.setdefault(key, default)              # __setstate__ does the same)
        self.state = state
        self.param_groups[:] = saved_groups
        for hook in tuple(self._optimizer_load_state_dict_post_hooks.values()):
            hook(self)


def _cast(param, key, value):
    """A copy of a loaded state value: a tensor of the parameter's dtype (the step
    count stays float32), anything else deep-copied."""
    if key == "step":   # (a number in torch's older state_dicts)
        return step_state(float(value._data if isinstance(value, Tensor) else value))
    if not isinstance(value, Tensor):
        return copy.deepcopy(value)
    dtype = param.dtype if value.dtype.kind == "f" else value.dtype
    return state_tensor(np.array(value._data, dtype=dtype, order="C", copy=True))
