"""SGD with momentum, dampening, Nesterov, weight decay and maximize (torch's rule)."""
from __future__ import annotations

import numpy as np

from compiled_autograd.optim import _rules
from compiled_autograd.optim.optimizer import Optimizer, state_tensor


class SGD(Optimizer):
    """torch.optim.SGD: ``buf = momentum * buf + (1 - dampening) * g`` (``g`` on the
    first step), ``g = g + momentum * buf`` if Nesterov else ``buf``, ``p -= lr * g``."""

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False,
                 fused=None):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=foreach, differentiable=differentiable, fused=fused)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        _rules.check_unsupported("SGD", defaults)
        super().__init__(params, defaults)

    def _init_state(self, p, group, state):
        pass   # the momentum buffer is the first step's gradient (torch)

    def _state_ready(self, state, group):
        return group["momentum"] == 0 or state.get("momentum_buffer") is not None

    def _scalars_key(self, state):
        return None

    def _scalars(self, group, state):
        return {"lr": group["lr"], "momentum": group["momentum"],
                "dampening": group["dampening"], "weight_decay": group["weight_decay"]}

    def _update(self, p, g, state, group, scratch, sc, xp=np):
        g = _rules.effective_grad(p, g, scratch, group["maximize"], sc["weight_decay"], xp)
        momentum = sc["momentum"]
        tmp = scratch.get(p, 1)
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:     # (the first step: eager only, see _state_ready)
                state["momentum_buffer"] = state_tensor(np.array(g, order="C", copy=True))
                b = state["momentum_buffer"]._data
            else:
                b = buf._data
                b *= momentum
                _rules.add_scaled_(b, g, 1 - sc["dampening"], tmp, xp)
            if group["nesterov"]:
                g = _rules.axpy_(scratch.get(p, 0), g, momentum, b, tmp, xp)
            else:
                g = b
        _rules.add_scaled_(p, g, -sc["lr"], tmp, xp)
