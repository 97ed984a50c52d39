"""Adam and AdamW (torch's foreach rule, bias corrections in Python floats)."""
from __future__ import annotations

import numpy as np

from compiled_autograd.optim import _rules
from compiled_autograd.optim.optimizer import Optimizer, step_state, zeros_state


class Adam(Optimizer):
    """torch.optim.Adam: ``m.lerp_(g, 1 - beta1)``, ``v = beta2 v + (1 - beta2) g^2``,
    ``p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``; ``amsgrad``
    keeps the running maximum of ``v``; ``decoupled_weight_decay`` is AdamW."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        _rules.check_unsupported(type(self).__name__, defaults)
        super().__init__(params, defaults)

    def _init_state(self, p, group, state):
        state["step"] = step_state()
        state["exp_avg"] = zeros_state(p)
        state["exp_avg_sq"] = zeros_state(p)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = zeros_state(p)

    def _scalars(self, group, state):
        lr, (beta1, beta2) = group["lr"], group["betas"]
        t = float(state["step"]._data) + 1          # (this update's step)
        return {"lr": lr, "beta1": beta1, "beta2": beta2, "eps": group["eps"],
                "weight_decay": group["weight_decay"],
                "step_size": (lr / (1 - beta1 ** t)) * -1,
                "bias_correction2_sqrt": (1 - beta2 ** t) ** 0.5}

    def _update(self, p, g, state, group, scratch, sc, xp=np):
        lr, wd = sc["lr"], sc["weight_decay"]
        beta1, beta2 = sc["beta1"], sc["beta2"]
        decoupled = group["decoupled_weight_decay"]
        g = _rules.effective_grad(p, g, scratch, group["maximize"], 0 if decoupled else wd, xp)
        step = state["step"]._data
        step += 1
        if wd != 0 and decoupled:
            p *= 1 - lr * wd
        m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data
        tmp = scratch.get(p, 1)
        _rules.lerp_(m, g, 1 - beta1, tmp, xp)
        v *= beta2
        _rules.addcmul_(v, g, g, 1 - beta2, tmp, xp)
        if group["amsgrad"]:
            mx = state["max_exp_avg_sq"]._data
            xp.maximum(mx, v, out=mx)
            xp.sqrt(mx, out=tmp)
        else:
            xp.sqrt(v, out=tmp)
        tmp /= sc["bias_correction2_sqrt"]
        tmp += sc["eps"]
        _rules.addcdiv_(p, m, tmp, sc["step_size"], tmp, xp)


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (``p *= 1 - lr * wd``)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
