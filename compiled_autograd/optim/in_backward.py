"""``in_backward(optimizer)``: each parameter's update runs inside the backward.

torch users do this by hand (``register_post_accumulate_grad_hook``, one optimizer per
parameter; torch's tutorial "How to save memory by fusing the optimizer step into the
backward pass"). Here one call does it for a whole optimizer: a post-accumulate-grad
hook on every parameter runs the optimizer's own update of that parameter
(``Optimizer._step_param``, the formula ``step`` runs) as soon as the gradient is
final, then sets ``.grad`` to None, so each gradient is freed while the backward goes
on, and the peak holds at most one gradient instead of all of them.

Compiled autograd places these hooks as ``call_hook[post_acc_grad_hook]`` nodes right
after each parameter's gradient, so the same holds on every backend ("eager",
"python", "c", a user's compiler).

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

from compiled_autograd.optim.optimizer import Optimizer


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
            self._handles.append(p.register_post_accumulate_grad_hook(self._update_hook))

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
