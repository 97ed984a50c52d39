"""Adagrad (torch's foreach rule): lr decay, weight decay, initial accumulator, maximize."""
from __future__ import annotations

import numpy as np

from compiled_autograd.optim import _rules
from compiled_autograd.optim.optimizer import Optimizer, state_tensor, step_state


class Adagrad(Optimizer):
    """torch.optim.Adagrad: ``sum += g^2``, ``p -= clr g / (sqrt(sum) + eps)`` with
    ``clr = lr / (1 + (step - 1) lr_decay)``. Its state is made with the optimizer."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0,
                 initial_accumulator_value=0, eps=1e-10, foreach=None, *, maximize=False,
                 differentiable=False, fused=None):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= lr_decay:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= initial_accumulator_value:
            raise ValueError(f"Invalid initial_accumulator_value value: "
                             f"{initial_accumulator_value}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value,
                        foreach=foreach, maximize=maximize, differentiable=differentiable,
                        fused=fused)
        _rules.check_unsupported("Adagrad", defaults)
        super().__init__(params, defaults)

    def _on_new_group(self, group):
        for p in group["params"]:
            self._init_state(p, group, self.state[p])

    def _init_state(self, p, group, state):
        state["step"] = step_state()
        state["sum"] = state_tensor(np.full_like(p._data, group["initial_accumulator_value"]))

    def _scalars(self, group, state):
        t = float(state["step"]._data) + 1          # (this update's step)
        return {"weight_decay": group["weight_decay"], "eps": group["eps"],
                "clr": -group["lr"] / (1 + (t - 1) * group["lr_decay"])}

    def _update(self, p, g, state, group, scratch, sc, xp=np):
        g = _rules.effective_grad(p, g, scratch, group["maximize"], sc["weight_decay"], xp)
        step = state["step"]._data
        step += 1
        acc = state["sum"]._data
        tmp = scratch.get(p, 1)
        _rules.addcmul_(acc, g, g, 1, tmp, xp)
        xp.sqrt(acc, out=tmp)
        tmp += sc["eps"]
        num = scratch.get(p, 0)
        xp.multiply(g, sc["clr"], out=num)
        _rules.addcdiv_(p, num, tmp, 1, tmp, xp)
