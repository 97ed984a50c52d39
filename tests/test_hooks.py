"""Backward hooks: order and effects as torch's (a recorded list of calls compared
with torch's on the same graph), handles, and errors."""
import contextlib

import numpy as np
import pytest

import compiled_autograd as ca
from helpers import BACKENDS, assert_close, needs_torch, torch


def _record_hooks(m):
    calls = []
    a = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = m.tensor([0.5, -1.0, 2.0], requires_grad=True)
    x = a * b
    y = x.exp()
    z = (y * x).sum()
    x.retain_grad()

    def tag(name):
        return lambda *args: calls.append(name)

    x.register_hook(tag("x.hook1"))
    x.register_hook(tag("x.hook2"))
    y.register_hook(tag("y.hook"))
    a.register_hook(tag("a.hook"))
    a.register_post_accumulate_grad_hook(tag("a.post_acc"))
    b.register_post_accumulate_grad_hook(tag("b.post_acc"))
    x.grad_fn.register_prehook(tag("MulX.pre"))
    x.grad_fn.register_hook(tag("MulX.post"))
    y.grad_fn.register_prehook(tag("Exp.pre"))
    y.grad_fn.register_hook(tag("Exp.post"))
    z.grad_fn.register_hook(tag("Sum.post"))
    acc_a = x.grad_fn.next_functions[0][0]
    acc_a.register_prehook(tag("AccA.pre"))
    acc_a.register_hook(tag("AccA.post"))
    z.backward()
    return calls, a.grad.numpy(), b.grad.numpy(), x.grad.numpy()


@needs_torch
def test_hook_order_matches_torch():
    ours, theirs = _record_hooks(ca), _record_hooks(torch)
    assert ours[0] == theirs[0]
    for a, b in zip(ours[1:], theirs[1:]):
        assert_close(a, b)


def test_hook_order_documented():
    calls = _record_hooks(ca)[0]
    # tensor hooks before the node's pre-hook; post-accumulate-grad before the
    # AccumulateGrad node's post-hook; several hooks in registration order.
    assert calls.index("x.hook1") < calls.index("x.hook2") < calls.index("MulX.pre")
    assert calls.index("a.hook") < calls.index("AccA.pre") < calls.index("a.post_acc") \
        < calls.index("AccA.post")


def _hook_effects(m):
    a = m.tensor([1.0, 2.0], requires_grad=True)
    h = a * 3
    h.register_hook(lambda g: g * 10)                  # replaces the gradient
    out = (h * h).sum()
    out.grad_fn.register_prehook(lambda gs: (gs[0] * 2,))
    handle = a.register_hook(lambda g: g + 1)
    handle.remove()                                     # removed: never runs
    out.backward()
    return a.grad.numpy()


def test_hook_effects():
    # d/da sum((3a)^2) = 18a; pre-hook doubles, tensor hook on h multiplies by 10
    assert_close(_hook_effects(ca), 18 * np.array([1.0, 2.0]) * 2 * 10)


@needs_torch
def test_hook_effects_match_torch():
    assert_close(_hook_effects(ca), _hook_effects(torch))


def test_node_post_hook_replaces_grad_inputs():
    a = ca.tensor([1.0, 2.0], requires_grad=True)
    out = (a * 2).sum()
    mul = out.grad_fn.next_functions[0][0]
    mul.register_hook(lambda grad_inputs, grad_outputs: (grad_inputs[0] * 0 + 7, None))
    out.backward()
    assert_close(a.grad.numpy(), [7.0, 7.0])


def test_hook_returning_wrong_shape_is_named():
    a = ca.tensor([1.0, 2.0], requires_grad=True)
    h = a * 2

    def widen(g):
        return ca.ones(3)

    h.register_hook(widen)
    with pytest.raises(RuntimeError, match=r"hook 'test_hook_returning_wrong_shape_is_named."
                       r"<locals>.widen' has changed the size of value: expected \[2\], "
                       r"got \[3\]"):
        h.sum().backward()
    assert a.grad is None


def test_post_accumulate_grad_hook_only_on_leaves():
    a = ca.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="post accumulate grad hooks cannot be registered "
                                           "on non-leaf tensors"):
        (a * 2).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        ca.ones(2).register_hook(lambda g: g)


def test_post_accumulate_grad_hook_sees_accumulated_grad():
    a = ca.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    a.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    (a * 2).sum().backward()
    (a * 3).sum().backward()
    assert_close(seen[0], [2.0, 2.0])
    assert_close(seen[1], [5.0, 5.0])


def _drops_y(m):
    class DropY(m.autograd.Function):
        # Traced, so its None is in the graph from the first backward (run as
        # Python, its first compiled backward would use zeros: test_call_backward).
        inline_backward = True

        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g, None
    return DropY


@pytest.mark.parametrize("backend", (None,) + BACKENDS)
def test_a_hook_cannot_fill_a_none_gradient(backend):
    x = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    z = _drops_y(ca).apply(x, y)
    z.grad_fn.register_hook(lambda gi, go: (gi[0], ca.ones(3) * 7))   # gi[1] is None
    with pytest.raises(RuntimeError, match="can't replace a None gradient with a non-None"):
        with ca.compiled_backward(backend=backend) if backend else contextlib.nullcontext():
            z.sum().backward()


@needs_torch
def test_a_hook_cannot_fill_a_none_gradient_in_torch_either():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    z = _drops_y(torch).apply(x, y)
    z.grad_fn.register_hook(lambda gi, go: (gi[0], torch.ones(3) * 7))
    with pytest.raises(RuntimeError, match="can't replace a None gradient with a non-None"):
        z.sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["pre", "post"])
def test_a_hook_that_drops_a_gradient_is_refused_under_compiled(backend, kind):
    # Eager autograd lets the gradient become None; a compiled graph, fixed when
    # traced, once computed with None: a NaN gradient, a TypeError, or C's
    # "gave NoneType".
    x = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = ca.tensor([4.0, 5.0, 6.0], requires_grad=True)
    z = x * y
    if kind == "post":
        z.grad_fn.register_hook(lambda gi, go: (gi[0], None))
    else:
        z.grad_fn.register_prehook(lambda go: (None,))
    with pytest.raises(RuntimeError, match="returned None for gradient .*cannot drop"):
        with ca.compiled_backward(backend=backend):
            z.sum().backward(retain_graph=True)
    z.sum().backward()                        # eager: the dropped gradient is None
    assert (y.grad is None) if kind == "post" else (x.grad is None and y.grad is None)


@pytest.mark.parametrize("backend", (None,) + BACKENDS)
def test_backward_inputs_runs_a_non_leaf_inputs_node_and_its_hooks(backend):
    """As torch (init_to_execute marks every input's node needed under
    backward(inputs=...)): a non-leaf input's tensor hook, then its node's pre-hook,
    run; the gradient stops there (a is not an input)."""
    for _ in range(2):                          # a compile, then a cache hit
        log = []
        a = ca.tensor([1.0, 2.0], requires_grad=True)
        b = a.clone()
        b.grad_fn.register_prehook(lambda g: log.append("pre_hook"))
        b.register_hook(lambda g: log.append("tensor_hook"))
        with ca.compiled_backward(backend=backend) if backend else contextlib.nullcontext():
            b.sum().backward(inputs=(b,))
        assert log == ["tensor_hook", "pre_hook"]
        assert_close(b.grad.numpy(), [1.0, 1.0])
        assert a.grad is None
