"""Edge cases of torch's semantics that a review found wrong here once; each is
compared with torch, or with the torch error where torch refuses."""
import numpy as np
import pytest

import compiled_autograd as ca
from helpers import BACKENDS, assert_close, needs_torch, torch


def test_inplace_with_operand_aliasing_target_is_refused_at_backward():
    x = ca.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = x * 1
    y.mul_(y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def _copyslices_on_non_c_base(m):
    b = m.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3)).t().detach()
    w = m.tensor([10.0, 20.0], requires_grad=True)
    b[0].mul_(w)
    (b * m.tensor(np.arange(6.0, dtype=np.float32).reshape(3, 2) + 1)).sum().backward()
    return w.grad.numpy()


def test_copyslices_on_a_base_not_in_c_order():
    # b = [[0,3],[1,4],[2,5]]; row 0 (0, 3) times w; weights row 0 = (1, 2)
    assert_close(_copyslices_on_non_c_base(ca), [0.0 * 1, 3.0 * 2])


@needs_torch
def test_copyslices_on_a_base_not_in_c_order_torch():
    assert_close(_copyslices_on_non_c_base(ca), _copyslices_on_non_c_base(torch))


def _hooks_and_capture(m):
    x = m.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    x.register_hook(lambda g: g * 3)
    (gx,) = m.autograd.grad((x * x).sum(), x)
    h = x * 1
    h.register_hook(lambda g: g + 1)
    (gh,) = m.autograd.grad((h * h).sum(), [h])
    return gx.numpy(), gh.numpy()


@needs_torch
def test_tensor_hooks_apply_to_captured_gradients():
    for a, b in zip(_hooks_and_capture(ca), _hooks_and_capture(torch)):
        assert_close(a, b)


def test_grad_with_an_input_listed_twice():
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    h = x * 2
    gh, gx, gh2 = ca.autograd.grad((h * x).sum(), [h, x, h])
    assert_close(gh.numpy(), gh2.numpy())
    assert_close(gx.numpy(), (4 * x).detach().numpy())


def test_create_graph_grads_are_not_aliased():
    a = ca.tensor([1.0, 2.0], requires_grad=True)
    b = ca.tensor([3.0, 4.0], requires_grad=True)
    loss = (a + b).sum()
    loss.backward(create_graph=True)
    assert a.grad is not b.grad
    loss.backward()
    assert_close(a.grad.numpy(), [2.0, 2.0])
    assert_close(b.grad.numpy(), [2.0, 2.0])
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    g = ca.ones(2)
    out = x + 1
    out.backward(g, create_graph=True)
    out.backward(g)
    assert_close(g.numpy(), [1.0, 1.0])  # the caller's gradient is untouched


def _retain_then_inplace(m):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    y.retain_grad()
    y.mul_(2)
    (y * y).sum().backward()
    return y.grad.numpy()


def test_retain_grad_follows_inplace():
    assert_close(_retain_then_inplace(ca), [4.0, 8.0])  # gradient of the new value: 2y


@needs_torch
def test_retain_grad_follows_inplace_torch():
    assert_close(_retain_then_inplace(ca), _retain_then_inplace(torch))


def _mask_assign(m):
    mask = np.zeros((3, 2), bool)
    mask[0, 1] = mask[2, 0] = True
    x = m.tensor(np.arange(6.0, dtype=np.float32).reshape(3, 2), requires_grad=True)
    v = m.tensor([10.0, 20.0], requires_grad=True)
    y = x * 1
    y[m.from_numpy(mask)] = v
    w = m.tensor((np.arange(6.0, dtype=np.float32) + 1).reshape(3, 2))
    (y * w).sum().backward()
    z = m.zeros(4)
    z[m.tensor([3, 0])] = m.tensor([1.0, 2.0])
    return y.detach().numpy(), x.grad.numpy(), v.grad.numpy(), z.numpy()


@needs_torch
def test_mask_and_index_assignment_fill_in_order():
    for a, b in zip(_mask_assign(ca), _mask_assign(torch)):
        assert_close(a, b)


def test_duplicate_index_assignment_is_refused():
    z = ca.zeros(4)
    with pytest.raises(RuntimeError, match="duplicate indices"):
        z[ca.tensor([1, 1])] = ca.tensor([1.0, 2.0])


def _mixed_dtype(m):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1
    h.retain_grad()
    seen = []
    h.register_hook(lambda g: seen.append(g.dtype))
    (h * x.double()).sum().backward()
    return h.grad.dtype, x.grad.dtype, seen[0]


def test_gradients_take_their_inputs_dtype():
    assert [np.dtype(d) for d in _mixed_dtype(ca)] == [np.float32] * 3


def test_inplace_on_function_output_alias_is_refused():
    class Id(ca.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    y = Id.apply(ca.randn(2, requires_grad=True) * 1)
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace. This view "
                                           "was created inside a custom Function"):
        y.mul_(3)


def test_inplace_on_no_grad_view_with_grad_enabled_is_refused():
    x = ca.randn(3, requires_grad=True) * 1
    with ca.no_grad():
        v = x[:2]
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
        v.mul_(2)


@needs_torch
def test_small_semantics_match_torch():
    cases = [
        lambda m: m.tensor(3.0).sum(0),
        lambda m: m.ones(2, 3).sum(()),
        lambda m: m.where(m.tensor([True, False]), 1.0, 2.0),
        lambda m: m.ones(2) * m.tensor(2.0, dtype=m.float64),
    ]
    for case in cases:
        ours, theirs = case(ca), case(torch)
        assert tuple(ours.shape) == tuple(theirs.shape)
        assert str(ours.dtype).replace("torch.", "") == str(theirs.dtype).replace("torch.", "")
        assert_close(ours.numpy(), theirs.numpy())


def test_torch_messages_for_bad_operands():
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(3\) must match the size of "
                                           r"tensor b \(4\) at non-singleton dimension 1"):
        ca.ones(2, 3) + ca.ones(4)
    with pytest.raises(RuntimeError, match="result type Float can't be cast"):
        ca.arange(3).add_(ca.ones(3))


@needs_torch
def test_pow_exponent_gradient_at_zero_base_matches_torch():
    def run(m):
        a = m.tensor([0.0, 0.0, 2.0])
        b = m.tensor([2.0, -1.0, 0.5], requires_grad=True)
        (a ** b).sum().backward()
        return b.grad.numpy()
    with np.errstate(all="ignore"):
        assert_close(run(ca), run(torch))


def test_cross_entropy_all_ignored_is_nan():
    x = ca.randn(2, 3, requires_grad=True)
    assert np.isnan(ca.nn.functional.cross_entropy(x, ca.tensor([-100, -100])).item())


# ---------------------------------------------------------------- found by tests/fuzz_programs.py

_NOOP_VIEWS = {   # h -> (the tensor viewed, the view)
    "reshape to the same shape": lambda h: (h, h.reshape(2, 3)),
    "expand to the same shape": lambda h: (h, h.expand(2, 3)),
    "squeeze with no size-1 dim": lambda h: (h, h.squeeze()),
    "squeeze(0) of a size-2 dim": lambda h: (h, h.squeeze(0)),
    "t() of a 1-d tensor": lambda h: (lambda row: (row, row.t()))(h[0]),
    "[:]": lambda h: (h, h[:]),
    "[...]": lambda h: (h, h[...]),
}


def _noop_view_hook(m, view):
    """A hook on a view that changes nothing sees (and zeroes) only the view's
    gradient: the view is a new tensor with its own grad_fn, as in torch."""
    x = m.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    h = x * 1
    viewed, v = view(h)
    assert v is not viewed and v.grad_fn is not viewed.grad_fn
    v.register_hook(lambda g: g * 0)
    v.retain_grad()
    (h.sum() + (v * 3).sum()).backward()
    return x.grad.numpy(), v.grad.numpy()


@pytest.mark.parametrize("name", sorted(_NOOP_VIEWS))
def test_a_view_that_changes_nothing_is_a_new_view(name):
    grad, view_grad = _noop_view_hook(ca, _NOOP_VIEWS[name])
    assert_close(grad, np.ones((2, 3)))          # h's own path only; the view's is zeroed
    assert_close(view_grad, np.zeros_like(view_grad))


@needs_torch
@pytest.mark.parametrize("name", sorted(_NOOP_VIEWS))
def test_a_view_that_changes_nothing_is_a_new_view_torch(name):
    for a, b in zip(_noop_view_hook(ca, _NOOP_VIEWS[name]), _noop_view_hook(torch, _NOOP_VIEWS[name])):
        assert_close(a, b)


def _zero_d_masks(m):
    out = []
    for value in (True, False):
        for shape in ((), (3,)):
            x = m.tensor(np.arange(1.0, 1.0 + np.prod(shape)).reshape(shape), requires_grad=True)
            mask = m.from_numpy(np.array(value))
            picked = x[mask]
            b = x * 1.0
            b[mask] = 0.0
            (picked.sum() * 3 + (b * b).sum()).backward()
            out += [tuple(picked.shape), b.detach().numpy().tolist(), x.grad.numpy().tolist()]
    return out


def test_zero_d_bool_mask_adds_a_dim_of_size_one_or_zero():
    assert _zero_d_masks(ca) == [
        (1,), 0.0, 3.0, (1, 3), [0.0, 0.0, 0.0], [3.0, 3.0, 3.0],
        (0,), 1.0, 2.0, (0, 3), [1.0, 2.0, 3.0], [2.0, 4.0, 6.0]]


@needs_torch
def test_zero_d_bool_mask_adds_a_dim_of_size_one_or_zero_torch():
    assert _zero_d_masks(ca) == _zero_d_masks(torch)


@pytest.mark.parametrize("shape, key, message", [
    ((), np.array([True]), "too many indices for tensor of dimension 0"),
    ((3,), np.array([True, False]), r"The shape of the mask \[2\] at index 0 does not match "
                                    r"the shape of the indexed tensor \[3\] at index 0"),
    ((3,), np.array([3]), "index 3 is out of bounds for dimension 0 with size 3"),
])
def test_index_assignment_checks_its_indices_as_indexing_does(shape, key, message):
    x = ca.zeros(*shape)
    version = x._version
    with pytest.raises(IndexError, match=message):
        x[ca.from_numpy(key)] = 1.0
    with pytest.raises(IndexError, match=message):
        x[ca.from_numpy(key)]
    assert x._version == version and not x.numpy().any()


def _std_of_equal_values(m):
    x = m.tensor([[2.0, 2.0, 2.0], [1.0, 2.0, 4.0]], requires_grad=True)
    x.std(1).sum().backward()
    return x.grad.numpy()


def test_std_gradient_is_zero_where_std_is_zero():
    grad = _std_of_equal_values(ca)
    assert (grad[0] == 0).all()
    centered = np.array([1.0, 2.0, 4.0]) - 7 / 3
    assert_close(grad[1], centered / (2 * np.sqrt((centered ** 2).sum() / 2)))


@needs_torch
def test_std_gradient_is_zero_where_std_is_zero_torch():
    assert_close(_std_of_equal_values(ca), _std_of_equal_values(torch))


@pytest.mark.parametrize("backend", ["eager", "python", "c"])
def test_grad_of_an_input_the_output_does_not_reach(backend):
    from helpers import _has_cc
    if backend == "c" and not _has_cc():
        pytest.skip("no C compiler")
    x = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    unused = ca.tensor([1.0, 1.0], requires_grad=True)
    with ca.compiled_backward(backend=backend):
        gx, gu = ca.autograd.grad((x * 2).sum(), [x, unused], allow_unused=True)
        assert gu is None and gx.numpy().tolist() == [2.0, 2.0, 2.0]
        gu, gx = ca.autograd.grad((x * 2).sum(), [unused, x], allow_unused=True)
        assert gu is None and gx.numpy().tolist() == [2.0, 2.0, 2.0]
        with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
            ca.autograd.grad((x * 2).sum(), [x, unused])


def _zero_d_mask_next_to_index_arrays(m):
    x = m.from_numpy(np.arange(24.0).reshape(3, 4, 2))
    t, f, i = (m.from_numpy(np.array(True)), m.from_numpy(np.array(False)),
               m.from_numpy(np.array([0, 2])))
    shapes = [tuple(x[t, i].shape), tuple(x[i, t].shape), tuple(x[i, :, t].shape),
              tuple(x[t, :, i].shape), tuple(x[i, t, i].shape)]
    y = x.clone()
    y[i, t] = 2.0
    errors = []
    for bad in (lambda: x[f, i], lambda: y.__setitem__((f, i), 1.0),
                lambda: x.reshape(6, 4)[m.from_numpy(np.ones((6, 3), bool))]):
        with pytest.raises(IndexError) as info:
            bad()
        errors.append(str(info.value))
    return shapes, float(y.sum()), errors


def test_zero_d_mask_next_to_index_arrays_is_one_of_them():
    shapes, total, errors = _zero_d_mask_next_to_index_arrays(ca)
    assert shapes == [(2, 4, 2), (2, 4, 2), (2, 4, 2), (2, 3, 2), (2, 2)]
    assert total == sum(range(24)) - sum(range(8)) - sum(range(16, 24)) + 2 * 16  # rows 0, 2 = 2
    assert errors[:2] == ["shape mismatch: indexing tensors could not be broadcast together "
                          "with shapes [0], [2]"] * 2
    assert errors[2] == ("The shape of the mask [6, 3] at index 1 does not match the shape of "
                         "the indexed tensor [6, 4] at index 1")


@needs_torch
def test_zero_d_mask_next_to_index_arrays_is_one_of_them_torch():
    assert _zero_d_mask_next_to_index_arrays(ca) == _zero_d_mask_next_to_index_arrays(torch)


MIXED_KEYS = [
    ((2, 3, 4), (slice(None), slice(None), [1, 3])),
    ((2, 3, 4), (0, slice(None), [1, 2])),          # the int selects first (torch)
    ((2, 3, 4), ([0, 1], slice(1, 3), [2, 0])),      # non-adjacent: advanced dims first
    ((2, 3, 4), ([1], Ellipsis, [0, 3])),
    ((3, 4), (slice(None), np.array([True, False, True, False]))),
    ((3, 4), (None, [2, 0], slice(None))),
    ((2, 3, 4), ([1, 0], 2, slice(None))),
]


def _mixed_assignment(lib, shape, key, x_np, v_np):
    as_lib = (lambda a: lib.tensor(a, requires_grad=True, dtype=np.float64)) if lib is ca else \
        (lambda a: lib.tensor(a, requires_grad=True, dtype=lib.float64))
    if lib is not ca:
        key = tuple(lib.tensor(k) if isinstance(k, (list, np.ndarray)) else k for k in key)
    x, v = as_lib(x_np), as_lib(v_np)
    y = x * 1.0
    y[key] = v
    weights = lib.arange(y.numel()).reshape(*shape) + 1.0
    (y * y * weights).sum().backward()
    return y.detach().numpy(), x.grad.numpy(), v.grad.numpy()


@needs_torch
@pytest.mark.parametrize("shape, key", MIXED_KEYS)
def test_index_assignment_mixing_arrays_with_slices_and_ints_is_torchs(shape, key):
    """y[:, :, [1, 3]] = v and the like (Step 7's listed difference 11: refused)."""
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal(shape)
    t_key = tuple(torch.tensor(k) if isinstance(k, (list, np.ndarray)) else k for k in key)
    v_np = rng.standard_normal(tuple(torch.zeros(shape)[t_key].shape))
    for ours, theirs in zip(_mixed_assignment(ca, shape, key, x_np, v_np),
                            _mixed_assignment(torch, shape, key, x_np, v_np)):
        assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_assignment_mixing_arrays_with_slices_compiles(backend):
    rng = np.random.default_rng(1)
    x_np, v_np = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 2))
    key = (0, slice(None), [1, 2])
    eager = _mixed_assignment(ca, (2, 3, 4), key, x_np, v_np)
    for _ in range(2):                          # a compile, then a cache hit
        with ca.compiled_backward(backend=backend):
            compiled = _mixed_assignment(ca, (2, 3, 4), key, x_np, v_np)
        for a, b in zip(compiled, eager):
            assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_a_refused_mixed_index_assignment_changes_nothing():
    y = ca.zeros(2, 3, 4)
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 2 with size 4"):
        y[:, :, [1, 5]] = 1.0
    with pytest.raises(IndexError, match=r"could not be broadcast together with shapes \[3\], \[2\]"):
        y[:, [0, 1, 2], [1, 2]] = 1.0
    assert y._version == 0 and float(y.sum()) == 0.0


@needs_torch
def test_gradcheck_inputs_that_are_views_or_not_contiguous_as_torch():
    # torch's gradcheck takes any leaf with no stride-0 dimension: a view made leaf, a
    # non-contiguous slice; the numerical Jacobian perturbs the elements where they are
    for make in (lambda m, **k: m.ones(5, 5, **k)[:, :3].requires_grad_(),
                 lambda m, **k: m.arange(1, 13, **k).view(3, 4).requires_grad_()):
        a, t = make(ca, dtype=np.float64), make(torch, dtype=torch.float64)
        assert a.is_contiguous() == t.is_contiguous() and a.is_leaf and t.is_leaf
        assert torch.autograd.gradcheck(lambda v: v * v * 3, (t,))
        assert ca.autograd.gradcheck(lambda v: v * v * 3, (a,))
        assert not ca.autograd.gradcheck(lambda v: v * v * 3 + (v ** 3).detach(),
                                         (a,), raise_exception=False)
    msg = ("The 0th input has a dimension with stride 0. gradcheck only supports inputs "
           "that are non-overlapping to be able to compute the numerical gradients "
           "correctly. You should call .contiguous on the input before passing it to "
           "gradcheck.")
    with pytest.raises(RuntimeError) as theirs:
        torch.autograd.gradcheck(lambda v: v * 2, (
            torch.ones(5, dtype=torch.float64).expand(3, 5).requires_grad_(),))
    with pytest.raises(RuntimeError) as ours:
        ca.autograd.gradcheck(lambda v: v * 2, (
            ca.ones(5, dtype=np.float64).expand(3, 5).requires_grad_(),))
    assert str(ours.value) == str(theirs.value) == msg


@needs_torch
def test_gradcheck_with_no_differentiable_output_checks_numerical_zero():
    def ones(m):
        return m.ones(2, 2, dtype=m.float64 if m is torch else np.float64,
                      requires_grad=True)
    for m in (torch, ca):
        with pytest.raises(RuntimeError, match="^Numerical gradient for function expected "
                           "to be zero$"):
            m.autograd.gradcheck(lambda i: i.detach(), (ones(m),))
        assert m.autograd.gradcheck(lambda i: i.detach() * 0, (ones(m),))
        assert not m.autograd.gradcheck(lambda i: i.detach(), (ones(m),),
                                        raise_exception=False)


def _cat_results(m, f64):
    def ones(*s, rg=False, dt=None):
        return m.ones(*s, dtype=dt, requires_grad=rg) if dt else m.ones(*s, requires_grad=rg)
    out = []
    x, y = ones(0, rg=True), ones(2, 2, rg=True)
    z = m.cat((x, y))
    z.sum().backward()
    out.append((tuple(z.shape), tuple(x.grad.shape), y.grad.numpy().tolist()))
    out.append(tuple(m.cat((ones(2, 2), ones(0), ones(2, 2)), 1).shape))
    out.append(tuple(m.cat((ones(0), ones(0))).shape))
    out.append(m.cat((ones(0, dt=f64), ones(2, 2))).numpy().dtype)
    for args in [((ones(0, 1), ones(2, 2)),), ((ones(0), ones(2, 2)), 2),
                 ((ones(2, 2), ones(2, 2, 2)),), ((ones(0), ones(2, 2), ones(3, 3)),),
                 ((ones(0), ones(2, 2), ones(3)),)]:
        try:
            m.cat(*args)
            out.append(None)
        except (RuntimeError, IndexError) as e:
            out.append((type(e), str(e)))
    return out


@needs_torch
def test_cat_skips_legacy_empty_tensors_as_torch():
    # torch.cat skips 1-d empty tensors next to others (they still get an empty
    # gradient, and count in the dtype and in "tensor number k" of its errors)
    assert _cat_results(ca, np.float64) == _cat_results(torch, torch.float64)


@needs_torch
def test_pow_with_a_number_base_as_torch():
    for base, dtype in ((2, np.float32), (2.5, np.float64), (2, np.int64), (0.5, np.float32)):
        e = ca.tensor([0., 1., 2.], dtype=dtype, requires_grad=dtype != np.int64)
        t = torch.tensor([0., 1., 2.], dtype=getattr(torch, np.dtype(dtype).name),
                         requires_grad=dtype != np.int64)
        ours, theirs = ca.pow(base, e), torch.pow(base, t)
        assert ours.detach().numpy().dtype == theirs.detach().numpy().dtype
        assert_close(ours.detach().numpy(), theirs.detach().numpy())
        if dtype != np.int64:
            ours.sum().backward()
            theirs.sum().backward()
            assert_close(e.grad.numpy(), t.grad.numpy())
    with pytest.raises(TypeError, match="pow"):
        torch.pow(2, 3)
    with pytest.raises(TypeError, match=r"^pow\(\) received an invalid combination of "
                       r"arguments - got \(int, int\)"):
        ca.pow(2, 3)


def _grad_assignment_results(m, dtypes):
    f32, f64, i64, i16 = dtypes
    x = m.zeros(5, 5)
    out = []
    for value in (m.zeros(2, 2), m.zeros(25), m.zeros(5, 5, dtype=i64),
                  m.zeros(5, 5, dtype=f64), x, 3, m.zeros(()), m.zeros(5, 5, dtype=i16)):
        try:
            x.grad = value
            out.append("ok")
        except (RuntimeError, TypeError) as e:
            # (torch's dtype message goes on with how to set a grad_dtype: ca has none)
            out.append((type(e), str(e).split(" You can set")[0]))
    assert x.grad is None                       # nothing was stored
    g = m.ones(5, 5, requires_grad=True)
    x.grad = g
    out.append(x.grad is g)
    x.grad = m.zeros(5, 5).t()                  # any strides of the right size
    out.append(x.grad.shape)
    del x.grad
    out.append(x.grad)
    try:
        del x.requires_grad
    except RuntimeError as e:
        out.append(str(e))
    y = m.zeros((), dtype=f64)
    y.grad = m.ones((), dtype=f64)
    out.append(float(y.grad))
    return out


@needs_torch
def test_grad_assignment_is_checked_as_torch():
    ours = _grad_assignment_results(ca, (np.float32, np.float64, np.int64, np.int16))
    theirs = _grad_assignment_results(torch, (torch.float32, torch.float64, torch.int64,
                                              torch.int16))
    assert ours == theirs
    assert ours[4] == (RuntimeError, "can't assign Variable as its own grad")
