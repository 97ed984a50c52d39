"""create_graph=True: the backward records a differentiable graph (second derivatives)."""
import numpy as np
import pytest

import compiled_autograd as ca
from helpers import assert_close, needs_torch, torch


def _second_derivative(m, fn, x0):
    x = m.tensor(x0, requires_grad=True)
    (g,) = m.autograd.grad(fn(x).sum(), [x], create_graph=True)
    (gg,) = m.autograd.grad(g.sum(), [x])
    return g.detach().numpy(), gg.numpy()


X0 = np.array([-1.5, -0.3, 0.2, 0.7, 2.0])


def test_cube_second_derivative_analytic():
    g, gg = _second_derivative(ca, lambda x: x ** 3, X0.astype(np.float32))
    assert_close(g, 3 * X0 ** 2)
    assert_close(gg, 6 * X0)


def test_tanh_second_derivative_analytic():
    g, gg = _second_derivative(ca, lambda x: x.tanh(), X0.astype(np.float32))
    t = np.tanh(X0)
    assert_close(g, 1 - t ** 2)
    assert_close(gg, -2 * t * (1 - t ** 2))


@needs_torch
def test_cube_and_tanh_match_torch():
    for fn in (lambda x: x ** 3, lambda x: x.tanh(), lambda x: (x * x.sin()).exp()):
        ours = _second_derivative(ca, fn, X0.astype(np.float32))
        theirs = _second_derivative(torch, fn, X0.astype(np.float32))
        for a, b in zip(ours, theirs):
            assert_close(a, b)


def _gelu(m, approximate):
    return lambda x: m.nn.functional.gelu(x, approximate=approximate)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_second_derivative_central_differences(approximate):
    # gelu's derivative is its own prim (gelu_backward), with its own derivative.
    def derivatives(x0):
        x = ca.tensor(x0, dtype=np.float64, requires_grad=True)
        (g,) = ca.autograd.grad(ca.nn.functional.gelu(x, approximate=approximate).sum(), [x],
                                create_graph=True)
        (gg,) = ca.autograd.grad(g.sum(), [x])
        return g.detach().numpy(), gg.numpy()

    x0, h = np.linspace(-4.0, 4.0, 17), 1e-6
    first_right, first_left = derivatives(x0 + h)[0], derivatives(x0 - h)[0]
    assert_close(derivatives(x0)[1], (first_right - first_left) / (2 * h), rtol=1e-6, atol=1e-8)


@needs_torch
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_second_derivative_matches_torch(approximate):
    ours = _second_derivative(ca, _gelu(ca, approximate), X0.astype(np.float32))
    theirs = _second_derivative(torch, _gelu(torch, approximate), X0.astype(np.float32))
    for a, b in zip(ours, theirs):
        assert_close(a, b)


def _grad_norm_penalty(m, arrays, act):
    """loss + ||d loss / d params||^2, then the gradient of that w.r.t. the params."""
    w1, b1, w2, b2, x, y = [m.tensor(a, requires_grad=i < 4) for i, a in enumerate(arrays)]
    params = [w1, b1, w2, b2]
    F = m.nn.functional
    h = act(F.linear(x, w1, b1))
    loss = F.mse_loss(F.linear(h, w2, b2), y)
    grads = m.autograd.grad(loss, params, create_graph=True)
    penalty = sum((g * g).sum() for g in grads)
    total = loss + 0.1 * penalty
    total.backward()
    return [p.grad.numpy() for p in params]


def _mlp_arrays(seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(6, 4), (6,), (3, 6), (3,), (5, 4), (5, 3)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@needs_torch
def test_mlp_gradient_norm_penalty_matches_torch():
    arrays = _mlp_arrays()
    for act in (lambda h: h.tanh(), lambda h: h.sigmoid(), lambda h: h.tanh() * h):
        ours = _grad_norm_penalty(ca, arrays, act)
        theirs = _grad_norm_penalty(torch, arrays, act)
        for a, b in zip(ours, theirs):
            assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_mlp_gradient_norm_penalty_gradcheck():
    arrays = [a.astype(np.float64) for a in _mlp_arrays(1)]

    def penalty(w1, b1, w2, b2):
        F = ca.nn.functional
        x, y = ca.tensor(arrays[4], dtype=np.float64), ca.tensor(arrays[5], dtype=np.float64)
        loss = F.mse_loss(F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2), y)
        grads = ca.autograd.grad(loss, [w1, b1, w2, b2], create_graph=True)
        return loss + sum((g * g).sum() for g in grads)

    params = [ca.tensor(a, dtype=np.float64, requires_grad=True) for a in arrays[:4]]
    assert ca.autograd.gradcheck(penalty, params)


def test_create_graph_leaves_grad_differentiable():
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    (x ** 3).sum().backward(create_graph=True)
    assert x.grad.requires_grad
    (gg,) = ca.autograd.grad(x.grad.sum(), [x])
    assert_close(gg.numpy(), 6 * np.array([1.0, 2.0]))
