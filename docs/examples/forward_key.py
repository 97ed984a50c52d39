"""Which backwards take the cache key their forward kept (compiled/forward_key.py),
and which walk the graph for it.

    python docs/examples/forward_key.py
"""
import numpy as np

import compiled_autograd as ca
from compiled_autograd.compiled import forward_key
from compiled_autograd.examples import build

ex = build("mlp", layers=4, width=16, batch=8)
ca.compiled_backward(backend="python")     # compiled autograd in use: forwards keep keys


def backward(loss, **kw):
    before = dict(forward_key.stats)
    with ca.compiled_backward(backend="python"):
        loss.backward(**kw)
    return "took the forward's key" if forward_key.stats["taken"] > before["taken"] \
        else "walked the graph"


class Double(ca.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


cases = {
    "plain": lambda: backward(ex.loss()),
    "a hook on a leaf": lambda: (ex.parameters()[0].register_hook(lambda g: g),
                                 backward(ex.loss()))[1],
    "a hook on an intermediate": lambda: backward(_hooked(ex.loss())),
    "retain_graph twice (second)": lambda: _twice(ex.loss()),
    "two losses, one backward": lambda: backward(ex.loss() + ex.loss()),
    "a custom Function": lambda: backward(Double.apply(ex.loss())),
    "backward(inputs=...)": lambda: backward(ex.loss(), inputs=ex.parameters()[:1]),
    "under saved-tensor hooks": lambda: _under_hooks(),
}


def _hooked(loss):
    loss.register_hook(lambda g: g)
    return loss


def _twice(loss):
    backward(loss, retain_graph=True)
    return backward(loss)


def _under_hooks():
    with ca.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        loss = ex.loss()
    return backward(loss)


for name, case in cases.items():
    print(f"{name:<30} {case()}")
    ex.zero_grad()

forward_key.check_key(True)     # as CA_CHECK_KEY=1: both ways, compared
print("checked against compiled_args:", backward(ex.loss()),
      "-- same key, sizes and values")
print("gradient of the first weight, finite:",
      bool(np.isfinite(ex.parameters()[0].grad.numpy()).all()))
