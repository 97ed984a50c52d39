"""ca.optim.in_backward: each parameter's update inside the backward, on every backend,
equals a separate step(); .grad is None after; the peak of a step falls."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.examples.mlp import make_mlp
from helpers import BACKENDS

OPTIMIZERS = [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
              ("Adam", dict(lr=0.01, amsgrad=True)),
              ("AdamW", dict(lr=0.01, weight_decay=0.1)),
              ("RMSprop", dict(lr=0.01, centered=True, momentum=0.5)),
              ("Adagrad", dict(lr=0.1, lr_decay=0.01))]


def _backward(loss, backend):
    ctx = (contextlib.nullcontext() if backend == "eager"
           else ca.compiled_backward(backend=backend))
    with ctx:
        loss.backward()


def _train(name, kwargs, backend, wrapped, steps=6, sched=False):
    ex = make_mlp(layers=3, width=8, batch=4)
    opt = getattr(ca.optim, name)(ex.parameters(), **kwargs)
    if wrapped:
        opt = ca.optim.in_backward(opt)
    s = ca.optim.lr_scheduler.StepLR(opt, 2, 0.5) if sched else None
    for _ in range(steps):
        opt.zero_grad()
        _backward(ex.loss(), backend)
        if wrapped:
            assert all(p.grad is None for p in ex.parameters())
        opt.step()
        if s is not None:
            s.step()
    return ex, opt


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,kwargs", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_equals_a_separate_step(name, kwargs, backend):
    ref, ref_opt = _train(name, kwargs, backend, wrapped=False)
    got, got_opt = _train(name, kwargs, backend, wrapped=True)
    for a, b in zip(ref.parameters(), got.parameters()):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-5, atol=1e-7)
    ours, theirs = got_opt.state_dict(), ref_opt.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    for i, st in theirs["state"].items():
        for k, v in st.items():
            np.testing.assert_allclose(ours["state"][i][k].numpy(), v.numpy(), rtol=1e-5,
                                       atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_scheduler_drives_the_update_inside(backend):
    ref, _ = _train("SGD", dict(lr=0.1, momentum=0.9), backend, wrapped=False, sched=True)
    got, opt = _train("SGD", dict(lr=0.1, momentum=0.9), backend, wrapped=True, sched=True)
    assert opt.param_groups[0]["lr"] == 0.1 * 0.5 ** 3
    for a, b in zip(ref.parameters(), got.parameters()):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", ["python", "c"])
def test_lr_change_is_not_a_recompile(backend):
    # The first update makes Adam's state (its graph calls the update as Python);
    # the second compiles the traced update; every later one, each with a new lr
    # (and new bias corrections), is a cache hit.
    ex = make_mlp(layers=2, width=8, batch=4)
    opt = ca.optim.in_backward(ca.optim.Adam(ex.parameters(), lr=0.01))
    ca.reset_compiled_autograd()
    for step in range(6):
        opt.param_groups[0]["lr"] = 0.01 / (step + 1)
        _backward(ex.loss(), backend)
    stats = ca.compiled_autograd_stats()
    assert stats["compiles"] == 2 and stats["cache_hits"] == 4


def test_step_zero_grad_closure_and_remove():
    ex = make_mlp(layers=2, width=8, batch=4)
    params = ex.parameters()
    opt = ca.optim.in_backward(ca.optim.SGD(params, lr=0.1))
    before = [p.detach().numpy().copy() for p in params]
    loss = opt.step(lambda: (ex.loss().backward(), 7)[1])   # the closure's backward updates
    assert loss == 7 and all(p.grad is None for p in params)
    moved = [p.detach().numpy().copy() for p in params]
    assert all(not np.array_equal(a, b) for a, b in zip(before, moved))
    opt.step()                                             # nothing left to update
    opt.zero_grad()
    for a, b in zip(moved, params):
        np.testing.assert_array_equal(a, b.detach().numpy())
    params[0].grad = ca.ones_like(params[0])                # a gradient set by hand: step()
    opt.step()
    np.testing.assert_allclose(params[0].detach().numpy(), moved[0] - 0.1, rtol=1e-6)
    opt.remove()                                           # plain optimizer again
    opt.zero_grad()
    ex.loss().backward()
    assert all(p.grad is not None for p in params)
    with pytest.raises(RuntimeError, match="already run in the backward"):
        ca.optim.in_backward(ca.optim.in_backward(ca.optim.SGD(params, lr=0.1)))
    with pytest.raises(TypeError, match="is not an Optimizer"):
        ca.optim.in_backward(object())


def test_add_param_group_is_hooked():
    a = ca.nn.Parameter(np.ones(2, np.float32))
    b = ca.nn.Parameter(np.ones(2, np.float32))
    opt = ca.optim.in_backward(ca.optim.SGD([a], lr=0.1))
    opt.add_param_group({"params": [b], "lr": 1.0})
    (a * 1 + b * 2).sum().backward()
    np.testing.assert_allclose(a.detach().numpy(), [0.9, 0.9])
    np.testing.assert_allclose(b.detach().numpy(), [-1.0, -1.0])
    assert a.grad is None and b.grad is None


def _step_peak(backend, wrapped, batch):
    ex = make_mlp(layers=6, width=256, batch=batch)
    opt = ca.optim.SGD(ex.parameters(), lr=1e-3, momentum=0.9)
    if wrapped:
        opt = ca.optim.in_backward(opt)

    def step():
        opt.zero_grad()
        _backward(ex.loss(), backend)
        opt.step()
    step()   # (the state is made, the backward compiled)
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        step()
    return prof.peak_bytes, sum(p.numel() * 4 for p in ex.parameters())


@pytest.mark.parametrize("backend", BACKENDS)
def test_peak_of_a_step_falls(backend):
    """6 x 256x256 MLP, batch 8: the peak falls by at least the gradients' size minus
    the largest one (1.3 MB). (At batch 32 the activations still alive early in the
    backward, where the peak moves, take 0.2 MB of that: docs/optim.md.)"""
    plain, grad_bytes = _step_peak(backend, False, 8)
    inside, _ = _step_peak(backend, True, 8)
    assert grad_bytes == 6 * (256 * 256 + 256) * 4
    largest = (256 * 256 + 256) * 4
    assert plain - inside >= 1.2e6
    assert plain - inside >= grad_bytes - largest - 64 * 1024   # (the batch's activations)
