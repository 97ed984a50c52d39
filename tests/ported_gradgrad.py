"""gradgradcheck for tests ported from PyTorch's suite (torch.autograd.gradgradcheck's
contract, on ca's gradcheck): the gradients of ``fn`` w.r.t. its inputs that require
grad, computed with ``create_graph=True``, are themselves checked by central
differences, w.r.t. both those inputs and the grad_outputs."""
from __future__ import annotations

import numpy as np

import compiled_autograd as ca


def gradgradcheck(fn, inputs, grad_outputs=None, **kwargs):
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    outputs = fn(*inputs)
    outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
    if grad_outputs is None:
        rng = np.random.default_rng(0)
        grad_outputs = tuple(ca.tensor(rng.standard_normal(o.shape), dtype=np.float64,
                                       requires_grad=True) for o in outputs)
    grad_outputs = tuple(grad_outputs) if isinstance(grad_outputs, (tuple, list)) \
        else (grad_outputs,)
    n = len(inputs)
    diff = [i for i, x in enumerate(inputs) if isinstance(x, ca.Tensor) and x.requires_grad]

    def new_fn(*args):
        ins, gos = args[:n], args[n:]
        outs = fn(*ins)
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        grads = ca.autograd.grad(outs, [ins[i] for i in diff], gos, create_graph=True,
                                 allow_unused=True)
        return tuple(g for g in grads if g is not None)

    return ca.autograd.gradcheck(new_fn, inputs + grad_outputs, **kwargs)
