"""Tests ported from PyTorch's test/test_autograd.py (second half of the file), part 2:
views and in-place ops (version counters, CopySlices, view+inplace errors, custom
Functions that return views), from TestAutograd and TestAutogradDeviceType, and the
device-type tests of ops ca has (min/max, where, mv, grad assignment, requires_grad).

Assertions are torch 2.13's (the oracle installed here): in-place on a view that a
custom Function or split returned is an error in torch 2.13, where the stored 2020
version of the file expected a deprecation warning."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.autograd import Function
from ported import mode, under  # noqa: F401  (mode is a fixture)
from ported_gradgrad import gradgradcheck

LEAF_GRAD_ERR = "A view was created in no_grad mode and is being modified inplace"



def randn64(*shape, requires_grad=True):
    return ca.randn(*shape, dtype=np.float64, requires_grad=requires_grad)


def split_err(i):
    return (f"Output {i} of Split is a view and is being modified inplace. This view is the "
            "output of a function that returns multiple views.")


# torch: test_autograd.py::TestAutograd::test_autograd_views_codegen
# (view_as is view(shape) and unbind is split(1) here: ca has neither; torch 2.13 gives
# split's outputs the same refusal as unbind's)
@pytest.mark.parametrize("grad_mode, requires_grad, should_raise", [
    (True, False, (None, None, None)),
    (True, True, (None, split_err(0), split_err(1))),
    (False, True, (LEAF_GRAD_ERR, LEAF_GRAD_ERR, LEAF_GRAD_ERR)),
    (False, False, (None, None, None)),
])
def test_autograd_views_codegen(grad_mode, requires_grad, should_raise):
    def maybe_check_raise(fn, should_raise):
        if should_raise is not None:
            with pytest.raises(RuntimeError, match=should_raise):
                fn()
        else:
            fn()

    inp = ca.rand(2, requires_grad=requires_grad).clone()
    with ca.set_grad_enabled(grad_mode):
        out = inp.view(inp.shape)
    # Are they differentiable views?
    assert out._base is not None
    # Are inplace allowed?
    maybe_check_raise(lambda: out.add_(1), should_raise[0])

    inp = ca.rand(2, requires_grad=requires_grad).clone()
    with ca.set_grad_enabled(grad_mode):
        out = inp.split(1)
    assert out[0]._base is not None
    assert out[1]._base is not None
    maybe_check_raise(lambda: out[0].add_(1), should_raise[1])
    maybe_check_raise(lambda: out[1].add_(1), should_raise[2])


# ---- test_autograd_simple_views_python: custom Functions returning an input, a view of
# an input or a view of a temporary, then modified in place or not

bw_called = [0]
ga_nz = [False]


class IdOneOutput(Function):
    @staticmethod
    def forward(ctx, a, b, make_view):
        if make_view:
            a = a.narrow(0, 0, 2)
        else:
            a = a.clone()
        return a

    @staticmethod
    def backward(ctx, ga):
        bw_called[0] += 1
        return ga, None, None


class IdTwoOutput(Function):
    @staticmethod
    def forward(ctx, a, b, make_view):
        if make_view:
            a = a.narrow(0, 0, 2)
        else:
            a = a.clone()
        return a, a + b

    @staticmethod
    def backward(ctx, ga, gab):
        bw_called[0] += 1
        if ga.eq(0).sum().item() == ga.numel():     # ga.eq(0).all()
            ga_nz[0] = False
        else:
            ga_nz[0] = True
        return ga + gab, gab, None


class ViewOfTemp(Function):
    @staticmethod
    def forward(ctx, a, make_view):
        ctx.save_for_backward(a)
        if make_view:
            a = a.narrow(0, 0, 2)
        else:
            a = a.clone()
        b = a.clone()
        return b.select(0, 0)

    @staticmethod
    def backward(ctx, grad):
        bw_called[0] += 1
        a, = ctx.saved_tensors
        res = ca.zeros_like(a)
        res.select(0, 0).copy_(grad)
        return res, None


def simple_views_fn(fn_id, inplace, make_view):
    def fn(a, b):
        # never modify a, b inplace for gracheck
        a = a.clone()
        b = b.clone()
        if fn_id == "two_output":
            tmp1, tmp2 = IdTwoOutput.apply(a, b, make_view)
            if inplace:
                tmp1 += 3
                tmp2 += 3
            else:
                tmp1 = tmp1 + 3
                tmp2 = tmp2 + 3
            tmp = tmp1 * tmp2
        else:
            if fn_id == "one_output":
                tmp = IdOneOutput.apply(a, b, make_view)
            else:
                tmp = ViewOfTemp.apply(a + b, make_view)
            if inplace:
                tmp += 3
            else:
                tmp = tmp + 3
        return tmp.sum()
    return fn


SIMPLE_VIEWS = [(f, i, v) for f in ("one_output", "two_output", "view_of_temp")
                for i in (True, False) for v in (True, False)]


# torch: test_autograd.py::TestAutograd::test_autograd_simple_views_python
# (the cases that raise: torch 2.13 refuses the in-place op on the view)
@pytest.mark.parametrize("fn_id, inplace, make_view",
                         [c for c in SIMPLE_VIEWS if c[1] and (c[2] or c[0] == "view_of_temp")])
def test_autograd_simple_views_python_refused(fn_id, inplace, make_view):
    fn = simple_views_fn(fn_id, inplace, make_view)
    name = {"one_output": "IdOneOutput", "two_output": "IdTwoOutput",
            "view_of_temp": "ViewOfTemp"}[fn_id]
    err_msg = f"Output 0 of {name} is a view and is being modified inplace."
    if fn_id == "two_output":
        err_msg += " This view is the output of a function that returns multiple views."
    else:
        err_msg += " This view was created inside a custom Function"
    a = ca.ones(2, dtype=np.float64, requires_grad=True)
    b = ca.ones(2, dtype=np.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match=err_msg):
        fn(a, b)


# torch: test_autograd.py::TestAutograd::test_autograd_simple_views_python
# (the cases that run: gradcheck, and the custom backward is called once)
@pytest.mark.parametrize("fn_id, inplace, make_view",
                         [c for c in SIMPLE_VIEWS
                          if not (c[1] and (c[2] or c[0] == "view_of_temp"))])
def test_autograd_simple_views_python(fn_id, inplace, make_view, mode, request):
    fn = simple_views_fn(fn_id, inplace, make_view)
    a = ca.ones(2, dtype=np.float64, requires_grad=True)
    b = ca.ones(2, dtype=np.float64, requires_grad=True)
    with under(mode):
        assert ca.autograd.gradcheck(fn, (a, b))

    # Was the custom backward called properly
    bw_called[0] = 0
    ga_nz[0] = True  # For the case where the backward is called
    with under(mode):
        fn(a, b).backward()
    assert bw_called[0] == 1
    assert ga_nz[0]


# torch: test_autograd.py::TestAutograd::test_autograd_complex_views_python
# (torch 2.13 refuses `out += 1`, where the 2020 version expected one warning)
def test_autograd_complex_views_python(mode):
    bw_called = [0]

    class ComplexView(Function):
        @staticmethod
        def forward(ctx, a, idx):
            res = a.narrow(0, idx, 1)
            res = a.select(0, idx)
            ctx.save_for_backward(a)
            ctx.idx = idx
            return res

        @staticmethod
        def backward(ctx, grad):
            bw_called[0] += 1
            a, = ctx.saved_tensors
            res = ca.zeros_like(a)
            res.select(0, ctx.idx).copy_(grad)
            return res, None

    a = ca.ones(2, requires_grad=True)
    idx = 1

    bw_called[0] = 0
    out = ComplexView.apply(a.clone(), idx)
    with under(mode):
        out.sum().backward()
    assert bw_called[0] == 1
    np.testing.assert_array_equal(a.grad.numpy(), [0., 1.])

    out = ComplexView.apply(a.clone(), idx)
    with pytest.raises(RuntimeError, match="Output 0 of ComplexView is a view and is being "
                       "modified inplace. This view was created inside a custom Function"):
        out += 1


# torch: test_autograd.py::TestAutograd::test_custom_function_return_view_in_nograd
def test_custom_function_return_view_in_nograd():
    class Alias(Function):
        @staticmethod
        def forward(ctx, x):
            return x[:]

        @staticmethod
        def backward(ctx, gx):
            return gx

    inp = ca.rand(2, requires_grad=True)

    with ca.no_grad():
        output = Alias.apply(inp)

    with ca.no_grad():
        expected_output = inp[:]

    # Calling the custom function should operate as if we called an equivalent op
    assert output.requires_grad == expected_output.requires_grad

    # Check that in-place modification on view throws
    with pytest.raises(RuntimeError, match=LEAF_GRAD_ERR):
        output.zero_()


# torch: test_autograd.py::TestAutogradDeviceType::test_min_max_median_backprops_to_all_values
# (min and max: ca has no median)
@pytest.mark.parametrize("f", [ca.min, ca.max], ids=["min", "max"])
def test_min_max_median_backprops_to_all_values(f, mode):
    x = ca.tensor([1., 0., 1., 0., 1., 0.], requires_grad=True)
    y = f(x)
    with under(mode):
        y.backward()
    assert x.grad.sum().item() == pytest.approx(1.)
    assert (x.grad.numpy() == np.float32(1 / 3)).sum() == 3


def mask_not_all_zeros(shape):
    rng = np.random.default_rng(1)
    while True:
        m = rng.standard_normal(shape) > 0
        if m.any():
            return ca.from_numpy(m)


# torch: test_autograd.py::TestAutogradDeviceType::test_where_functional
def test_where_functional(mode, request):
    x = randn64(5, 5)
    y = randn64(5, 5)
    cond = mask_not_all_zeros((5, 5))

    def where(cond, x, y):
        return ca.where(cond, x, y)

    x2 = randn64(5, 1, 5)
    y2 = randn64(5, 5, 1)
    with under(mode):
        assert ca.autograd.gradcheck(where, [cond, x, y])
        assert ca.autograd.gradcheck(where, [cond, x2, y2])
    with under(mode):
        assert gradgradcheck(where, [cond, x, y], [randn64(5, 5)])
        assert gradgradcheck(where, [cond, x2, y2], [randn64(5, 5, 5)])


# torch: test_autograd.py::TestAutogradDeviceType::test_where_scalar
def test_where_scalar(mode, request):
    x = randn64(5, 5)
    scalar = 4.
    cond = mask_not_all_zeros((5, 5))

    def where_scalar_first(cond, x):
        return ca.where(cond, scalar, x)

    def where_scalar_second(cond, x):
        return ca.where(cond, x, scalar)

    with under(mode):
        assert ca.autograd.gradcheck(where_scalar_first, (cond, x))
        assert ca.autograd.gradcheck(where_scalar_second, (cond, x))
    with under(mode):
        assert gradgradcheck(where_scalar_first, (cond, x))
        assert gradgradcheck(where_scalar_second, (cond, x))


# torch: test_autograd.py::TestAutogradDeviceType::test_leaky_relu_inplace_with_zero_slope
# (leaky_relu_ with slope 0 is relu_ here: ca has no leaky_relu)
def test_leaky_relu_inplace_with_zero_slope(mode):
    a = ca.tensor([-2., 0., 2.], requires_grad=True)
    b = a.clone().relu_()
    with under(mode):
        b.backward(ca.ones(3))
    np.testing.assert_array_equal(a.grad.numpy(), [0., 0., 1.])


# torch: test_autograd.py::TestAutogradDeviceType::test_grad_assignment
@pytest.mark.parametrize("case", ["shape", "dtype", "self"])
def test_grad_assignment(case):
    x = ca.randn(5, 5)
    value = {"shape": lambda: ca.randn(2, 2),
             "dtype": lambda: ca.zeros(5, 5, dtype=np.int64),
             "self": lambda: x}[case]()
    # Tests that the wrong shape / the wrong dtype / self-assignment raises
    with pytest.raises(RuntimeError):
        x.grad = value


# torch: test_autograd.py::TestAutogradDeviceType::test_set_requires_grad_only_for_floats
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int16, np.int32,
                                   np.int64])
def test_set_requires_grad_only_for_floats(dtype):
    def f1():
        a = ca.ones(1, dtype=dtype)
        a.requires_grad_()

    def f2():
        a = ca.ones(1, dtype=dtype)
        a.requires_grad = True

    def f3():
        ca.ones(1, dtype=dtype, requires_grad=True)

    a = ca.ones(1, dtype=dtype)
    a.requires_grad = False  # should always work
    a.requires_grad_(False)

    for f in [f1, f2, f3]:
        if np.dtype(dtype).kind == "f":
            f()
        else:
            with pytest.raises(RuntimeError, match="floating point"):
                f()


# torch: test_autograd.py::TestAutogradDeviceType::test_requires_grad_factory
# (ones_like only: ca has no randn_like; no device)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_requires_grad_factory(dtype):
    x = ca.randn(2, 3, dtype=dtype)
    for requires_grad in [True, False]:
        output = ca.ones_like(x, dtype=dtype, requires_grad=requires_grad)
        assert requires_grad == output.requires_grad
        assert output.dtype == np.dtype(dtype)


# torch: test_autograd.py::TestAutogradDeviceType::test_copy_
# (float32 and float64 only; not the bfloat16 `to`)
def test_copy_():
    x = ca.randn(10, requires_grad=True)
    for dt in (np.float32, np.float64):
        y = ca.zeros(10, dtype=dt)
        y.copy_(x)
        assert y.requires_grad


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_backprop_base
def test_inplace_view_backprop_base(mode):
    # modify view and back-prop through base
    root = ca.randn(2, 2, requires_grad=True)
    x = root.clone()
    v1 = x.narrow(0, 0, 1)
    v1.mul_(2)
    with under(mode):
        x.sum().backward()
    assert root.grad.tolist() == [[2, 2], [1, 1]]


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_backprop_view_of_view
def test_inplace_view_backprop_view_of_view(mode):
    # modify view and backprop through view-of-view
    root = ca.randn(2, 2, requires_grad=True)
    x = root.clone()
    v1 = x.narrow(0, 0, 1)
    v2 = x.narrow(0, 0, 1)
    v1.mul_(2)
    with under(mode):
        v2.sum().backward()
    assert root.grad.tolist() == [[2, 2], [0, 0]]


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_of_view
def test_inplace_view_of_view(mode):
    # modify view-of-view and backprop through base
    root = ca.randn(2, 2, requires_grad=True)
    x = root.clone()
    v1 = x.narrow(0, 0, 1)
    v2 = v1.narrow(1, 1, 1)
    v2.mul_(2)
    with under(mode):
        x.sum().backward()
    assert root.grad.tolist() == [[1, 2], [1, 1]]


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_gradcheck
def test_inplace_view_gradcheck(mode, request):
    # gradcheck modifications to views
    a = randn64(4, 4)
    b = randn64(2, 2)

    def func(root, b):
        x = root.clone()
        x.narrow(1, 2, 2).narrow(0, 1, 2).mul_(b)
        x.narrow(1, 0, 2).narrow(0, 1, 2).mul_(b)
        return x

    with under(mode):
        assert ca.autograd.gradcheck(func, [a, b])
    go = randn64(*a.shape)
    with under(mode):
        assert gradgradcheck(func, (a, b), (go,))


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_multiple_outputs
# (split(1) for unbind: ca has no unbind)
def test_inplace_view_multiple_outputs():
    root = ca.arange(9.).reshape(3, 3).requires_grad_()
    x = root.clone()
    v1 = x.split(1)
    with pytest.raises(RuntimeError):
        v1[0].mul_(2)


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_makes_base_require_grad
def test_inplace_view_makes_base_require_grad(mode, request):
    # in-place modification to view makes base require grad
    a = randn64(4, 4, requires_grad=False)
    b = randn64(4, 2)
    seen = []

    def func(root, b):
        x = root.clone()
        seen.append(x.requires_grad)
        x.narrow(1, 2, 2).mul_(b)
        seen.append(x.requires_grad)
        return x

    with under(mode):
        assert ca.autograd.gradcheck(func, [a, b])
    assert seen and seen[::2] == [False] * (len(seen) // 2)
    assert seen[1::2] == [True] * (len(seen) // 2)
    go = randn64(*a.shape)
    with under(mode):
        assert gradgradcheck(func, (a, b), (go,))


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_backprop_view
def test_inplace_view_backprop_view(mode):
    # modify view and backprop through view
    a = ca.tensor([2., 5.], requires_grad=False)
    b = ca.tensor([3.], requires_grad=True)
    res = a.narrow(0, 1, 1).mul_(b)
    with under(mode):
        res.sum().backward()
    assert b.grad.tolist() == [5]
    assert a.grad is None


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_modify_base
def test_inplace_view_modify_base(mode, request):
    # Test that an in-place operation on a base that forced it to require
    # grad also forces any previous views to require grad and backprop
    # correctly
    r = ca.ones(1, dtype=np.float64, requires_grad=True)
    seen = []

    def fn(r):
        x = ca.ones(5, dtype=np.float64)
        v = x.select(0, 1)
        seen.append((v.requires_grad, v.grad_fn is None))
        x.add_(r)  # v is now dependent on r due to the in-place op on x
        seen.append(v.requires_grad)
        return v

    with under(mode):
        assert ca.autograd.gradcheck(fn, [r])
    assert set(seen[::2]) == {(False, True)}
    assert set(seen[1::2]) == {True}
    with under(mode):
        assert gradgradcheck(fn, [r])


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_non_contig
def test_inplace_view_non_contig(mode):
    root = ca.ones(2, 3, 2).select(2, 1).t().requires_grad_(True)
    x = root.clone()
    v1 = x.narrow(0, 0, 1)
    v2 = v1.narrow(1, 1, 1)
    v2.mul_(2)
    with under(mode):
        x.sum().backward()
    assert root.grad.tolist() == [[1, 2], [1, 1], [1, 1]]


# torch: test_autograd.py::TestAutogradDeviceType::test_inplace_view_multi_output_safe
# (torch 2.13 refuses it; the 2020 version expected a warning "Consider using `unsafe_`
# version"; split_with_sizes is split with a list here)
@pytest.mark.parametrize("f", [lambda t: t.split(1), lambda t: t.split([1, 1, 1]),
                               lambda t: t.chunk(3)], ids=["split", "split_sizes", "chunk"])
def test_inplace_view_multi_output_safe(f, request):
    a = ca.randn(3, 3, requires_grad=True)
    b = a + a
    s1, s2, s3 = f(b)
    msg = split_err(0)
    if "split_sizes" in request.node.name:
        msg = msg.replace("Split", "SplitWithSizes")
    with pytest.raises(RuntimeError, match=msg):
        s1.mul_(s2)


# torch: test_autograd.py::TestAutogradDeviceType::test_mv_grad_stride_0
def test_mv_grad_stride_0(mode, request):
    # Reference: https://github.com/pytorch/pytorch/issues/38315
    mat = randn64(2, 2, requires_grad=False)
    vec = randn64(1)

    def fn(vec):
        # Expand inside the function to make sure the input to
        # gradcheck does not have overlapping memory
        vec = vec.expand(2)
        return (mat @ vec).sum()

    with under(mode):
        assert ca.autograd.gradcheck(fn, (vec,))
    with under(mode):
        assert gradgradcheck(fn, (vec,))
