"""The eager engine's semantics, as torch.autograd's."""
import numpy as np
import pytest

import compiled_autograd as ca
from helpers import assert_close, needs_torch, torch


def test_grad_leaves_dot_grad_untouched():
    a = ca.randn(3, requires_grad=True)
    (g,) = ca.autograd.grad((a * a).sum(), [a])
    assert a.grad is None
    assert_close(g.numpy(), 2 * a.detach().numpy())


def test_grad_computes_only_what_inputs_need():
    a, b = ca.randn(3, requires_grad=True), ca.randn(3, requires_grad=True)
    calls = []
    out = (a.exp() * b.sin()).sum()
    sin_node = out.grad_fn.next_functions[0][0].next_functions[1][0]
    assert sin_node.name() == "SinBackward"
    sin_node.register_prehook(lambda g: calls.append("sin"))
    ca.autograd.grad(out, [a])
    assert calls == []  # the b branch never ran


def test_backward_inputs_accumulates_only_there():
    a, b = ca.randn(3, requires_grad=True), ca.randn(3, requires_grad=True)
    h = a * b
    (h * h).sum().backward(inputs=[b, h])
    assert a.grad is None
    assert_close(b.grad.numpy(), (2 * (a * b) * a).detach().numpy(), rtol=1e-5)
    assert_close(h.grad.numpy(), (2 * h).detach().numpy(), rtol=1e-5)


def test_accumulation_keeps_the_grad_object():
    a = ca.randn(3, requires_grad=True)
    (a * 2).sum().backward()
    g = a.grad
    (a * 3).sum().backward()
    assert a.grad is g
    assert_close(g.numpy(), np.full(3, 5.0))


def test_reused_leaf_gradients_add():
    a = ca.randn(4, requires_grad=True)
    (a * a + a.exp() + a).sum().backward()
    x = a.detach().numpy()
    assert_close(a.grad.numpy(), 2 * x + np.exp(x) + 1, rtol=1e-5)


def test_retain_grad_on_non_leaf():
    a = ca.randn(3, requires_grad=True)
    h = a * 2
    h.retain_grad()
    (h * h).sum().backward()
    assert_close(h.grad.numpy(), (4 * a).detach().numpy(), rtol=1e-5)
    assert h.retains_grad


def test_no_grad_and_enable_grad():
    a = ca.randn(3, requires_grad=True)
    with ca.no_grad():
        b = a * 2
        assert not b.requires_grad and not ca.is_grad_enabled()
        with ca.enable_grad():
            c = a * 2
    assert c.requires_grad and ca.is_grad_enabled()

    @ca.no_grad()
    def f(x):
        return x * 2
    assert not f(a).requires_grad


def _grad_mode_generator_log(m):
    """What a no_grad-decorated generator sees at each step, as torch runs it."""
    log = []

    @m.no_grad
    def gen():
        try:
            got = yield m.is_grad_enabled()
            log.append(("sent", got, m.is_grad_enabled()))
            yield m.is_grad_enabled()
        except KeyError:
            log.append(("thrown", m.is_grad_enabled()))
            yield "recovered"
        finally:
            log.append(("finally", m.is_grad_enabled()))
        return "done"

    g = gen()
    log.append(("first", next(g), m.is_grad_enabled()))
    log.append(("send", g.send(7), m.is_grad_enabled()))
    log.append(("throw", g.throw(KeyError("k")), m.is_grad_enabled()))
    try:
        next(g)
    except StopIteration as e:
        log.append(("return", e.value, m.is_grad_enabled()))
    g2 = gen()
    next(g2)
    g2.close()                                   # its finally runs under no_grad too
    log.append(("closed", m.is_grad_enabled()))
    return log


@needs_torch
def test_grad_mode_decorators_on_generator_functions_as_torch():
    ours = _grad_mode_generator_log(ca)
    assert ours == _grad_mode_generator_log(torch)
    assert ("first", False, True) in ours and ("finally", False) in ours


def test_multiple_roots_and_grad_tensors():
    a = ca.randn(3, requires_grad=True)
    y1, y2 = a * 2, a.exp()
    ca.autograd.backward([y1, y2], [ca.ones(3), ca.full((3,), 2.0)])
    assert_close(a.grad.numpy(), 2 + 2 * np.exp(a.detach().numpy()), rtol=1e-5)


def test_root_depends_on_other_root():
    a = ca.randn(3, requires_grad=True)
    y1 = a * 2
    y2 = (y1 * y1).sum()
    ca.autograd.backward([y2, y1.sum()])
    x = a.detach().numpy()
    assert_close(a.grad.numpy(), 8 * x + 2, rtol=1e-5)


def test_detach_cuts_history():
    a = ca.randn(3, requires_grad=True)
    b = (a * 2).detach() * a
    b.sum().backward()
    assert_close(a.grad.numpy(), (2 * a).detach().numpy())


def _execution_order(m):
    order = []
    a = m.ones(2, requires_grad=True)
    b = m.ones(2, requires_grad=True)
    x = a * 2
    y = b.exp()
    z = x + y
    w = z.sin() * x
    for name, t in (("x", x), ("y", y), ("z", z), ("w", w)):
        t.grad_fn.register_prehook(lambda g, name=name: order.append(name))
    a.register_hook(lambda g: order.append("a"))
    b.register_hook(lambda g: order.append("b"))
    w.sum().backward()
    return order


@needs_torch
def test_execution_order_matches_torch():
    assert _execution_order(ca) == _execution_order(torch)


def test_requires_grad_propagation_and_int_ops():
    a = ca.randn(3, requires_grad=True)
    idx = ca.arange(3)
    assert idx.dtype == np.int64 and not (idx * 2).requires_grad
    assert (a * idx).requires_grad and (a * idx).dtype == np.float32
    assert (idx / 2).dtype == np.float32
    assert not (a > 0).requires_grad and (a > 0).dtype == np.bool_


def test_graph_freed_with_no_references():
    import gc
    import weakref
    a = ca.randn(100, requires_grad=True)
    out = (a.exp() * 2).sum()
    node = weakref.ref(out.grad_fn)
    del out
    gc.collect()
    assert node() is None


def test_backward_and_grad_of_no_outputs_or_no_inputs():
    """As torch 2.13: backward of no tensors does nothing; grad of no outputs finds
    no path to an input; grad needs inputs."""
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    assert ca.autograd.backward([]) is None
    assert x.grad is None
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        ca.autograd.grad([], [x])
    for outputs in ([], (x * 2).sum()):
        with pytest.raises(RuntimeError, match=r"`inputs` argument to `grad\(\)` cannot be empty"):
            ca.autograd.grad(outputs, [])


def test_numpy_under_no_grad_and_no_grad_as_a_bare_decorator():
    """As torch: under no_grad, .numpy() of a tensor that requires grad is its
    storage (outside, the usual refusal); ``@ca.no_grad`` needs no call."""
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="Can't call numpy\\(\\) on Tensor that requires grad"):
        x.numpy()
    with ca.no_grad():
        assert x.numpy() is x._data

    @ca.no_grad
    def mode():
        return ca.is_grad_enabled()

    @ca.enable_grad
    def mode_on():
        return ca.is_grad_enabled()

    assert mode() is False and ca.is_grad_enabled()
    with ca.no_grad():
        assert mode_on() is True
    with ca.set_grad_enabled(False):
        assert not ca.is_grad_enabled()
    assert ca.is_grad_enabled()
