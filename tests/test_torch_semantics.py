"""Semantics compared with torch 2.13 on the same code (issue 29, items 6-8): the
values below are what torch gives (checked against torch when installed)."""
import math

import numpy as np
import pytest

import compiled_autograd as ca
from helpers import needs_cc

try:
    import torch
except ImportError:          # (the oracle is optional)
    torch = None

BACKENDS = [None, "python", pytest.param("c", marks=needs_cc)]


def _grad(fn, values, backend):
    x = ca.tensor(values, requires_grad=True)
    if backend is None:
        fn(x).sum().backward()
    else:
        with ca.compiled_backward(backend=backend):
            fn(x).sum().backward()
    return x.grad.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, expected", [("relu", [1.0, 0.0, 0.0, 1.0]),
                                            ("abs", [0.0, -1.0, 0.0, 1.0])])
def test_relu_and_abs_gradients_at_nan_are_torchs(name, expected, backend,
                                                  fresh_compiled_cache):
    values = [math.nan, -1.0, 0.0, 2.0]
    got = _grad(lambda x: getattr(x, name)(), values, backend)
    np.testing.assert_array_equal(got, expected)
    if torch is not None:
        t = torch.tensor(values, requires_grad=True)
        getattr(t, name)().sum().backward()
        np.testing.assert_array_equal(t.grad.numpy(), expected)


def test_sign_of_nan_is_zero_as_torch():
    np.testing.assert_array_equal(ca.tensor([math.nan, -3.0, 0.0, 2.0]).sign().numpy(),
                                  [0.0, -1.0, 0.0, 1.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_int64_gradient_is_cast_to_the_outputs_dtype(backend, fresh_compiled_cache):
    x = ca.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    y = x * 2
    g = ca.from_numpy(np.array([1, 2, 3, 4], dtype=np.int64))
    if backend is None:
        y.backward(g)
    else:
        with ca.compiled_backward(backend=backend):
            y.backward(g)
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0, 6.0, 8.0])
    (gx,) = ca.autograd.grad(x * 3, x, grad_outputs=ca.from_numpy(np.array([1, 0, 1, 0])))
    np.testing.assert_array_equal(gx.numpy(), [3.0, 0.0, 3.0, 0.0])


def test_a_gradient_that_is_not_a_tensor_is_a_type_error():
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    with pytest.raises(TypeError, match="gradients can be either Tensors or None, but got "
                                        "list"):
        ca.autograd.grad(y, x, grad_outputs=[[1.0, 2.0]])
    with pytest.raises(TypeError, match="but got list"):
        ca.autograd.backward([y], grad_tensors=[[1.0, 2.0]])
    with pytest.raises(TypeError, match="but got ndarray"):
        y.backward(np.ones(2))
    assert x.grad is None
    y.backward(ca.ones(2))                      # (nothing changed: the graph is whole)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


def test_a_complex_gradient_for_a_real_output_names_both_dtypes():
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="For complex Tensors.*complex128.*float32"):
        (x * 2).backward(ca.from_numpy(np.array([1 + 1j, 2 + 0j])))


def test_every_autograd_node_is_a_graph_node():
    from compiled_autograd.autograd.graph import Node
    x = ca.tensor([1.0, 2.0], requires_grad=True)

    class Double(ca.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    y = Double.apply(x * 3)
    z = y.view(2)
    z[0] = 5.0 * y[1]                     # CopySlices
    nodes, stack = [], [z.grad_fn]
    while stack:
        fn = stack.pop()
        nodes.append(fn)
        stack += [nxt for nxt, _ in fn.next_functions if nxt is not None]
    assert {type(n).__name__ for n in nodes} >= {"AccumulateGrad", "MulBackward",
                                                 "CopySlices"}
    for fn in nodes:
        assert isinstance(fn, Node) and isinstance(fn, ca.autograd.graph.Node)
        assert isinstance(fn.name(), str) and isinstance(fn.metadata, dict)
        assert callable(fn.register_hook) and callable(fn.register_prehook)
    assert "Node" in ca.autograd.graph.__all__


def test_unbind_gives_views_that_may_not_be_modified_in_place():
    x = ca.tensor(np.arange(6.0).reshape(3, 2), requires_grad=True)
    parts = x.unbind(1)
    assert len(parts) == 2 and [p.shape for p in parts] == [(3,), (3,)]
    np.testing.assert_array_equal(parts[1].detach().numpy(), [1.0, 3.0, 5.0])
    (parts[0] * 2 + parts[1] * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[2.0, 3.0]] * 3)
    assert [t.shape for t in ca.unbind(x)] == [(2,)] * 3
    y = x.clone()
    with pytest.raises(RuntimeError, match="Output 0 of Unbind is a view and is being "
                                           "modified inplace. This view is the output of a "
                                           "function that returns multiple views"):
        y.unbind(0)[0].mul_(2)


@pytest.mark.parametrize("value", [1, 0, 1.0, None, np.bool_(True)])
def test_requires_grad_must_be_a_bool(value):
    x = ca.tensor([1.0])
    with pytest.raises(RuntimeError, match="requires_grad must be a bool"):
        x.requires_grad = value
    assert x.requires_grad is False
    x.requires_grad = True
    assert x.requires_grad


def test_a_function_under_no_grad_returning_an_input_gives_an_alias():
    class Identity(ca.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a

        @staticmethod
        def backward(ctx, g):
            return g

    x = ca.tensor([1.0, 2.0], requires_grad=True)
    with ca.no_grad():
        y = Identity.apply(x)
    assert y is not x and not y.requires_grad and y.is_leaf     # torch's, on the same code
    x.detach().mul_(3)                     # the same storage and version counter
    np.testing.assert_array_equal(y.numpy(), [3.0, 6.0])
    assert y._version == x._version


def test_a_no_grad_view_whose_base_changed_in_place_says_so():
    base = ca.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True).clone()
    with ca.no_grad():
        view = base[:2]
    base.mul_(2)
    for _ in range(2):                   # (every time, as torch)
        with pytest.raises(RuntimeError, match="A view was created in no_grad mode and its "
                                               "base or another view of its base has been "
                                               "modified inplace with grad mode enabled"):
            view.grad_fn
    plain = ca.tensor([1.0, 2.0, 3.0, 4.0])      # (a base without grad: no error)
    with ca.no_grad():
        v = plain[:2]
    plain.mul_(2)
    assert v.grad_fn is None


def test_a_no_grad_view_of_a_leaf_that_requires_grad_requires_grad():
    x = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with ca.no_grad():
        v = x[0:2]
    assert v.requires_grad and v.is_leaf and v.grad_fn is None      # torch's, the same code
    with ca.no_grad():
        w = ca.tensor([1.0, 2.0])[0:1]
    assert not w.requires_grad


def test_stride_is_torchs():
    torch = pytest.importorskip("torch")
    for make in (lambda m: m.zeros(2, 3, 4), lambda m: m.zeros(2, 3, 4).transpose(0, 2),
                 lambda m: m.zeros(5, 6)[1:, ::2], lambda m: m.zeros(3, 1).expand(3, 4),
                 lambda m: m.zeros(()), lambda m: m.zeros(0, 3)):
        a, t = make(ca), make(torch)
        assert a.stride() == t.stride()
        for d in range(-a.ndim, a.ndim):
            assert a.stride(d) == t.stride(d)
        for bad in (a.ndim, -a.ndim - 1):
            with pytest.raises(IndexError) as ours:
                a.stride(bad)
            with pytest.raises(IndexError) as theirs:
                t.stride(bad)
            assert str(ours.value) == str(theirs.value)
