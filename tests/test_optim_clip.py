"""ca.nn.utils.clip_grad_norm_ and clip_grad_value_ against torch.nn.utils."""
from __future__ import annotations

import math

import numpy as np
import pytest

import compiled_autograd as ca
from helpers import needs_torch, torch

RNG = np.random.default_rng(3)
SHAPES = [(4, 3), (3,), (2, 2, 2)]


def _pairs(scale=1.0, dtype=np.float32):
    grads = [(RNG.standard_normal(s) * scale).astype(dtype) for s in SHAPES]
    ours, theirs = [], []
    for g in grads:
        p = ca.nn.Parameter(ca.from_numpy(np.zeros_like(g)))
        p.grad = ca.from_numpy(g.copy())
        t = torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.from_numpy(g).dtype))
        t.grad = torch.from_numpy(g.copy())
        ours.append(p)
        theirs.append(t)
    return ours, theirs


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, 0.5, math.inf, -math.inf, 0.0, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
@pytest.mark.parametrize("foreach", [None, True])
def test_clip_grad_norm_follows_torch(norm_type, max_norm, dtype, foreach):
    ours, theirs = _pairs(dtype=dtype)
    nt = float(norm_type)
    kw = {} if foreach is None else dict(foreach=foreach)
    a = ca.nn.utils.clip_grad_norm_(ours, max_norm, nt, **kw)
    b = torch.nn.utils.clip_grad_norm_(theirs, max_norm, nt, **kw)
    assert a.dtype == b.numpy().dtype and a.shape == ()
    np.testing.assert_allclose(a.item(), b.item(), rtol=1e-5)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-7)


@needs_torch
def test_clip_grad_norm_nonfinite():
    ours, theirs = _pairs()
    ours[1].grad.numpy()[0] = np.inf
    theirs[1].grad.numpy()[0] = np.inf
    with pytest.raises(RuntimeError, match="The total norm of order 2.0 for gradients from "
                                           "`parameters` is non-finite"):
        ca.nn.utils.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=True)
    before = [p.grad.numpy().copy() for p in ours]
    for p, b in zip(ours, before):   # the error changed nothing
        np.testing.assert_array_equal(p.grad.numpy(), b)
    a = ca.nn.utils.clip_grad_norm_(ours, 1.0)
    b = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert math.isinf(a.item()) and math.isinf(b.item())
    for p, t in zip(ours, theirs):
        np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy())


@needs_torch
def test_clip_grad_value_follows_torch():
    ours, theirs = _pairs(scale=2.0)
    assert ca.nn.utils.clip_grad_value_(ours, 0.7) is None
    torch.nn.utils.clip_grad_value_(theirs, 0.7)
    for p, t in zip(ours, theirs):
        np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy())


def test_clip_in_place_and_edge_cases():
    p = ca.nn.Parameter(np.ones(3, np.float32))
    assert ca.nn.utils.clip_grad_norm_([p], 1.0).item() == 0.0     # no grads: 0
    p.grad = ca.tensor([3.0, 4.0, 0.0])
    g, v = p.grad, p.grad._version
    total = ca.nn.utils.clip_grad_norm_(p, 1.0)                      # a single Tensor
    assert total.item() == 5.0 and p.grad is g and g._version == v + 1
    np.testing.assert_allclose(g.numpy(), [0.6, 0.8, 0.0], rtol=1e-6)
    ca.nn.utils.clip_grad_value_(p, 0.7)
    np.testing.assert_allclose(g.numpy(), [0.6, 0.7, 0.0], rtol=1e-6)
