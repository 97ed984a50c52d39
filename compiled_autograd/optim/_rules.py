"""The pieces every update rule shares, on ndarrays, in place (torch's foreach order).

``g`` is the parameter's gradient array and is never written; a modified gradient
goes to scratch buffer 0, other temporaries to scratch buffer 1 (``Scratch``).
``xp`` is numpy, or ``optim.traced.TRACE`` when the rule is traced into a compiled
backward (its arrays are then ``traced.Buffer``s, its floats runtime scalars).
"""
from __future__ import annotations

import numpy as np

from compiled_autograd.runtime.kernels import call_native

# Options torch's optimizers take that ca has no use for: accepted at their defaults
# (so torch's param_groups and state_dicts load), refused when asked for.
UNSUPPORTED = ("differentiable", "fused", "capturable")


def check_unsupported(name, options):
    for key in UNSUPPORTED:
        if options.get(key):
            raise RuntimeError(f"{name}: `{key}=True` is not supported by ca.optim "
                               "(numpy arrays on the CPU; the foreach path is the only one)")


def axpy_(out, a, alpha, b, tmp, xp=np):
    """``out = a + alpha * b`` (``out`` may be ``a`` or ``b``): numpy's two passes
    (``b * alpha`` into ``tmp``, then the add), or, on arrays, the same roundings in
    one pass in C (``kernels.c``'s ``axpy``) where it applies."""
    if xp is np and call_native("axpy", out, a, alpha, b) is not NotImplemented:
        return out
    xp.multiply(b, alpha, out=tmp)
    xp.add(a, tmp, out=out)
    return out


def effective_grad(p, g, scratch, maximize, weight_decay, xp=np):
    """``-g`` if maximizing, plus ``weight_decay * p`` (torch's L2 penalty)."""
    if maximize:
        s = scratch.get(g, 0)
        xp.negative(g, out=s)
        g = s
    if weight_decay != 0:
        s, t = scratch.get(g, 0), scratch.get(g, 1)
        g = axpy_(s, g, weight_decay, p, t, xp)
    return g


def lerp_(start, end, weight, tmp, xp=np):
    """``start.lerp_(end, weight)`` with torch's two-sided formula."""
    xp.subtract(end, start, out=tmp)
    if -0.5 < weight < 0.5:      # (abs(weight) < 0.5, as comparisons: a traced weight
        #                           keeps a range guard, not its value)
        tmp *= weight
        start += tmp
    else:
        tmp *= 1.0 - weight
        xp.subtract(end, tmp, out=start)


def addcmul_(out, a, b, value, tmp, xp=np):
    """``out += value * a * b``."""
    if value == 1:
        xp.multiply(a, b, out=tmp)
    else:
        xp.multiply(a, value, out=tmp)
        tmp *= b
    out += tmp


def addcdiv_(out, a, b, value, tmp, xp=np):
    """``out += value * (a / b)`` (``tmp`` may be ``a`` or ``b``)."""
    xp.divide(a, b, out=tmp)
    if value != 1:
        tmp *= value
    out += tmp


def add_scaled_(out, a, alpha, tmp, xp=np):
    """``out += alpha * a`` (one pass when ``alpha`` is 1 or -1)."""
    if alpha == 1:
        out += a
    elif alpha == -1:
        out -= a
    else:
        axpy_(out, out, alpha, a, tmp, xp)
