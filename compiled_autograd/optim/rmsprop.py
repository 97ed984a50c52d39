"""RMSprop (torch's foreach rule): centered, momentum, weight decay, maximize."""
from __future__ import annotations

import numpy as np

from compiled_autograd.optim import _rules
from compiled_autograd.optim.optimizer import Optimizer, step_state, zeros_state


class RMSprop(Optimizer):
    """torch.optim.RMSprop: ``sq = alpha sq + (1 - alpha) g^2``; ``avg = sqrt(sq -
    grad_avg^2) + eps`` if centered else ``sqrt(sq) + eps``; ``buf = momentum buf +
    g / avg`` and ``p -= lr buf``, or ``p -= lr g / avg`` without momentum."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, capturable=capturable, foreach=foreach,
                        maximize=maximize, differentiable=differentiable)
        _rules.check_unsupported("RMSprop", defaults)
        super().__init__(params, defaults)

    def _init_state(self, p, group, state):
        state["step"] = step_state()
        state["square_avg"] = zeros_state(p)
        if group["momentum"] > 0:
            state["momentum_buffer"] = zeros_state(p)
        if group["centered"]:
            state["grad_avg"] = zeros_state(p)

    def _state_ready(self, state, group):
        # (its momentum buffer is made with the state: a momentum set later has none)
        return bool(state) and (group["momentum"] <= 0 or "momentum_buffer" in state)

    def _scalars_key(self, state):
        return None

    def _scalars(self, group, state):
        return {k: group[k] for k in ("lr", "alpha", "eps", "weight_decay", "momentum")}

    def _update(self, p, g, state, group, scratch, sc, xp=np):
        alpha, eps, lr = sc["alpha"], sc["eps"], sc["lr"]
        g = _rules.effective_grad(p, g, scratch, group["maximize"], sc["weight_decay"], xp)
        step = state["step"]._data
        step += 1
        sq = state["square_avg"]._data
        tmp = scratch.get(p, 1)
        sq *= alpha
        _rules.addcmul_(sq, g, g, 1 - alpha, tmp, xp)
        if group["centered"]:
            ga = state["grad_avg"]._data
            _rules.lerp_(ga, g, 1 - alpha, tmp, xp)
            xp.multiply(ga, ga, out=tmp)
            xp.subtract(sq, tmp, out=tmp)
            xp.sqrt(tmp, out=tmp)
        else:
            xp.sqrt(sq, out=tmp)
        tmp += eps
        if sc["momentum"] > 0:
            buf = state["momentum_buffer"]._data
            buf *= sc["momentum"]
            _rules.addcdiv_(buf, g, tmp, 1, tmp, xp)
            _rules.add_scaled_(p, buf, -lr, tmp, xp)
        else:
            _rules.addcdiv_(p, g, tmp, -lr, tmp, xp)
