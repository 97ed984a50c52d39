"""Hooks (tensor hooks, their removal and order of effect), retain_grad, grad mode
(no_grad / enable_grad / set_grad_enabled), requires_grad and graph metadata: tests
ported from PyTorch's test/test_autograd.py (TestAutograd, the part of the file before
character 140000).

Each test runs its backward on the eager engine and under every compiled backend
(the ``mode`` fixture of ``ported.py``).
"""
import gc
import weakref

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


# torch: test_autograd.py::TestAutograd::test_grad_nonleaf_register_hook
# (x.unbind() is x.split(1) here: ca has no unbind; the outputs have shape (1,))
def test_grad_nonleaf_register_hook(mode):
    x = randn(5, requires_grad=True)
    x_list = x.split(1)

    x0 = x_list[0]
    hook_results = [None]

    def hook(grad):
        hook_results[0] = grad
    x0.register_hook(hook)

    with under(mode):
        x_list[0].backward(ones(1))
    eq(hook_results[0], [1.0])
    expected_grad = np.array([1., 0, 0, 0, 0])
    eq(x.grad, expected_grad)
    assert x_list[0].grad is None

    for i in range(1, 5, 1):
        hook_results[0] = None
        with under(mode):
            x_list[i].backward(ones(1))
        assert hook_results[0] is None
        expected_grad[i] = 1.0
        eq(x.grad, expected_grad)
        assert x_list[i].grad is None


# torch: test_autograd.py::TestAutograd::test_hook_with_no_name
def test_hook_with_no_name(mode):
    # Create a hook that do not have a __name__ attribute
    class MyHookClass:
        def __call__(self, grad):
            return grad.clone()

    x = ca.randn(5, requires_grad=True).clone()
    x.register_hook(MyHookClass())
    with under(mode):
        x.sum().backward()


# torch: test_autograd.py::TestAutograd::test_hooks
def test_hooks(mode):
    x = ones(5, 5, requires_grad=True)
    y = ones(5, 5) * 4
    y.requires_grad_(True)

    counter = [0]

    def bw_hook(inc, grad):
        assert isinstance(grad, ca.Tensor)
        counter[0] += inc

    z = x ** 2 + x * 2 + x * y + y
    x.register_hook(lambda *args: bw_hook(0, *args))
    test = z.register_hook(lambda *args: bw_hook(1, *args))
    with under(mode):
        z.backward(ones(5, 5), retain_graph=True)
    assert counter[0] == 1

    test2 = z.register_hook(lambda *args: bw_hook(2, *args))
    with under(mode):
        z.backward(ones(5, 5), retain_graph=True)
    assert counter[0] == 4

    test2.remove()
    with under(mode):
        z.backward(ones(5, 5), retain_graph=True)
    assert counter[0] == 5

    def bw_hook_modify(grad):
        return grad.mul(2)

    test.remove()
    z.register_hook(bw_hook_modify)
    with ca.no_grad():
        y.grad.zero_()
    with under(mode):
        z.backward(ones(5, 5), retain_graph=True)
    eq(y.grad, (x + 1) * 2)

    y.register_hook(bw_hook_modify)
    with ca.no_grad():
        y.grad.zero_()
    with under(mode):
        z.backward(ones(5, 5))
    eq(y.grad, (x + 1) * 4)


# torch: test_autograd.py::TestAutograd::test_hooks_cpp
# (torch hooks the output of nn.BatchNorm1d in eval mode, a built-in node; ca has
# no BatchNorm: nn.ReLU of positive inputs is the built-in node here)
def test_hooks_cpp(mode):
    relu = ca.nn.ReLU()
    counter = [0]

    def bw_hook(grad):
        counter[0] += 1
        return grad * 2

    x = ones(5, 5, requires_grad=True)
    z = relu(x)
    z.register_hook(bw_hook)
    with under(mode):
        z.sum().backward()
    assert counter[0] == 1, "bw_hook not called"
    eq(x.grad, np.ones((5, 5)) * 2, atol=1e-5, rtol=0)


# torch: test_autograd.py::TestAutograd::test_retain_grad
def test_retain_grad(mode):
    input = ca.rand(1, 3, dtype=F64, requires_grad=True)
    h1 = input * 3
    out = (h1 * h1).sum()

    # It should be possible to call retain_grad() multiple times
    h1.retain_grad()
    h1.retain_grad()

    # Gradient should be accumulated
    with under(mode):
        out.backward(retain_graph=True)
    eq(h1 * 2, h1.grad)
    with under(mode):
        out.backward(retain_graph=True)
    eq(h1 * 4, h1.grad)

    with ca.no_grad():
        input.grad.zero_()
    # It should be a no-op for leaves
    input.retain_grad()
    input.retain_grad()
    with under(mode):
        out.backward()
    eq(input * 18, input.grad)


# torch: test_autograd.py::TestAutograd::test_retain_grad_cycle
def test_retain_grad_cycle(mode):
    counter = [0]
    refs = [None]

    x = ones(5, 5, requires_grad=True)

    def run_test():
        y = x * 2
        y.retain_grad()

        def inc(*args):
            counter[0] += 1
        refs[0] = weakref.ref(y, inc)
        return y / 2

    z = run_test()
    gc.collect()
    assert refs[0]() is None
    assert counter[0] == 1
    with under(mode):
        z.sum().backward()
    eq(x.grad, np.ones((5, 5)))


# torch: test_autograd.py::TestAutograd::test_no_grad
def test_no_grad(mode):
    x = ones(5, 5, requires_grad=True)
    y = ones(5, 5) * 4
    with ca.no_grad():
        w = x + y

    @ca.no_grad()
    def adder(x, y):
        return x + y

    z = adder(x, y)

    assert not w.requires_grad
    with pytest.raises(RuntimeError):
        with under(mode):
            w.backward(ones(5, 5))
    assert w.grad_fn is None
    assert not z.requires_grad
    with pytest.raises(RuntimeError):
        with under(mode):
            z.backward(ones(5, 5))
    assert z.grad_fn is None

    # test nested decorator and with-statement on no_grad
    with ca.no_grad():
        assert not ca.is_grad_enabled()
        w = adder(x, y)
        assert not ca.is_grad_enabled()


# torch: test_autograd.py::TestAutograd::test_set_grad_generator_functions
def test_set_grad_generator_functions():
    @ca.no_grad()
    def gen_no_grad():
        for i in range(10):
            assert ca.is_grad_enabled() is False
            yield i

    with ca.enable_grad():
        for _ in gen_no_grad():
            assert ca.is_grad_enabled() is True

    @ca.enable_grad()
    def gen_enable_grad():
        for i in range(10):
            assert ca.is_grad_enabled() is True
            yield i

    with ca.no_grad():
        for _ in gen_enable_grad():
            assert ca.is_grad_enabled() is False


# torch: test_autograd.py::TestAutograd::test_set_grad_enabled
def test_set_grad_enabled():
    x = ca.tensor([1.], requires_grad=True)
    with ca.set_grad_enabled(False):
        y = x * 2
    assert not y.requires_grad
    with ca.set_grad_enabled(True):
        y = x * 2
    assert y.requires_grad
    with ca.set_grad_enabled(False):
        ca.set_grad_enabled(True)
        y = x * 2
    assert y.requires_grad
    ca.set_grad_enabled(True)  # (torch's test leaves it on too)


# torch: test_autograd.py::TestAutograd::test_requires_grad
def test_requires_grad(mode):
    x = randn(5, 5)
    y = randn(5, 5)
    z = randn(5, 5, requires_grad=True)
    a = x + y
    assert not a.requires_grad
    b = a + z
    assert b.requires_grad

    def error(*args):
        raise RuntimeError
    # Make sure backward isn't called on these (ca's leaves keep their tensor
    # hooks in _backward_hooks, as torch's)
    for t in (a, x, y):
        t._backward_hooks = {"test": error}
    with under(mode):
        b.backward(ones(5, 5))
    eq(z.grad, np.ones((5, 5)))


# torch: test_autograd.py::TestAutograd::test_requires_grad_
def test_requires_grad_():
    x = ca.randn(5, 5)
    y = ca.randn(5, 5, requires_grad=True)
    assert x is x.requires_grad_()
    assert x.requires_grad
    assert y is y.requires_grad_()
    assert y.requires_grad
    assert x is x.requires_grad_(True)
    assert x.requires_grad
    assert y is y.requires_grad_(True)
    assert y.requires_grad
    z = x * y
    with pytest.raises(RuntimeError):
        z.requires_grad_(False)
    assert z is z.requires_grad_()
    assert z.requires_grad
    assert z is z.requires_grad_(True)
    assert z.requires_grad

    assert x is x.requires_grad_(False)
    assert not x.requires_grad
    assert y is y.requires_grad_(False)
    assert not y.requires_grad


# torch: test_autograd.py::TestAutograd::test_attribute_deletion
# (only del .grad and del .requires_grad: ca has no .data, ._grad_fn setter or
# ._backward_hooks property)
def test_attribute_deletion():
    x = ca.randn(5, 5, requires_grad=True)
    del x.grad
    assert x.grad is None
    with pytest.raises(RuntimeError):
        del x.requires_grad


# torch: test_autograd.py::TestAutograd::test_next_functions
def test_next_functions():
    x = randn(5, 5, requires_grad=True)
    y = randn(5, 5, requires_grad=True)

    a = x + y
    assert a.grad_fn is not None
    next_functions = a.grad_fn.next_functions
    assert len(next_functions) == 2
    assert next_functions[0][0].name() == "AccumulateGrad"
    assert next_functions[0][1] == 0
    assert next_functions[1][0].name() == "AccumulateGrad"
    assert next_functions[1][1] == 0

    b = a + 5
    next_functions = b.grad_fn.next_functions
    assert len(next_functions) == 2
    assert next_functions[0][0] is a.grad_fn
    assert next_functions[1][0] is None


# torch: test_autograd.py::TestAutograd::test_isolated_node
# (.repeat(1, 5) is .expand(5, 5) here: ca has no repeat)
def test_isolated_node(mode):
    x = randn(5, 5, requires_grad=True)
    y = randn(5, 5, requires_grad=True)

    a = x + y
    b = ca.max(a, 1, True)[1].expand(5, 5).double()
    o = (b + a).sum()
    with under(mode):
        o.backward()
    eq(x.grad, np.ones((5, 5)))
    eq(y.grad, np.ones((5, 5)))


# torch: test_autograd.py::TestAutograd::test_variable_traverse
def test_variable_traverse(mode):
    def get_out_and_unrefed_cycle():
        inp = ca.randn(10, requires_grad=True)
        tmp = inp.view(10, 1)
        out = tmp.view(10)

        # a reference cycle that contains an intermediary tensor of the graph
        my_list = []
        my_list.append(tmp)
        my_list.append(my_list)
        return out, inp

    out, inp = get_out_and_unrefed_cycle()
    gc.collect()
    g = ca.randn(*out.size())
    with under(mode):
        out.backward(g)
    eq(inp.grad, g)


# torch: test_autograd.py::TestAutograd::test_free_deep_graph
# (depth 150000 in torch; 20000 here)
def test_free_deep_graph():
    def scope():
        depth = 20000
        x = ca.randn(1, requires_grad=True)
        y = x.clone()
        for _ in range(depth):
            y = y + y * 0.000001
        return y.requires_grad

    # Should not overflow the stack when the graph is freed
    assert scope()
    gc.collect()


# torch: test_autograd.py::TestAutograd::test_free_deep_graph_complicated
# (depth 100000 in torch; 10000 here, torch.randint's mask drawn with ca.randint)
def test_free_deep_graph_complicated():
    def scope():
        depth = 10000
        randchoice = ca.randint(0, 2, (depth + 1, 2)).double()
        x = ca.randn(1, dtype=F64, requires_grad=True)
        y = x.clone()
        prev_values = [None, None]
        for _ in range(depth):
            prev_tensors = [tensor for tensor in prev_values[:-1] if tensor is not None]
            prev_values.append(y)
            prev_values.pop(0)
            y += y * 0.000001
            nprev = len(prev_tensors)
            if nprev == 2:
                y += (randchoice[depth] * ca.cat(prev_tensors)).sum()
        return y.requires_grad

    assert scope()
    gc.collect()


# torch: test_autograd.py::TestAutograd::test_shape
def test_shape():
    x = ca.randn(3, 4)
    assert 2 == len(x.shape)
    assert x.shape[0] == 3
    assert x.shape[1] == 4


# torch: test_autograd.py::TestAutograd::test_numpy_requires_grad
def test_numpy_requires_grad():
    x = ca.randn(2, 2, requires_grad=True)
    err_msg_outputs = (r"Can't call numpy\(\) on Tensor that requires grad. Use "
                       r"tensor.detach\(\).numpy\(\) instead.")
    with pytest.raises(RuntimeError, match=err_msg_outputs):
        x.numpy()

    with ca.no_grad():
        x.numpy()

    x = ca.randn(2, 2)
    x.numpy()

    with ca.no_grad():
        x.numpy()
