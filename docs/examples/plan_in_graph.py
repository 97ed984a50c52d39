"""A memory plan's recomputation, seen in the backward graph (docs/compiled.md)."""
import numpy as np

import compiled_autograd as ca

F = ca.nn.functional
rng = np.random.default_rng(0)
ws = [ca.tensor(rng.standard_normal((32, 32)).astype(np.float32) * 0.2, requires_grad=True)
      for _ in range(3)]
x = ca.tensor(rng.standard_normal((256, 32)).astype(np.float32))


def loss_fn():
    h = x
    for w in ws:
        h = F.gelu(F.linear(h, w))
    return h.tanh().sum()


plan = ca.memory.plan_checkpoints(loss_fn, budget=0.7)
print(plan.table())
with plan:
    loss = loss_fn()
g = ca.trace_backward(loss)
print()
print(g.code)
