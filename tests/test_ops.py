"""Every public op: forward and gradient against torch (float32, rtol 1e-4) and
against central differences (gradcheck, float64); gradients keep the input dtype."""
import numpy as np
import pytest

import compiled_autograd as ca
from helpers import assert_close, needs_torch, run_ca, run_torch
from op_cases import CASES, make_inputs

IDS = [c[0] for c in CASES]


@needs_torch
@pytest.mark.parametrize("name,fn,specs", CASES, ids=IDS)
def test_matches_torch(name, fn, specs):
    arrays, grads = make_inputs(specs, seed=len(name))
    out, ours = run_ca(fn, arrays, grads)
    t_out, theirs = run_torch(fn, arrays, grads)
    assert_close(out, t_out, what=f"{name} forward")
    for i, (g, tg) in enumerate(zip(ours, theirs)):
        if grads[i]:
            assert_close(g, tg, what=f"{name} grad of input {i}")


@pytest.mark.parametrize("name,fn,specs", CASES, ids=IDS)
def test_gradcheck_float64(name, fn, specs):
    arrays, grads = make_inputs(specs, seed=len(name) + 1)
    inputs = [ca.tensor(a, dtype=np.float64, requires_grad=True) if g else ca.from_numpy(a)
              for a, g in zip(arrays, grads)]
    assert ca.autograd.gradcheck(lambda *xs: fn(ca, *xs), inputs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,fn,specs", CASES, ids=IDS)
def test_grad_dtype_and_shape(name, fn, specs, dtype):
    arrays, grads = make_inputs(specs, seed=3)
    out, ours = run_ca(fn, arrays, grads, dtype=dtype)
    assert out.dtype == dtype
    for a, g, needs in zip(arrays, ours, grads):
        if needs:
            assert g.dtype == dtype and g.shape == a.shape
