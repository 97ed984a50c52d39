"""Indexing and index assignment, stack/cat/chunk/select, and a few ops' gradients
(fill_, pow): tests ported from PyTorch's test/test_autograd.py (TestAutograd, the
part of the file before character 140000).

Each test runs its backward on the eager engine and under every compiled backend
(the ``mode`` fixture of ``ported.py``).
"""

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


def idx_of(i):
    """A torch-style index as ca takes it: index lists become int64 tensors."""
    if isinstance(i, tuple):
        return tuple(idx_of(j) for j in i)
    if isinstance(i, list):
        return ca.from_numpy(np.array(i, dtype=np.int64))
    if isinstance(i, np.ndarray):
        return ca.from_numpy(i)
    return i


def np_idx(i):
    if isinstance(i, tuple):
        return tuple(np_idx(j) for j in i)
    if isinstance(i, list):
        return np.array(i, dtype=np.int64)
    return i


INDEXES_2D = [
    1, (1, 1), slice(1, None), slice(None, 2), (slice(None, 2), 2), (slice(1, 2), 2),
    (1, slice(2, None)), (slice(None, None), slice(2, None)), [0, 2], "mask",
    (Ellipsis, slice(2, None)), ([0], [0]), ([1, 2, 3], [0]), ([1, 2], [2, 1]),
    ([[1, 2], [3, 0]], [[0, 1], [2, 3]]), (slice(None), [2, 3]), ([2, 3], slice(None)),
    [0], ([0],),
]
INDEXES_3D = [
    (slice(None), [0], [0]), ([0], [0], slice(None)), (slice(None), [0, 1, 2], [0]),
    ([0, 1, 2], [0], slice(None)), (slice(None), [1, 2], [2, 1]),
    ([1, 2], [2, 1], slice(None)), (slice(None), [[1, 2], [2, 0]], [[0, 1], [2, 3]]),
    ([[1, 2], [3, 0]], [[0, 1], [2, 2]], slice(None)), (slice(None), slice(None), [2, 1]),
    (slice(None), [2, 1], slice(None)), ([2, 1], slice(None), slice(None)),
    ([0],), ([0], slice(None)), ([0], Ellipsis), ([1, 2], [0, 1]),
    ([1, 2], [0, 1], Ellipsis), (Ellipsis, [1, 2], [0, 1]), ([0, 1], Ellipsis),
]


# torch: test_autograd.py::TestAutograd::test_indexing
# (index lists are int64 tensors, a list holding slices is a tuple: ca indexes as numpy)
def test_indexing(mode):
    rng = np.random.default_rng(0)

    def check(shape, idx):
        x = np.arange(1., 1 + np.prod(shape)).reshape(shape)
        if idx == "mask":
            idx = rng.random(shape) < 0.5
        y = ca.tensor(x, dtype=F64, requires_grad=True)
        indexed = y[idx_of(idx)]
        eq(indexed, x[np_idx(idx)])
        with under(mode):
            indexed.sum().backward()
        expected_grad = np.zeros(shape)
        expected_grad[np_idx(idx)] = 1
        eq(y.grad, expected_grad)

    for idx in INDEXES_2D:
        check((4, 4), idx)
    for idx in INDEXES_3D:
        check((4, 3, 4), idx)


# torch: test_autograd.py::TestAutograd::test_indexing_duplicates
def test_indexing_duplicates(mode):
    def run(shape, idx):
        y = ca.tensor(np.arange(1., 1 + np.prod(shape)).reshape(shape), dtype=F64,
                      requires_grad=True)
        with under(mode):
            y[idx_of(idx)].sum().backward()
        return y.grad

    idx = [1, 1, 3, 2, 1, 2]
    expected_grad = np.zeros((4, 4))
    for i in idx:
        expected_grad[i] += 1
    eq(run((4, 4), idx), expected_grad)

    # with advanced indexing
    idx = ([1, 1, 3, 2, 1, 2], [0])
    expected_grad = np.zeros((4, 4))
    for i in idx[0]:
        for j in idx[1]:
            expected_grad[i][j] += 1
    eq(run((4, 4), idx), expected_grad)

    idx = ([[1, 2], [0, 0]], [[0, 1], [1, 1]])
    expected_grad = np.array([[0, 2, 0, 0],
                              [1, 0, 0, 0],
                              [0, 1, 0, 0],
                              [0, 0, 0, 0]], dtype=F64)
    eq(run((4, 4), idx), expected_grad)

    idx = ([1, 1, 1], slice(None), slice(None))
    expected_grad = np.zeros((4, 4, 4))
    expected_grad[1] = 3
    eq(run((4, 4, 4), idx), expected_grad)


# torch: test_autograd.py::TestAutograd::test_index_backward_does_not_save_tensor
def test_index_backward_does_not_save_tensor(mode):
    # if indexing saved `tensor` for backward, the version check would fail, since
    # `tensor` is modified by the index assignment
    a = ca.tensor([1., 0, 0])
    b = ca.zeros(3, requires_grad=True)
    tensor = b + 0
    tensor[a != 0] = tensor[a != 0]
    with under(mode):
        tensor.backward(ca.zeros_like(tensor))
    eq(b.grad, np.zeros(3))


def _test_setitem(mode, size, index):
    x = ones(*size, requires_grad=True)
    y = x + 2
    y_version = y._version
    y[idx_of(index)] = 2
    assert y._version != y_version
    with under(mode):
        y.backward(ones(*size))
    expected_grad = np.ones(size)
    expected_grad[np_idx(index)] = 0
    eq(x.grad, expected_grad)


def _test_setitem_tensor(mode, size, index):
    x = ones(*size, requires_grad=True)
    y = x + 2
    y_version = y._version
    value = ca.full(x[idx_of(index)].shape, 7.0, dtype=F64)
    value.requires_grad = True
    y[idx_of(index)] = value
    assert y._version != y_version
    with under(mode):
        y.backward(ones(*size))
    expected_grad_input = np.ones(size)
    expected_grad_input[np_idx(index)] = 0
    eq(x.grad, expected_grad_input)
    eq(value.grad, np.ones(value.shape))

    # case when x broadcasts to as y[1]
    x = randn(4, requires_grad=True)
    y = ca.zeros(2, 3, 4, dtype=F64)
    y[1] = x
    with under(mode):
        y.backward(randn(2, 3, 4))
    assert x.size() == x.grad.size()


# torch: test_autograd.py::TestAutograd::test_setitem
def test_setitem(mode):
    _test_setitem(mode, (5, 5), 1)
    _test_setitem(mode, (5,), 1)
    _test_setitem(mode, (1,), 0)
    _test_setitem(mode, (10,), [0, 4, 2])
    _test_setitem(mode, (5, 5), ([0, 4], [2, 2]))
    _test_setitem(mode, (5, 5, 5), (slice(None), slice(None), [1, 3]))
    _test_setitem(mode, (5, 5, 5), (slice(None), [1, 3], slice(None)))
    _test_setitem(mode, (5, 5, 5), ([1, 3], slice(None), slice(None)))
    _test_setitem(mode, (5, 5, 5), (slice(None), [2, 4], [1, 3]))
    _test_setitem(mode, (5, 5, 5), ([1, 3], [2, 4], slice(None)))
    _test_setitem_tensor(mode, (5, 5), 3)
    _test_setitem_tensor(mode, (5, 5), ([0, 1], [1, 0]))
    _test_setitem_tensor(mode, (5,), 3)
    _test_setitem_tensor(mode, (5,), [0, 1, 2, 3])
    _test_setitem_tensor(mode, (5, 5, 5), (slice(None), slice(None), [1, 3]))
    _test_setitem_tensor(mode, (5, 5, 5), (slice(None), [1, 3], slice(None)))
    _test_setitem_tensor(mode, (5, 5, 5), ([1, 3], slice(None), slice(None)))
    _test_setitem_tensor(mode, (5, 5, 5), (slice(None), [2, 4], [1, 3]))
    _test_setitem_tensor(mode, (5, 5, 5), ([1, 3], [2, 4], slice(None)))


# torch: test_autograd.py::TestAutograd::test_setitem_mask
def test_setitem_mask(mode):
    mask = np.random.default_rng(1).random((5, 5)) < 0.5
    _test_setitem(mode, (5, 5), mask)
    _test_setitem(mode, (5,), mask[0])
    _test_setitem(mode, (1,), mask[0, 0:1])
    _test_setitem_tensor(mode, (5, 5), mask)
    _test_setitem_tensor(mode, (5,), mask[0])


# torch: test_autograd.py::TestAutograd::test_select_sum
def test_select_sum(mode):
    x = randn(10, requires_grad=True)

    def func(x):
        return x.select(0, 1).sum()

    with under(mode):
        assert ca.autograd.gradcheck(func, [x])


# torch: test_autograd.py::TestAutograd::test_stack
def test_stack(mode):
    x = randn(10, 10, requires_grad=True)
    y = randn(10, 10, requires_grad=True)
    z = randn(10, 10, requires_grad=True)
    stacked = ca.stack([x, y, z], 0)
    grad = randn(3, 10, 10)
    with under(mode):
        stacked.backward(grad)
    eq(x.grad, grad[0])
    eq(y.grad, grad[1])
    eq(z.grad, grad[2])


# torch: test_autograd.py::TestAutograd::test_unbind
# (ca has no unbind: the three outputs are stacked.select(0, i))
def test_unbind(mode):
    stacked = randn(3, 10, 10, requires_grad=True)
    x, y, z = (stacked.select(0, i) for i in range(3))
    grad = randn(3, 10, 10)
    with under(mode):
        ca.autograd.backward([x, y, z], [grad[i] for i in range(3)])
    eq(stacked.grad, grad)
    # check that it works with only one gradient provided (#9977)
    for i in range(3):
        stacked = randn(3, 10, 10, requires_grad=True)
        outs = [stacked.select(0, j) for j in range(3)]
        gi = grad[i]
        with under(mode):
            g, = ca.autograd.grad(outs[i], stacked, gi)
        g_expected = ca.stack([gi if j == i else ca.zeros_like(gi) for j in range(3)], dim=0)
        eq(g, g_expected)


# torch: test_autograd.py::TestAutograd::test_fill
def test_fill(mode):
    root = randn(4, 5, requires_grad=True)

    def func(root):
        x = root.clone()
        x.fill_(2)
        return x

    with under(mode):
        assert ca.autograd.gradcheck(func, [root])


# torch: test_autograd.py::TestAutograd::test_unused_output
def test_unused_output(mode):
    x = randn(10, 10, requires_grad=True)
    outputs = x.chunk(5)
    o = outputs[2]
    o = o * 4 + 2
    with under(mode):
        o.sum().backward()
    expected_grad = np.zeros((10, 10))
    expected_grad[4:6] = 4
    eq(x.grad, expected_grad)

    with ca.no_grad():
        x.grad.zero_()
    grad_output = randn(2, 10)
    outputs = x.chunk(5)
    with under(mode):
        outputs[0].backward(grad_output)
    expected_grad = np.zeros((10, 10))
    expected_grad[:2] = grad_output.numpy()
    eq(x.grad, expected_grad)


# torch: test_autograd.py::TestAutograd::test_cat, test_cat_negdim_1, test_cat_negdim_2,
# test_cat_empty (run_functional_checks: gradcheck here; ca has no gradgradcheck)
@pytest.mark.parametrize("shapes,dim", [
    (((1, 5, 5), (2, 5, 5), (3, 5, 5)), 0),     # test_cat
    (((5, 5, 1), (5, 5, 2), (5, 5, 3)), -1),    # test_cat_negdim_1
    (((5, 1, 5), (5, 2, 5), (5, 3, 5)), -2),    # test_cat_negdim_2
    (((0, 5), (5, 5)), 0),                      # test_cat_empty
], ids=["cat", "cat_negdim_1", "cat_negdim_2", "cat_empty"])
def test_cat(mode, shapes, dim):
    args = [ca.randn(*s, dtype=F64, requires_grad=True) for s in shapes]
    with under(mode):
        assert ca.autograd.gradcheck(lambda *a: ca.cat(a, dim), args)


# torch: test_autograd.py::TestAutograd::test_cat_empty_legacy
def test_cat_empty_legacy(mode):
    args = [randn(0, requires_grad=True), randn(5, 5, requires_grad=True)]
    with under(mode):
        assert ca.autograd.gradcheck(lambda a, b: ca.cat((a, b)), args, eps=1e-6, atol=1e-4)


# torch: test_autograd.py::TestAutograd::test_pow_zero_tensor_gradient
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 0 ** -1 inside, as in torch
def test_pow_zero_tensor_gradient(mode):
    def run_test(input_size, exponent):
        input = ca.zeros(*input_size, requires_grad=True)
        with under(mode):
            input.pow(exponent).sum().backward()
        assert input.grad.abs().sum().item() == 0

    run_test((10,), ca.zeros(10))
    run_test((10, 10), ca.zeros(10, 10))
    run_test((10,), 0)


# torch: test_autograd.py::TestAutograd::test_pow_scalar_base
# (torch's input is a view given requires_grad and its function torch.pow(2, a); each
# was once a difference of its own here, so each has its variant: "view_leaf" is
# torch's input with 2 ** a, "pow_function" is ca.pow(2, a) on a fresh leaf,
# "fresh_leaf" is 2 ** a on one)
@pytest.mark.parametrize("variant", ["view_leaf", "pow_function", "fresh_leaf"])
def test_pow_scalar_base(mode, variant):
    if variant == "view_leaf":
        a = ca.arange(1, 13, dtype=F64).view(3, 4).requires_grad_()
    else:
        a = ca.tensor(np.arange(1, 13, dtype=F64).reshape(3, 4), dtype=F64,
                      requires_grad=True)
    fn = (lambda a: ca.pow(2, a)) if variant == "pow_function" else (lambda a: 2 ** a)
    with under(mode):
        assert ca.autograd.gradcheck(fn, (a,))


# torch: test_autograd.py::TestAutograd::test_leaf_assignment
def test_leaf_assignment(mode):
    x = randn(5, 5)
    y = randn(5, requires_grad=True)
    z = randn(5, requires_grad=True)

    x[0] = y
    x[1] = 2 * z
    assert x.requires_grad
    assert x.grad_fn is not None
    with under(mode):
        x.sum().backward()
    eq(y.grad, np.ones(5))
    eq(z.grad, np.ones(5) * 2)


# torch: test_autograd.py::TestAutograd::test_no_grad_assignment
def test_no_grad_assignment():
    x = randn(5, 5, requires_grad=True)
    y = randn(5)
    with ca.no_grad():
        x[0] = y

    assert x.requires_grad
    assert x.grad_fn is None
