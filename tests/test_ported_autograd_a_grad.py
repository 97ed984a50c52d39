"""autograd.grad / backward arguments and errors, retain_graph, double backward,
hooks and retain_grad: tests ported from PyTorch's test/test_autograd.py
(TestAutograd, the part of the file before character 140000).

Each test runs its backward on the eager engine and under every compiled backend
(the ``mode`` fixture of ``ported.py``). A backward with ``create_graph=True`` runs
outside ``under(mode)``: compiled_backward refuses create_graph by design, so only
the first-order backwards of a double-backward test are compiled.
"""
import re

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


# torch: test_autograd.py::TestAutograd::test_accumulate_grad
def test_accumulate_grad(mode):
    grad_output = ones(5, 5)

    def compute_grad(create_graph):
        x = randn(5, 5, requires_grad=True)
        y = x + 2
        with under(mode):
            y.backward(grad_output, retain_graph=True)
        x_grad = x.grad
        x_grad_clone = x.grad.clone()
        if create_graph:
            y.backward(grad_output, create_graph=True)
        else:
            with under(mode):
                y.backward(grad_output)
        return x_grad, x_grad_clone

    # Accumulate in-place when create_graph is False
    x_grad, x_grad_clone = compute_grad(create_graph=False)
    eq(x_grad, x_grad_clone * 2)

    # Accumulate out-of-place when create_graph is True
    x_grad, x_grad_clone = compute_grad(create_graph=True)
    eq(x_grad, x_grad_clone)


# torch: test_autograd.py::TestAutograd::test_accumulate_grad_tensor_reference
# (the dense-into-dense cases; the sparse ones are not ported)
def test_accumulate_grad_tensor_reference(mode):
    def _test_grad_tensor(params_grad_tensor, backward_grad_tensor, should_preserve_reference,
                          create_graph):
        params = ca.tensor([1.5, 1.5]).requires_grad_()
        params.grad = params_grad_tensor
        grad_saved = params.grad
        if create_graph:
            params.backward(backward_grad_tensor, create_graph=True)
        else:
            with under(mode):
                params.backward(backward_grad_tensor)
        assert (id(grad_saved) == id(params.grad)) == should_preserve_reference

    for create_graph in (False, True):
        # Accumulating a dense gradient into a dense gradient preserves the
        # `params.grad` reference, but only if create_graph=False.
        _test_grad_tensor(ca.tensor([1.5, 1.5]), ca.tensor([1.5, 1.5]), not create_graph,
                          create_graph)


# torch: test_autograd.py::TestAutograd::test_sum_to_with_empty_dim_grad
def test_sum_to_with_empty_dim_grad(mode):
    a = ca.rand(4, 0, requires_grad=True)
    b = ca.rand(4, 1, requires_grad=True)
    c = a + b
    assert c.shape == (4, 0)
    with under(mode):
        c.sum().backward()
    eq(b.grad, np.zeros((4, 1)))
    eq(a.grad, np.zeros((4, 0)))


# torch: test_autograd.py::TestAutograd::test_hessian_vector
def test_hessian_vector(mode):
    x = randn(2, 2, requires_grad=True)
    y = randn(2, 2, requires_grad=True)

    z = x ** 2 + y * x + y ** 2
    z.backward(ones(2, 2), create_graph=True)

    with ca.no_grad():
        x_grad = 2 * x + y
        y_grad = x + 2 * y
    eq(x.grad, x_grad)
    eq(y.grad, y_grad)

    grad_sum = 2 * x.grad + y.grad
    with under(mode):
        grad_sum.backward(ones(2, 2))
    x_hv = ones(2, 2) * 5
    y_hv = ones(2, 2) * 4
    eq(x.grad, x_grad + x_hv)
    eq(y.grad, y_grad + y_hv)


# torch: test_autograd.py::TestAutograd::test_grad
def test_grad(mode):
    x = randn(2, 2, requires_grad=True)
    y = randn(2, 2, requires_grad=True)
    z = x ** 2 + y * x + y ** 2
    z.backward(ones(2, 2), create_graph=True)

    x_grad = 2 * x + y
    y_grad = x + 2 * y
    eq(x.grad, x_grad)
    eq(y.grad, y_grad)

    grad_sum = 2 * x.grad + y.grad
    x_hv = ca.autograd.grad(outputs=[grad_sum], grad_outputs=[ones(2, 2)], inputs=[x],
                            create_graph=True)
    expected_x_hv = ones(2, 2) * 5
    eq(x_hv[0], expected_x_hv)
    eq(x.grad, x_grad)
    eq(y.grad, y_grad)
    # the same, first order, under mode
    with under(mode):
        x_hv = ca.autograd.grad(outputs=[grad_sum], grad_outputs=[ones(2, 2)], inputs=[x],
                                retain_graph=True)
    eq(x_hv[0], expected_x_hv)
    eq(x.grad, x_grad)

    # Test that grad_outputs and outputs have the same shape
    grad_out = ones(2)
    with pytest.raises(RuntimeError) as info:
        with under(mode):
            ca.autograd.grad(outputs=[grad_sum], grad_outputs=[grad_out], inputs=[x])
    # torch's exact text is checked by test_grad_shape_mismatch_message below
    assert re.fullmatch(r"Mismatch in shape: grad_output\[0\] has a shape of .*\[2\]\)? "
                        r"and output\[0\] has a shape of .*\[2, 2\]\)?\.", str(info.value))


# torch: test_autograd.py::TestAutograd::test_grad (its exact message)
def test_grad_shape_mismatch_message(mode):
    x = randn(2, 2, requires_grad=True)
    grad_sum = x * 2
    with pytest.raises(RuntimeError) as info:
        with under(mode):
            ca.autograd.grad(outputs=[grad_sum], grad_outputs=[ones(2)], inputs=[x])
    assert str(info.value) == ("Mismatch in shape: grad_output[0] has a shape of "
                               "torch.Size([2]) and output[0] has a shape of "
                               "torch.Size([2, 2]).")


# torch: test_autograd.py::TestAutograd::test_grad_nonleaf
def test_grad_nonleaf(mode):
    x_init = randn(2, 2, requires_grad=True)
    x = x_init
    y = randn(2, 2, requires_grad=True)
    grad_output = ones(2, 2)

    def fn(x):
        return x ** 2 + y * x + y ** 2

    for _ in range(5):
        grad_x, = ca.autograd.grad(fn(x), x, grad_outputs=grad_output, create_graph=True)
        grad_x_expected = 2 * x + y
        assert y.grad is None
        assert x.grad is None
        eq(grad_x, grad_x_expected)
        x = x + 0.05 * grad_x

    val_init = fn(x_init).sum()
    val_final = fn(x).sum()
    assert val_final.item() > val_init.item()

    with under(mode):
        x.backward(grad_output)
    assert y.grad is not None
    assert x_init.grad is not None


# torch: test_autograd.py::TestAutograd::test_grad_nonleaf_many_outputs
def test_grad_nonleaf_many_outputs(mode):
    x = randn(4, 2, requires_grad=True)
    a, b = x.chunk(2)

    def hook(*grads):
        hook_called[0] = True
    hook_called = [False]
    x.register_hook(hook)

    go = randn(2, 2)
    grad_a, grad_b = ca.autograd.grad((a + 2 * b), [a, b], grad_outputs=go, create_graph=True)
    eq(grad_a, go)
    eq(grad_b, go * 2)
    assert not hook_called[0]
    assert x.grad is None
    # and first order, under mode
    with under(mode):
        grad_a, grad_b = ca.autograd.grad((a + 2 * b), [a, b], grad_outputs=go)
    eq(grad_a, go)
    eq(grad_b, go * 2)
    assert not hook_called[0]
    assert x.grad is None


    # Should run fine


# torch: test_autograd.py::TestAutograd::test_sharded_grad
def test_sharded_grad(mode):
    leaves = [ca.zeros(5, 5, requires_grad=True) for _ in range(10)]
    intermediates = [l * i + l * l for i, l in enumerate(leaves)]
    loss = sum(v * i for i, v in enumerate(intermediates)).sum()

    def group(l, group_size):
        return (l[i:i + group_size] for i in range(0, len(l), group_size))

    shard_size = 2
    with under(mode):
        d_intermediates = [d_i for intermediates_batch in group(intermediates, shard_size)
                           for d_i in ca.autograd.grad(loss, intermediates_batch,
                                                       retain_graph=True)]
        ca.autograd.backward(intermediates, d_intermediates)

    for i, l in enumerate(leaves):
        eq(l.grad, i * i * (1 + l))


# torch: test_autograd.py::TestAutograd::test_backward_badcalls
def test_backward_badcalls(mode):
    x = ca.ones(1)
    with pytest.raises(RuntimeError, match="does not require grad"):
        with under(mode):
            x.backward()


# torch: test_autograd.py::TestAutograd::test_grad_badcalls
def test_grad_badcalls(mode):
    x = ca.ones(1)
    y = x ** 2
    with pytest.raises(RuntimeError, match="does not require grad"):
        with under(mode):
            ca.autograd.grad(x, y)
    with pytest.raises(RuntimeError, match="does not require grad"):
        with under(mode):
            ca.autograd.grad(y, x)

    x = ca.ones(1, requires_grad=True)
    y = x ** 2
    with under(mode):
        (g,) = ca.autograd.grad(y, x)  # this should succeed now
    eq(g, [2.0])


# torch: test_autograd.py::TestAutograd::test_grad_unreachable
def test_grad_unreachable(mode):
    x = ca.ones(1, requires_grad=True)
    y = ca.ones(1, requires_grad=True)
    # Make sure x and y have grad accumulators allocated
    z = x * 2
    w = y * 2  # noqa: F841

    with under(mode):
        grad_x, grad_y = ca.autograd.grad(x * 2, [x, y], allow_unused=True)
    eq(grad_x, x * 2)
    assert grad_y is None

    # z doesn't even have a grad accumulator allocated.
    z = ca.ones(1, requires_grad=True)
    with under(mode):
        grad_x, grad_z = ca.autograd.grad(x * 2, [x, z], allow_unused=True)
    eq(grad_x, x * 2)
    assert grad_z is None

    # allow_unused=False, but grads contains None inside, should throw
    with pytest.raises(RuntimeError, match="Set allow_unused=True"):
        with under(mode):
            grad_x, grad_y = ca.autograd.grad(x * 2, [x, y], allow_unused=False)


# torch: test_autograd.py::TestAutograd::test_backward
def test_backward(mode):
    v = randn(5, 5, requires_grad=True)
    x = randn(5, 5, requires_grad=True)
    y = (ca.rand(5, 5, dtype=F64) + 0.1).requires_grad_(True)
    z = randn(5, 5, requires_grad=True)
    grad_output = randn(5, 5)

    with under(mode):
        v.backward(grad_output)
    eq(v.grad, grad_output)

    a = x + (y * z) + 4 * z ** 2 * x / y
    with under(mode):
        a.backward(grad_output)
    x_grad = 4 * z.pow(2) / y + 1
    y_grad = z - 4 * x * z.pow(2) / y.pow(2)
    z_grad = 8 * x * z / y + y
    eq(x.grad, x_grad * grad_output)
    eq(y.grad, y_grad * grad_output)
    eq(z.grad, z_grad * grad_output)


# torch: test_autograd.py::TestAutograd::test_multi_backward
def test_multi_backward(mode):
    x = randn(5, 5, requires_grad=True)
    y = randn(5, 5, requires_grad=True)
    q = randn(5, 5, requires_grad=True)
    a = randn(5, 5, requires_grad=True)
    b = randn(5, 5, requires_grad=True)

    q2 = q * 2
    z = x + y + q2
    c = a * b + q2
    grad_z = randn(5, 5)
    grad_c = randn(5, 5)
    with under(mode):
        ca.autograd.backward([z, c], [grad_z, grad_c])

    eq(x.grad, grad_z)
    eq(y.grad, grad_z)
    eq(a.grad, grad_c * b)
    eq(b.grad, grad_c * a)
    eq(q.grad, (grad_c + grad_z) * 2)


# torch: test_autograd.py::TestAutograd::test_multi_backward_no_grad
def test_multi_backward_no_grad(mode):
    x = randn(5, 5, requires_grad=True)
    y = randn(5, 5, requires_grad=False)

    z = x + y
    q = y * 2

    with pytest.raises(RuntimeError):
        with under(mode):
            ca.autograd.backward([z, q], [ones(5, 5), ones(5, 5)])


# torch: test_autograd.py::TestAutograd::test_dependent_backward
def test_dependent_backward(mode):
    x = randn(10, requires_grad=True)
    y = x ** 2
    z = y ** 3

    go_y = randn(10)
    go_z = randn(10)
    with under(mode):
        ca.autograd.backward([y, z], [go_y, go_z])

    xd = x
    eq(x.grad, 2 * xd * go_y + 6 * xd.pow(5) * go_z)


# torch: test_autograd.py::TestAutograd::test_duplicate_backward_root
def test_duplicate_backward_root(mode):
    a = randn(5, 5, requires_grad=True)
    b = randn(5, 5, requires_grad=True)

    x = a * b
    grad_output = randn(5, 5)
    with under(mode):
        ca.autograd.backward([x, x], [grad_output, grad_output])

    eq(a.grad, b * grad_output * 2)
    eq(b.grad, a * grad_output * 2)


# torch: test_autograd.py::TestAutograd::test_backward_no_grad
def test_backward_no_grad(mode):
    a = randn(5, 5, requires_grad=True)
    b = a + 2
    with pytest.raises(RuntimeError):
        with under(mode):
            ca.autograd.backward([b], [None])


# torch: test_autograd.py::TestAutograd::test_backward_twice_with_saved_values
def test_backward_twice_with_saved_values(mode):
    b = randn(3, requires_grad=True)
    c = ca.zeros(3, dtype=F64)
    c[[1, 2]] = b[[1, 1]]
    with under(mode):
        c.backward(ca.tensor([1, 1, 1], dtype=F64))
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        with under(mode):
            c.backward(ca.tensor([1, 1, 1], dtype=F64))


# torch: test_autograd.py::TestAutograd::test_backward_twice_retained_graph_with_saved_values
def test_backward_twice_retained_graph_with_saved_values(mode):
    b = randn(3, requires_grad=True)
    c = ca.zeros(3, dtype=F64)
    c[[1, 2]] = b[[1, 1]]
    with under(mode):
        c.backward(ca.tensor([1, 1, 1], dtype=F64), retain_graph=True)
        c.backward(ca.tensor([1, 1, 1], dtype=F64))
    eq(b.grad, [0.0, 4.0, 0.0])


# torch: test_autograd.py::TestAutograd::test_backward_twice_without_saved_values
def test_backward_twice_without_saved_values(mode):
    b = randn(3, requires_grad=True)
    c = b + 1
    with under(mode):
        c.backward(ca.tensor([1, 1, 1], dtype=F64))
        c.backward(ca.tensor([1, 1, 1], dtype=F64))
    eq(b.grad, [2.0, 2.0, 2.0])


# torch: test_autograd.py::TestAutograd::test_backward_twice_retained_graph_without_saved_values
def test_backward_twice_retained_graph_without_saved_values(mode):
    b = randn(3, requires_grad=True)
    c = ca.zeros(3, dtype=F64)
    c[[1, 2]] = b[[1, 1]]
    with under(mode):
        c.backward(ca.tensor([1, 1, 1], dtype=F64), retain_graph=True)
        c.backward(ca.tensor([1, 1, 1], dtype=F64))
    eq(b.grad, [0.0, 4.0, 0.0])


# torch: test_autograd.py::TestAutograd::test_backward_copy
def test_backward_copy(mode):
    x = ones(5, 5, requires_grad=True)
    y = ones(5, 5, requires_grad=True)
    a = x + 2
    b = y + 2
    c = x + 2
    add1 = a + b
    add2 = add1 + c
    for _ in range(4):
        a = a * 2
        b = b * 2
        c = c * 2
    branch = a + b + c
    out = add2 + branch
    # x: 34 (16 from final a, 16 from final c, 2 from add2); y: 17
    grad_output = ones(5, 5)
    with under(mode):
        out.backward(grad_output)
    eq(x.grad, np.ones((5, 5)) * 34)
    eq(y.grad, np.ones((5, 5)) * 17)


