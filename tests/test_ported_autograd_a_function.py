"""Custom autograd.Function tests ported from PyTorch's test/test_autograd.py
(TestAutograd, the part of the file before character 140000).

Each test runs its backward on the eager engine and under every compiled backend
(the ``mode`` fixture of ``ported.py``). A backward with ``create_graph=True`` runs
outside ``under(mode)``, as ported (under compiled_backward such a backward runs on
the eager engine anyway): the first-order backwards of a double-backward test are
the compiled ones.
"""

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.autograd import Function
from ported import mode, under  # noqa: F401

F64 = np.float64


def eq(a, b, rtol=1e-6, atol=1e-6):
    a = a.detach().numpy() if isinstance(a, ca.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, ca.Tensor) else np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def randn(*shape, requires_grad=False):
    return ca.randn(*shape, dtype=F64, requires_grad=requires_grad)


# torch: test_autograd.py::TestAutograd::test_function (and _function_test)
def test_function(mode):
    class MyFunction(Function):
        @staticmethod
        def forward(ctx, tensor1, pyscalar, tensor2):
            ctx.pyscalar = pyscalar
            ctx.save_for_backward(tensor1, tensor2)
            return tensor1 + pyscalar * tensor2 + tensor1 * tensor2

        @staticmethod
        def backward(ctx, grad_output):
            var1, var2 = ctx.saved_tensors
            assert isinstance(var1, ca.Tensor)
            assert isinstance(var2, ca.Tensor)
            assert isinstance(grad_output, ca.Tensor)
            return (grad_output + grad_output * var2, None,
                    grad_output * ctx.pyscalar + grad_output * var1)

    x = randn(5, 5, requires_grad=True)
    y = randn(5, 5, requires_grad=True)
    # first order, under mode
    result = MyFunction.apply(x, 2, y)
    with under(mode):
        result.sum().backward(ca.ones((), dtype=F64))
    eq(x.grad, y + ca.ones(5, 5, dtype=F64))
    eq(y.grad, x + ca.ones(5, 5, dtype=F64) * 2)
    # create_graph=True (eager): the gradients have history
    x.grad = y.grad = None
    result = MyFunction.apply(x, 2, y)
    go = ca.ones((), dtype=F64, requires_grad=True)
    result.sum().backward(go, create_graph=True)
    eq(x.grad, y + ca.ones(5, 5, dtype=F64))
    eq(y.grad, x + ca.ones(5, 5, dtype=F64) * 2)
    assert x.grad.grad_fn is not None
    assert y.grad.grad_fn is not None


# torch: test_autograd.py::TestAutograd::test_function_returns_input
def test_function_returns_input(mode):
    class MyFunction(Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    for shape in [(1,), ()]:
        v = ca.ones(*shape, requires_grad=True)
        with under(mode):
            MyFunction.apply(v).backward()
        eq(v.grad, np.full(shape, 2.))

        with ca.no_grad():
            v.grad.zero_()
        with under(mode):
            MyFunction.apply(v.clone()).backward()
        eq(v.grad, np.full(shape, 2.))


# torch: test_autograd.py::TestAutograd::test_function_returns_undefined_tensor
def test_function_returns_undefined_tensor(mode):
    class MyFunction(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return None

    x = ca.ones(1, requires_grad=True)
    with under(mode):
        MyFunction.apply(x).backward()
    assert x.grad is None
    with under(mode):
        MyFunction.apply(x ** 2).backward()
    assert x.grad is None
    with under(mode):
        MyFunction.apply(x).sum().backward()
    assert x.grad is None
    with under(mode):
        assert ca.autograd.grad(MyFunction.apply(x), x, allow_unused=True)[0] is None


# torch: test_autograd.py::TestAutograd::test_materialize_grads
# (torch makes the undefined gradient with torch._C._functions.UndefinedGrad; here it
# is the gradient of an output of a two-output Function that the loss does not use)
def test_materialize_grads(mode):
    seen = []

    class MyFunction(Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone(), x.clone()

        @staticmethod
        def backward(ctx, grad, unused):
            seen.append(unused)
            return grad + unused

    x = ca.ones(1, requires_grad=True)
    a, _ = MyFunction.apply(x)
    with under(mode):
        a.backward()
    eq(x.grad, [1.0])
    assert len(seen) == 1 and seen[0] is not None
    if mode == "engine":
        eq(seen[0], np.zeros(1))


# torch: test_autograd.py::TestAutograd::test_dont_materialize_grads
def test_dont_materialize_grads(mode):
    seen = []

    class MyFunction(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x.clone(), x.clone()

        @staticmethod
        def backward(ctx, grad, unused):
            seen.append(unused)
            return grad

    x = ca.ones(1, requires_grad=True)
    a, _ = MyFunction.apply(x)
    with under(mode):
        a.backward()
    assert seen == [None]
    eq(x.grad, [1.0])


# torch: test_autograd.py::TestAutograd::test_invalid_gradients
def test_invalid_gradients(mode):
    class MyFunction(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad_output):
            return ca.randn(10)

    input = ca.randn(5, 5, requires_grad=True)
    with pytest.raises(RuntimeError, match="expected shape"):
        with under(mode):
            MyFunction.apply(input).sum().backward()


# torch: test_autograd.py::TestAutograd::test_no_grad_python_function
def test_no_grad_python_function():
    x = ca.ones(5, 5, requires_grad=True)

    class MyOp(Function):
        @staticmethod
        def forward(self, x):
            return x + 1

        @staticmethod
        def backward(self, dy):
            return dy

    with ca.no_grad():
        y = MyOp.apply(x)
    assert not y.requires_grad


# torch: test_autograd.py::TestAutograd::test_mark_non_differentiable
def test_mark_non_differentiable(mode):
    class MyFunction(Function):
        @staticmethod
        def forward(ctx, input):
            output = input > 0
            ctx.mark_non_differentiable(output)
            return output

        @staticmethod
        def backward(ctx, grad_output):
            return (grad_output * 0).double()

    x = randn(5, 5, requires_grad=True)
    mask = MyFunction.apply(x)
    assert not mask.requires_grad
    y = x.masked_fill(mask, 0)
    with under(mode):
        y.sum().backward()
    eq(x.grad, np.where(x.detach().numpy() > 0, 0.0, 1.0))


# torch: test_autograd.py::TestAutograd::test_mark_non_differentiable_mixed
def test_mark_non_differentiable_mixed(mode, request):
    checks = []

    class MyFunction(Function):
        @staticmethod
        def forward(ctx, input):
            a = input + 1
            b = input + 2
            ctx.mark_non_differentiable(a)
            return a, b

        @staticmethod
        def backward(ctx, grad_a, grad_b):
            checks.append(bool((grad_a == 0).numpy().all()))
            checks.append(bool((grad_b == 1).numpy().all()))
            return grad_b

    x = randn(5, 5, requires_grad=True)
    a, b = MyFunction.apply(x)
    assert not a.requires_grad
    assert b.requires_grad
    with under(mode):
        b.sum().backward()
    eq(x.grad, np.ones((5, 5)))
    assert checks == [True, True]


# torch: test_autograd.py::TestAutograd::test_mark_non_differentiable_none
def test_mark_non_differentiable_none(mode):
    class MyFunction(Function):
        @staticmethod
        def forward(ctx, input):
            output = input.clone()
            ctx.mark_non_differentiable(output)
            return output

        @staticmethod
        def backward(ctx, grad_output):
            return None

    x = randn(5, 5, requires_grad=True)
    r = MyFunction.apply(x * x)
    with under(mode):
        (r * x).sum().backward()
    eq(x.grad, (x * x).detach())


# torch: test_autograd.py::TestAutograd::test_return_leaf
def test_return_leaf(mode):
    class Identity(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a, a + b

        @staticmethod
        def backward(ctx, grad_a, grad_b):
            return grad_a + grad_b, grad_b

    hook_called = [False]
    x = randn(5, 5, requires_grad=True)
    y = randn(5, 5, requires_grad=True)
    q, p = Identity.apply(x, y)
    seen = []

    # Make sure hooks only receive grad from usage of q, not x.
    def hook(grad):
        hook_called[0] = True
        seen.append(grad)

    q.register_hook(hook)
    with under(mode):
        (q + p + x).sum().backward()
    eq(x.grad, np.ones((5, 5)) * 3)
    eq(y.grad, np.ones((5, 5)))
    assert hook_called[0]
    eq(seen[0], np.ones((5, 5)))


# torch: test_autograd.py::TestAutograd::test_no_grad_input
def test_no_grad_input():
    class MyFunction(Function):
        @staticmethod
        def forward(self, x):
            return x

        @staticmethod
        def backward(self, grad_output):
            return grad_output

    x = ca.randn(5, requires_grad=True)
    with ca.no_grad():
        y = MyFunction.apply(x)
    assert x.requires_grad
    assert y.grad_fn is None


# torch: test_autograd.py::TestAutograd::test_save_none_for_backward
def test_save_none_for_backward(mode):
    seen = []

    class MyFn(Function):
        @staticmethod
        def forward(ctx, input):
            ctx.save_for_backward(None, input, None)
            return input * input

        @staticmethod
        def backward(ctx, grad_output):
            n1, input, n2 = ctx.saved_tensors
            seen.append((n1, n2))
            return 2 * input * grad_output

    x = randn(5, 5, requires_grad=True)
    y = MyFn.apply(x)
    with under(mode):
        y.sum().backward()
    eq(x.grad, 2 * x)
    assert seen == [(None, None)]


# torch: test_autograd.py::TestAutograd::test_too_many_grads
def test_too_many_grads(mode):
    class MyFn(Function):
        @staticmethod
        def forward(ctx, input):
            return input

        @staticmethod
        def backward(ctx, grad_output):
            return grad_output, None, None

    x = randn(5, 5, requires_grad=True)
    y = MyFn.apply(x)
    with under(mode):
        y.sum().backward()
    eq(x.grad, np.ones((5, 5)))


# torch: test_autograd.py::TestAutograd::test_dep_nograd
def test_dep_nograd(mode):
    class F1(Function):
        @staticmethod
        def forward(ctx, input):
            out = ca.randn(*input.size())
            ctx.mark_non_differentiable(out)
            return input, out

        @staticmethod
        def backward(ctx, grad_output, ignored):
            return grad_output

    class F2(Function):
        @staticmethod
        def forward(ctx, input, ignored):
            return input

        @staticmethod
        def backward(ctx, grad_output):
            return grad_output, None

    x = ca.randn(5, requires_grad=True)
    a, b = F1.apply(x)
    b = b + 1  # separate F1 from F2 by another op
    assert a.requires_grad
    assert not b.requires_grad
    c = F2.apply(a, b)
    with under(mode):
        c.backward(ca.ones(*c.size()))
    eq(x.grad, np.ones(x.size()))


# torch: test_autograd.py::TestAutograd::test_hook_none
def test_hook_none(mode):
    class NoneGradientFunction(Function):
        @staticmethod
        def forward(ctx, x, y):
            assert ctx.needs_input_grad[0]
            assert not ctx.needs_input_grad[1]
            return x, y

        @staticmethod
        def backward(ctx, grad_x, grad_y):
            return grad_x, None

    was_called = [False]

    def hook(grad):
        assert grad is not None
        was_called[0] = True

    x = randn(5, 5, requires_grad=True)
    y = randn(5, 5)
    rx, ry = NoneGradientFunction.apply(x, y)
    rx.register_hook(hook)
    ry.register_hook(hook)
    with under(mode):
        sum(rx, ry).sum().backward()
    assert was_called[0]


