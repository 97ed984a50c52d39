"""Custom autograd.Function: saved tensors, non-tensor arguments, several outputs,
needs_input_grad, mark_non_differentiable, errors; compared with torch."""
import contextlib

import numpy as np
import pytest

import compiled_autograd as ca
from helpers import BACKENDS, assert_close, needs_torch, torch


def _define(m):
    class ScaledExp(m.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale, name):
            y = (x * scale).exp()
            ctx.save_for_backward(y)
            ctx.scale = scale
            ctx.label = name
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * y * ctx.scale, None, None

    class SplitSum(m.autograd.Function):
        """Two differentiable outputs."""
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b, a + b

        @staticmethod
        def backward(ctx, g_prod, g_sum):
            a, b = ctx.saved_tensors
            ga = g_prod * b + g_sum if ctx.needs_input_grad[0] else None
            gb = g_prod * a + g_sum if ctx.needs_input_grad[1] else None
            return ga, gb
    return ScaledExp, SplitSum


def _run(m):
    ScaledExp, SplitSum = _define(m)
    x = m.tensor([0.1, -0.4, 0.3], requires_grad=True)
    b = m.tensor([1.0, 2.0, -1.0], requires_grad=True)
    y = ScaledExp.apply(x, 2.0, "exp")
    p, s = SplitSum.apply(y, b)
    (p * s).sum().backward()
    return x.grad.numpy(), b.grad.numpy(), y.grad_fn.name()


def test_custom_function_gradients_analytic():
    gx, gb, name = _run(ca)
    x, b = np.array([0.1, -0.4, 0.3]), np.array([1.0, 2.0, -1.0])
    y = np.exp(2 * x)
    # loss = sum(y*b * (y+b)) -> d/dy = 2yb + b^2, d/db = y^2 + 2yb
    assert_close(gb, y * y + 2 * y * b, rtol=1e-5)
    assert_close(gx, (2 * y * b + b * b) * y * 2, rtol=1e-5)
    assert name == "ScaledExpBackward"


@needs_torch
def test_custom_function_matches_torch():
    ours, theirs = _run(ca), _run(torch)
    assert_close(ours[0], theirs[0])
    assert_close(ours[1], theirs[1])
    assert ours[2] == theirs[2]


def test_needs_input_grad_and_non_tensor_args():
    seen = {}

    class Probe(ca.autograd.Function):
        @staticmethod
        def forward(ctx, a, k, b):
            seen["needs"] = ctx.needs_input_grad
            return a * k + b

        @staticmethod
        def backward(ctx, g):
            return g * 3, None, None

    a = ca.randn(2, requires_grad=True)
    out = Probe.apply(a, 3, ca.randn(2))
    out.sum().backward()
    assert seen["needs"] == (True, False, False)
    assert_close(a.grad.numpy(), [3.0, 3.0])


def test_mark_non_differentiable_and_int_outputs():
    class ArgmaxAndMax(ca.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            idx = x.argmax()
            mask = x > 0
            ctx.mark_non_differentiable(mask)
            ctx.save_for_backward(x)
            return x.max(), idx, mask

        @staticmethod
        def backward(ctx, g, g_idx, g_mask):
            (x,) = ctx.saved_tensors
            out = ca.zeros(*x.shape)
            out[x.argmax()] = 1.0
            return out * g

    x = ca.tensor([0.5, 2.0, -1.0], requires_grad=True)
    m, idx, mask = ArgmaxAndMax.apply(x)
    assert m.requires_grad and not idx.requires_grad and not mask.requires_grad
    m.backward()
    assert_close(x.grad.numpy(), [0.0, 1.0, 0.0])


def test_wrong_number_of_gradients():
    class Bad(ca.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            return g

    a, b = ca.randn(2, requires_grad=True), ca.randn(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"function BadBackward returned an incorrect number "
                                           r"of gradients \(expected 2, got 1\)"):
        Bad.apply(a, b).sum().backward()


def test_wrong_gradient_shape():
    class Bad(ca.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return ca.ones(5)

    a = ca.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Function BadBackward returned an invalid gradient "
                                           r"at index 0 - got \[5\] but expected shape "
                                           r"compatible with \[2, 3\]"):
        Bad.apply(a).sum().backward()


def test_saved_tensor_version_check():
    class Square(ca.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    a = ca.randn(3, requires_grad=True)
    h = a * 1.0
    out = Square.apply(h)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="is at version 1; expected version 0 instead"):
        out.sum().backward()


def test_double_backward_through_custom_function():
    class Cube(ca.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * x * g

    x = ca.tensor([1.0, 2.0], requires_grad=True)
    (g,) = ca.autograd.grad(Cube.apply(x).sum(), [x], create_graph=True)
    (gg,) = ca.autograd.grad(g.sum(), [x])
    assert_close(gg.numpy(), [6.0, 12.0])


def test_returning_an_input_and_no_grad():
    class Identity(ca.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = ca.randn(2, requires_grad=True)
    y = Identity.apply(x)
    assert y is not x and y.grad_fn.name() == "IdentityBackward"
    y.sum().backward()
    assert_close(x.grad.numpy(), [2.0, 2.0])
    with ca.no_grad():
        assert not Identity.apply(x).requires_grad or Identity.apply(x) is x


def test_saved_tensor_hooks_apply_to_function_saves():
    packed = []

    class Square(ca.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = ca.tensor([1.0, 3.0], requires_grad=True)
    with ca.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or ("box", t),
                                               lambda box: box[1]):
        out = Square.apply(x)
    assert len(packed) == 1 and packed[0] is x
    out.sum().backward()
    assert_close(x.grad.numpy(), [2.0, 6.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_ctx_attribute_that_is_also_a_leaf(backend):
    # The leaf's accumulation needs the Tensor (for .grad), the backward its
    # values: the compiled backward once handed the accumulation the array.
    class Scale(ca.autograd.Function):
        inline_backward = True   # (its ctx attribute is lifted into the graph)

        @staticmethod
        def forward(ctx, x, w):
            ctx.w = w
            return x * w

        @staticmethod
        def backward(ctx, g):
            return g * ctx.w, None

    def grads(compiled):
        x = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
        w = ca.tensor([0.5, -1.0, 2.0], requires_grad=True)
        with ca.compiled_backward(backend=backend) if compiled else contextlib.nullcontext():
            (Scale.apply(x, w) * w).sum().backward()
        return x.grad.numpy(), w.grad.numpy()
    for want, got in zip(grads(False), grads(True)):
        np.testing.assert_allclose(got, want)


def _view_outputs(m, case):
    class TView(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return (x * 2).t()                 # a view of a tensor made inside

        @staticmethod
        def backward(ctx, g):
            return g.t() * 2

    x = m.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = TView.apply(x)
    (y if case == "output" else y[0]).mul_(3)


@pytest.mark.parametrize("case", ["output", "a view of it"])
def test_in_place_on_a_view_a_custom_function_returned_is_refused(case):
    # It once rebased onto the Function's internal tensor: x.grad was None.
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        _view_outputs(ca, case)


@needs_torch
@pytest.mark.parametrize("case", ["output", "a view of it"])
def test_in_place_on_a_view_a_custom_function_returned_is_refused_in_torch(case):
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        _view_outputs(torch, case)
