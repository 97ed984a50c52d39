"""Views and in-place ops: PyTorch's semantics, including the CopySlices cases of the
note "View + Inplace update for base tensor"."""
import re

import numpy as np
import pytest

import compiled_autograd as ca
from helpers import BACKENDS, assert_close, needs_torch, torch


def _arr(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_views_share_storage_and_version():
    b = ca.randn(3, 4)
    v = b[1]
    t = b.transpose(0, 1)
    assert v._base is b and t._base is b
    v.add_(1.0)
    assert b._version == v._version == t._version == 1
    assert np.shares_memory(v.numpy(), b.numpy())
    np.testing.assert_allclose(t.numpy()[:, 1], v.numpy())


def test_reshape_of_noncontiguous_copies_and_view_refuses():
    b = ca.randn(3, 4).t()
    r = b.reshape(-1)
    assert r._base is None  # a copy
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        b.view(12)


def test_inplace_on_view_rebases_base_history():
    a = ca.tensor(_arr(0, 3, 4), requires_grad=True)
    b = a.clone()
    x = b.select(0, 0)
    x.mul_(2)
    assert b.grad_fn.name() == "CopySlices"
    assert x.grad_fn.next_functions[0][0] is b.grad_fn


def _exec_info_case(m, which):
    """b = a.clone(); x = b.select(0, 0); x *= y; then autograd.grad over a subset."""
    a = m.tensor(_arr(1, 3, 4), requires_grad=True)
    y = m.tensor(_arr(2, 4), requires_grad=True)
    b = a.clone()
    x = b.select(0, 0)
    x *= y
    if which == "x_wrt_a":
        return m.autograd.grad(x.sum(), [a])[0].numpy()
    if which == "b_wrt_y":
        return m.autograd.grad((b * b).sum(), [y])[0].numpy()
    if which == "b_wrt_a":
        return m.autograd.grad((b * b).sum(), [a])[0].numpy()
    if which == "x_wrt_y":
        return m.autograd.grad((x * x).sum(), [y])[0].numpy()


@pytest.mark.parametrize("which", ["x_wrt_a", "b_wrt_y", "b_wrt_a", "x_wrt_y"])
def test_exec_info_subset_through_copyslices_analytic(which):
    a, y = _arr(1, 3, 4).astype(np.float64), _arr(2, 4).astype(np.float64)
    b = a.copy()
    b[0] *= y
    expected = {
        "x_wrt_a": np.concatenate([y[None], np.zeros((2, 4))]),
        "b_wrt_y": 2 * b[0] * a[0],
        "b_wrt_a": np.concatenate([(2 * b[0] * y)[None], 2 * b[1:]]),
        "x_wrt_y": 2 * b[0] * a[0],
    }[which]
    assert_close(_exec_info_case(ca, which), expected, rtol=1e-5)


@needs_torch
@pytest.mark.parametrize("which", ["x_wrt_a", "b_wrt_y", "b_wrt_a", "x_wrt_y"])
def test_exec_info_subset_through_copyslices_torch(which):
    assert_close(_exec_info_case(ca, which), _exec_info_case(torch, which))


def _named_cases(m):
    out = {}
    a = m.tensor(_arr(3, 3, 4), requires_grad=True)
    b = a.clone()
    b[0].mul_(2)
    b.sum().backward()
    out["b[0].mul_(2)"] = a.grad.numpy()

    a = m.tensor(_arr(4, 3, 4), requires_grad=True)
    b = a.clone()
    x = b.transpose(0, 1)
    x.add_(1)
    (b * b).sum().backward()
    out["transpose add_"] = a.grad.numpy()

    a = m.tensor(_arr(5, 4, 3), requires_grad=True)
    y = m.tensor(_arr(6, 2, 3), requires_grad=True)
    b = a.clone()
    b[1:3] = y
    (b * b.exp()).sum().backward()
    out["b[1:3] = y (a)"] = a.grad.numpy()
    out["b[1:3] = y (y)"] = y.grad.numpy()
    return out


@needs_torch
def test_named_view_inplace_cases_match_torch():
    ours, theirs = _named_cases(ca), _named_cases(torch)
    for key in ours:
        assert_close(ours[key], theirs[key], what=key)


def test_stale_view_regenerates_grad_fn():
    a = ca.tensor(_arr(7, 2, 3), requires_grad=True)
    b = a * 1.0
    v1 = b[0]          # created before the in-place below
    b[1].mul_(3.0)     # through another view
    v1.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [[1, 1, 1], [0, 0, 0]])


def test_inplace_bumps_version_and_in_no_grad_keeps_history():
    a = ca.tensor([1.0, 2.0], requires_grad=True)
    b = a * 2
    with ca.no_grad():
        b.add_(1.0)
    assert b._version == 1 and b.grad_fn.name() == "MulBackward"
    b.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 2.0])


def test_detach_shares_storage_and_version():
    a = ca.tensor([1.0, 2.0], requires_grad=True)
    d = a.detach()
    assert not d.requires_grad and d.grad_fn is None
    assert np.shares_memory(d.numpy(), a.detach().numpy())
    d.add_(1.0)
    assert a._version == 1


def test_in_place_on_an_output_of_split_or_chunk_is_refused():
    """As torch: the views of a function that returns several views may not be
    modified in place (with grad recorded); under no_grad, or when nothing needs a
    gradient, they may."""
    message = ("Output 1 of Split is a view and is being modified inplace. This view is "
               "the output of a function that returns multiple views.")
    x = ca.randn(4, requires_grad=True).clone()
    for a, b in (x.split(2), x.chunk(2)):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            b.mul_(2)
    assert x._version == 0                        # refused before anything changed
    with ca.no_grad():
        x.split(2)[0].mul_(2)
    ca.randn(4).split(2)[1].add_(1)


@pytest.mark.parametrize("backend", (None,) + BACKENDS)
def test_retain_grad_survives_an_in_place_change_through_a_sibling_view(backend):
    """As torch: v.mul_ rebases v2's history too (both view one base); v2's
    retain_grad follows its new grad_fn (a compile, then a cache hit)."""
    import contextlib
    for _ in range(2):
        base = ca.tensor([1.0], requires_grad=True).clone()
        v, v2 = base[:], base[:]
        v.retain_grad()
        v2.retain_grad()
        v.mul_(2)
        with ca.compiled_backward(backend=backend) if backend else contextlib.nullcontext():
            (v + v2).sum().backward()
        assert_close(v.grad.numpy(), [1.0])
        assert_close(v2.grad.numpy(), [1.0])


def _view_inplace_refusals(m):
    """In-place ops on views made in special ways (no_grad, a custom Function, split),
    as torch's check_inplace / handle_view_on_rebase judge them: each case's message,
    or "ok"."""
    Function = m.autograd.Function

    class Two(Function):                     # two differentiable outputs, one a view
        @staticmethod
        def forward(ctx, a, b):
            return a.narrow(0, 0, 2), b.clone()

        @staticmethod
        def backward(ctx, ga, gb):
            return ga, gb

    class TwoND(Function):                   # ... the other not differentiable
        @staticmethod
        def forward(ctx, a, b):
            x, y = a.narrow(0, 0, 2), b.clone()
            ctx.mark_non_differentiable(y)
            return x, y

        @staticmethod
        def backward(ctx, ga, gb):
            return ga, None

    class Alias(Function):
        @staticmethod
        def forward(ctx, a):
            return a[:2]

        @staticmethod
        def backward(ctx, g):
            return g

    class Id(Function):
        @staticmethod
        def forward(ctx, a):
            return a

        @staticmethod
        def backward(ctx, g):
            return g

    leaf = m.ones(3, requires_grad=True)
    a, b = leaf.clone(), m.ones(2, requires_grad=True).clone()
    plain = m.zeros(3)
    with m.no_grad():
        nograd_view, nograd_alias, nograd_split = leaf[:], Alias.apply(leaf), plain.split(1)
        nograd_of_nonleaf = a[:2]
    grad1 = m.ones(1, requires_grad=True)
    leaf_view = m.arange(12.).view(3, 4).requires_grad_()
    cases = [
        lambda: nograd_view.zero_(),
        lambda: nograd_alias.zero_(),
        lambda: nograd_of_nonleaf.zero_(),
        lambda: nograd_split[0].add_(grad1),
        lambda: plain.split(1)[0].add_(grad1),       # made with grad mode on
        lambda: plain.split([1, 2])[0].add_(grad1),
        lambda: plain[:1].add_(grad1),               # fine: nothing special about it
        lambda: a.split([1, 2])[1].mul_(2),
        lambda: a.split([1, 2])[1][1:].mul_(2),      # a view of it: named by its own node
        lambda: a.chunk(3)[2].mul_(2),
        lambda: Two.apply(a, b)[0].add_(1),
        lambda: Two.apply(a, b)[1].add_(1),
        lambda: Two.apply(a, m.ones(2))[0].add_(1),
        lambda: TwoND.apply(a, b)[0].add_(1),
        lambda: Two.apply(a, b)[0][:1].add_(1),
        lambda: Id.apply(a).add_(1),
        lambda: Id.apply(a)[:1].add_(1),
        lambda: leaf[:1].add_(1),
        lambda: leaf_view.add_(1),                   # a view given requires_grad itself
        lambda: leaf_view[0].add_(1),
        lambda: leaf.add_(1),
    ]
    out = []
    for case in cases:
        try:
            case()
            out.append("ok")
        except RuntimeError as e:
            out.append(str(e))
    return out


@needs_torch
def test_view_inplace_refusals_match_torch():
    ours, theirs = _view_inplace_refusals(ca), _view_inplace_refusals(torch)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        assert o == t, f"case {i}"
    assert theirs[0].startswith("A view was created in no_grad mode")
    assert theirs[7].startswith("Output 1 of SplitWithSizes is a view")


@needs_torch
def test_a_view_modified_in_place_inside_a_custom_forward_keeps_its_grad_fn():
    def run(m, inplace):
        class MyFn(m.autograd.Function):
            @staticmethod
            def forward(ctx, inp):
                view = inp.clone()[:3]
                if inplace:
                    view += 2
                return view

            @staticmethod
            def backward(ctx, grad):
                return grad * 3

        base = m.ones(3, requires_grad=True)
        out = MyFn.apply(base)
        (out * m.tensor([1., 2., 3.])).sum().backward()
        return type(out.grad_fn).__name__, out.detach().numpy().tolist(), \
            base.grad.numpy().tolist()

    for inplace in (False, True):
        ours, theirs = run(ca, inplace), run(torch, inplace)
        assert ours == theirs and ours[0] == "MyFnBackward"
