"""The worked example of docs/architecture.md: ``log1p``, added as one block in the
prim table. Its gradient in float64 next to torch's, on the eager engine and on the
C backend (which lowers it from the entry's ``c=Elementwise("log1p({{ a }})")``).

    python docs/examples/log1p.py
"""
import numpy as np
import torch

import compiled_autograd as ca

x_np = np.array([-0.5, 0.0, 1e-8, 2.0])
x = ca.tensor(x_np, requires_grad=True, dtype=np.float64)
x.log1p().sum().backward()
t = torch.tensor(x_np, requires_grad=True)
t.log1p().sum().backward()
y = ca.tensor(x_np, requires_grad=True, dtype=np.float64)
with ca.compiled_backward(backend="c"):
    ca.log1p(y).sum().backward()
print("ca (eager)", x.grad.numpy())
print("ca (c)    ", y.grad.numpy())
print("torch     ", t.grad.numpy())
print("max |ca - torch|:", np.abs(x.grad.numpy() - t.grad.numpy()).max(),
      " max |c - torch|:", np.abs(y.grad.numpy() - t.grad.numpy()).max())
