"""Views and in-place ops (version counters, CopySlices, view + in-place errors),
indexing and index assignment, and a few ops' gradients: tests ported from PyTorch's
test/test_autograd.py (TestAutograd, the part of the file before character 140000).

Each test runs its backward on the eager engine and under every compiled backend
(the ``mode`` fixture of ``ported.py``); a test whose error is raised in the forward
does not take ``mode``. A backward with ``create_graph=True`` runs outside
``under(mode)`` (compiled_backward refuses create_graph by design).
"""
import gc
import math

import numpy as np
import pytest

import compiled_autograd as ca
from ported import mode, under  # noqa: F401

F64 = np.float64


def eq(a, b, rtol=1e-6, atol=1e-6):
    a = a.detach().numpy() if isinstance(a, ca.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, ca.Tensor) else np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def randn(*shape, requires_grad=False):
    return ca.randn(*shape, dtype=F64, requires_grad=requires_grad)


def ones(*shape, requires_grad=False):
    return ca.ones(*shape, dtype=F64, requires_grad=requires_grad)


# torch: test_autograd.py::TestAutograd::test_no_unnecessary_save
def test_no_unnecessary_save(mode):
    # If x * ft saved x, the backward would complain that x was modified.
    mu = ca.ones(1, requires_grad=True)
    x = ca.zeros(1)
    loss = 0
    for i in range(3):
        x.detach_()
        x.copy_(mu + i)
        ft = ca.tensor([float(i)])
        multiplied = x * ft
        s = multiplied.sum()
        loss += s
    with under(mode):
        loss.backward()
    eq(mu.grad, [3.0])


# torch: test_autograd.py::TestAutograd::test_requires_grad_inplace
def test_requires_grad_inplace():
    a = ca.randn(5, 5)
    b = ca.randn(5, 5, requires_grad=True)
    a += b
    assert a.requires_grad

    # non-leaf
    a = ca.randn(5, 5) + 0
    b = ca.randn(5, 5, requires_grad=True)
    a += b
    assert a.requires_grad


# torch: test_autograd.py::TestAutograd::test_no_requires_grad_inplace
def test_no_requires_grad_inplace(mode):
    # modify in-place while requires_grad is False
    a = ca.randn(2, 3)
    a.add_(5)
    a.requires_grad = True
    with under(mode):
        a.sum().backward()
    eq(a.grad, np.ones((2, 3)))

    # same but with a view
    a = ca.randn(2, 3)
    b = a[:]
    b.add_(5)
    a.requires_grad = True
    with under(mode):
        a.sum().backward()
    eq(a.grad, np.ones((2, 3)))

    # should fail if requires_grad = True when we modify inplace
    a = ca.randn(2, 3)
    b = a[:]
    a.requires_grad = True
    with pytest.raises(RuntimeError):
        a.add_(5)
    with pytest.raises(RuntimeError):
        b.add_(5)


# torch: test_autograd.py::TestAutograd::test_inplace
# (z.exp_() is z.mul_(2) here: ca has no exp_; the expected gradient follows)
def test_inplace(mode):
    x = ones(5, 5, requires_grad=True)
    y = ones(5, 5, requires_grad=True) * 4

    z = x * y
    q = z + y
    w = z * y
    z.add_(2)
    # Add doesn't need its inputs to do backward, so it shouldn't raise
    with under(mode):
        q.backward(ones(5, 5), retain_graph=True)
    # Mul saves both inputs in forward, so it should raise
    with pytest.raises(RuntimeError):
        with under(mode):
            w.backward(ones(5, 5))

    z = x * y
    q = z * y
    r = z + y
    w = z.add_(y)
    # w is the last expression, so this should succeed
    with under(mode):
        w.backward(ones(5, 5), retain_graph=True)
    # r doesn't use the modified value in backward, so it should succeed
    with under(mode):
        r.backward(ones(5, 5), retain_graph=True)
    # q uses dirty z, so it should raise
    with pytest.raises(RuntimeError):
        with under(mode):
            q.backward(ones(5, 5))

    with ca.no_grad():
        x.grad.zero_()
    m = x / 2
    z = m + y / 8
    q = z * y
    r = z + y
    prev_version = z._version
    w = z.mul_(2)
    assert z._version != prev_version
    with under(mode):
        r.backward(ones(5, 5), retain_graph=True)
    eq(x.grad, np.ones((5, 5)) / 2)
    with under(mode):
        w.backward(ones(5, 5), retain_graph=True)
    eq(x.grad, np.full((5, 5), (1 + 2) / 2))
    with pytest.raises(RuntimeError):
        with under(mode):
            q.backward(ones(5, 5))

    leaf = ones(5, 5, requires_grad=True)
    x = leaf.clone()
    x.add_(10)
    eq(x, np.ones((5, 5)) * 11)
    # x should be still usable
    y = x + 2
    with under(mode):
        y.backward(ones(5, 5))
    eq(leaf.grad, np.ones((5, 5)))
    z = x * y
    x.add_(2)
    with pytest.raises(RuntimeError):
        with under(mode):
            z.backward(ones(5, 5))


# torch: test_autograd.py::TestAutograd::test_detach
def test_detach(mode):
    x = randn(10, 10, requires_grad=True)
    y = x + 2
    y = y.detach()
    z = y * 4 + 2
    assert not y.requires_grad
    assert not z.requires_grad

    x = randn(10, 10, requires_grad=True)
    y = x * 2
    y = y.detach()
    assert not y.requires_grad
    assert y.grad_fn is None
    z = x + y
    with under(mode):
        z.sum().backward()
    # This is an incorrect gradient, but we assume that's what the user wanted.
    eq(x.grad, np.ones((10, 10)))

    # in-place detach
    x = randn(10, 10, requires_grad=True)
    y = randn(10, 10, requires_grad=True)
    a = x * 2
    with under(mode):
        (y + a).sum().backward(retain_graph=True)
    a.detach_()
    assert not a.requires_grad
    with under(mode):
        (y + a).sum().backward()  # this won't backprop to x
    eq(x.grad, np.ones((10, 10)) * 2)
    eq(y.grad, np.ones((10, 10)) * 2)

    # in-place detach on a view raises an exception
    view = x.narrow(0, 1, 4)
    with pytest.raises(RuntimeError, match="view"):
        view.detach_()


# torch: test_autograd.py::TestAutograd::test_detach_base
def test_detach_base():
    "detaching base does not detach view"
    x = randn(10, 10, requires_grad=True)
    view = x.narrow(0, 1, 4)
    x.detach_()
    assert not x.requires_grad
    assert view.requires_grad
    assert view.grad_fn is not None
    assert view._base is x


# torch: test_autograd.py::TestAutograd::test_type_conversions
# (only its _test_type_conversion_backward: float <-> double on CPU)
def test_type_conversions(mode):
    fvar = ca.randn(5, 5, dtype=np.float32, requires_grad=True)
    with under(mode):
        fvar.double().sum().backward()
    eq(fvar.grad, np.ones((5, 5), dtype=np.float32))
    assert fvar.grad.dtype == fvar.dtype
    dvar = ca.randn(5, 5, dtype=F64, requires_grad=True)
    with under(mode):
        dvar.float().sum().backward()
    eq(dvar.grad, np.ones((5, 5)))
    assert dvar.grad.dtype == dvar.dtype


# torch: test_autograd.py::TestAutograd::test_no_grad_modifies_version
def test_no_grad_modifies_version(mode):
    x = randn(5, requires_grad=True)
    y = randn(5, requires_grad=True)
    z = (x * y).sum()
    with ca.no_grad():
        x *= 2
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with under(mode):
            z.backward()


# torch: test_autograd.py::TestAutograd::test_inplace_view_saved_output
def test_inplace_view_saved_output():
    # An in-place op on a view whose op saves its output made a reference cycle.
    dealloc = [0]

    class IncrementOnDelete:
        def __call__(self, *args):
            return None

        def __del__(self):
            dealloc[0] += 1

    def test():
        root = randn(3, 3, requires_grad=True)
        copy = root.clone()
        copy.grad_fn.register_hook(IncrementOnDelete())
        view = copy.view(9)
        view.relu_()  # torch.nn.functional.relu(view, inplace=True)

    test()
    gc.collect()  # (ca may hold the graph in cycles; torch frees it at once)
    assert dealloc[0] == 1


# torch: test_autograd.py::TestAutograd::test_inplace_view_backward
# (its second part; the first uses nn.InstanceNorm2d. threshold(x, 0, 0, True) is
# relu_, the input is (1, 3, 4, 4) instead of (1, 3, 256, 256))
def test_inplace_view_backward(mode):
    inputs = ones(1, 3, 4, 4, requires_grad=True)

    tmp1 = (inputs + 1).view(*inputs.shape)
    tmp2 = tmp1.relu_()
    prob_interpolated = ca.sigmoid(tmp2)

    gradients = ca.autograd.grad(outputs=prob_interpolated, inputs=inputs,
                                 grad_outputs=ones(*prob_interpolated.size()),
                                 create_graph=True, retain_graph=True)[0]
    gradient_penalty = gradients.sum()
    with under(mode):
        gradient_penalty.backward()
    s = 1 / (1 + math.exp(-2.0))
    eq(gradients, np.full((1, 3, 4, 4), s * (1 - s)))
    eq(inputs.grad, np.full((1, 3, 4, 4), s * (1 - s) * (1 - 2 * s)))


# torch: test_autograd.py::TestAutograd::test_inplace_view_weak_grad_fn
def test_inplace_view_weak_grad_fn(mode):
    # Issue 23502: Test that b's grad_fn is preserved.
    a = ca.arange(10.0, requires_grad=True)

    b = a.narrow(0, 0, 2).clone().view(-1)
    b.relu_()

    c = b.clone()
    del b
    gc.collect()

    s = c.sum()
    with under(mode):
        s.backward()
    eq(s, 1.0)
    eq(a.grad, [0.0, 1.0] + [0.0] * 8)

    # Issue 23502: Ensure RuntimeError for modification of SavedVariable.
    # (torch 2.13 raises at relu_ already: a view of a leaf that requires grad)
    a = ca.rand(10, requires_grad=True).narrow(0, 0, 10)
    with pytest.raises(RuntimeError):
        b = a.relu_()
        c = b.add_(100)
        del b
        with under(mode):
            c.sum().backward(ca.ones(1, requires_grad=True))
