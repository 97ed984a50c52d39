"""gradcheck: analytic gradients (vector-Jacobian products through the engine)
against central differences, in float64 (torch.autograd.gradcheck's contract)."""
from __future__ import annotations

import numpy as np

from compiled_autograd.autograd.engine import grad
from compiled_autograd.autograd.tensor import Tensor


class GradcheckError(RuntimeError):
    """Raised by gradcheck when analytic and numerical Jacobians disagree."""


def _outputs(fn, inputs):
    out = fn(*inputs)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _analytic(outputs, diff_inputs):
    """jac[k][o] has shape (numel(input k), numel(output o))."""
    jac = [[np.zeros((x.numel(), o.numel())) for o in outputs] for x in diff_inputs]
    for oi, o in enumerate(outputs):
        if not o.requires_grad:
            continue
        for j in range(o.numel()):
            onehot = np.zeros(o.numel(), dtype=o.dtype)
            onehot[j] = 1
            gs = grad([o], diff_inputs, [Tensor._make(onehot.reshape(o.shape))],
                      retain_graph=True, allow_unused=True)
            for k, g in enumerate(gs):
                if g is not None:
                    jac[k][oi][:, j] = g._data.reshape(-1)
    return jac


def _numerical(fn, inputs, diff_inputs, outputs, eps):
    # Grad mode stays on: fn may itself call autograd.grad (gradient penalties).
    jac = [[np.zeros((x.numel(), o.numel())) for o in outputs] for x in diff_inputs]
    for k, x in enumerate(diff_inputs):
        data = x._data  # perturbed in place (whatever its strides), restored after
        for i, idx in enumerate(np.ndindex(data.shape)):
            orig = data[idx]
            data[idx] = orig + eps
            plus = [o._data.astype(np.float64).reshape(-1) for o in _outputs(fn, inputs)]
            data[idx] = orig - eps
            minus = [o._data.astype(np.float64).reshape(-1) for o in _outputs(fn, inputs)]
            data[idx] = orig
            for oi in range(len(outputs)):
                jac[k][oi][i, :] = (plus[oi] - minus[oi]) / (2 * eps)
    return jac


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True) -> bool:
    """Check ``fn``'s gradients w.r.t. the inputs that require grad by central
    differences. Inputs that require grad should be float64."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    diff_inputs = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
    if not diff_inputs:
        raise ValueError("gradcheck expects at least one input tensor to require gradient")
    for i, x in enumerate(diff_inputs):
        if x.dtype != np.float64:
            raise GradcheckError(f"Input #{i} requires gradient and is not a double precision "
                                 f"floating point ({x.dtype.name}); gradcheck needs float64")
    for i, x in enumerate(inputs):
        if (isinstance(x, Tensor) and x.requires_grad and x.numel() > 0
                and any(st == 0 and sz > 1 for st, sz in zip(x._data.strides, x.shape))):
            raise RuntimeError(
                f"The {i}th input has a dimension with stride 0. gradcheck only supports "
                "inputs that are non-overlapping to be able to compute the numerical "
                "gradients correctly. You should call .contiguous on the input before "
                "passing it to gradcheck.")
    outputs = _outputs(fn, inputs)
    if not any(isinstance(o, Tensor) and o.requires_grad for o in outputs):
        # torch's _check_no_differentiable_outputs: the numerical gradient must be zero
        for per_input in _numerical(fn, inputs, diff_inputs, outputs, eps):
            if any(np.count_nonzero(jac) for jac in per_input):
                if not raise_exception:
                    return False
                raise GradcheckError("Numerical gradient for function expected to be zero")
        return True
    analytic = _analytic(outputs, diff_inputs)
    numerical = _numerical(fn, inputs, diff_inputs, outputs, eps)
    for k in range(len(diff_inputs)):
        for oi in range(len(outputs)):
            a, n = analytic[k][oi], numerical[k][oi]
            if not np.allclose(a, n, rtol=rtol, atol=atol):
                if not raise_exception:
                    return False
                raise GradcheckError(
                    f"Jacobian mismatch for output {oi} with respect to input {k},\n"
                    f"numerical:{n}\nanalytical:{a}\n")
    return True
