"""Edge cases of hooks, saved-tensor hooks, checkpointing and accounting that a
review found wrong here once; compared with torch where torch accepts them."""
import contextlib
import functools
import re

import numpy as np
import pytest

import compiled_autograd as ca
from helpers import BACKENDS, assert_close, needs_torch, torch


def _leaf_double_backward(m, use_offload):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    if use_offload:
        ctx = (m.autograd.graph.save_on_disk() if m is ca
               else torch.autograd.graph.save_on_cpu())
    else:
        ctx = m.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda t: t)
    with ctx:
        y = (x.exp() * x * x).sum()
    (g,) = m.autograd.grad(y, x, create_graph=True)
    (gg,) = m.autograd.grad(g.sum(), x)
    return gg.detach().numpy()


@needs_torch
@pytest.mark.parametrize("use_offload", [False, True])
def test_saved_leaf_keeps_its_edge_under_hooks(use_offload):
    assert_close(_leaf_double_backward(ca, use_offload), _leaf_double_backward(torch, use_offload))


def _nested_same_input(m):
    x = m.tensor([0.5, 1.0], requires_grad=True)
    cp = m.utils.checkpoint.checkpoint
    cp(lambda a: cp(lambda b: b.sin(), a, use_reentrant=False), x,
       use_reentrant=False).sum().backward()
    return x.grad.numpy()


@needs_torch
def test_nested_checkpoint_sharing_the_input():
    assert_close(_nested_same_input(ca), _nested_same_input(torch))


def _backward_inputs_with_hook(m):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g * 100)
    (y * 3).sum().backward(inputs=[y, x])
    return y.grad.numpy(), x.grad.numpy()


@needs_torch
def test_backward_inputs_non_leaf_gets_hooked_gradient():
    for a, b in zip(_backward_inputs_with_hook(ca), _backward_inputs_with_hook(torch)):
        assert_close(a, b)


def _retain_base_through_view(m):
    x = m.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = x * 1
    y.retain_grad()
    y[0].mul_(2)
    (y * y).sum().backward()
    return y.grad.numpy()


@needs_torch
def test_retain_grad_on_base_follows_inplace_through_view():
    assert_close(_retain_base_through_view(ca), _retain_base_through_view(torch))


def _function_returning_saved_input(m):
    class F(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x

    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = F.apply(x * 1)
    (g,) = m.autograd.grad((y * y).sum(), x, create_graph=True)
    (gg,) = m.autograd.grad(g.sum(), x)
    return gg.numpy()


@needs_torch
def test_function_saving_an_input_it_returns():
    assert_close(_function_returning_saved_input(ca), _function_returning_saved_input(torch))


def test_selective_cache_mutation_is_refused_or_copied():
    from compiled_autograd.utils.checkpoint import (CheckpointError, checkpoint,
                                                    create_selective_checkpoint_contexts)

    def f(a, b):
        h = a @ b
        h.mul_(2)
        return h.sin()

    x = ca.tensor(np.linspace(-1, 1, 6).reshape(2, 3), requires_grad=True)
    w = ca.tensor(np.linspace(0, 1, 12).reshape(3, 4), requires_grad=True)
    out = checkpoint(f, x, w, context_fn=functools.partial(
        create_selective_checkpoint_contexts, ["matmul"]))
    with pytest.raises(CheckpointError, match="has been mutated"):
        out.sum().backward()
    x.grad = w.grad = None
    out = checkpoint(f, x, w, context_fn=functools.partial(
        create_selective_checkpoint_contexts, ["matmul"], allow_cache_entry_mutation=True))
    out.sum().backward()
    got = x.grad.numpy().copy()
    x.grad = None
    f(x, w).sum().backward()
    np.testing.assert_allclose(got, x.grad.numpy(), rtol=1e-6)


def test_accounting_sees_retained_grads_results_and_function_outputs():
    x = ca.randn(256, 256)
    w = ca.randn(256, 256, requires_grad=True)
    with ca.memory.profile() as prof:
        y = x * w
        y.retain_grad()
        (g,) = ca.autograd.grad((y * 1).sum(), [w], retain_graph=True)
        (y * 1).sum().backward()
    names = {e.name for e in prof.timeline if e.action == "alloc"}
    assert "retain_grad" in names and "autograd.grad" in names
    assert prof.peak_bytes <= prof.tracemalloc_peak_bytes

    class Double(ca.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    with ca.memory.profile() as prof:
        Double.apply(w)
    assert {e.category for e in prof.timeline if e.action == "alloc"} == {"activation"}


def test_torch_refusals():
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g.double())
    with pytest.raises(RuntimeError, match="has changed the type of value"):
        y.sum().backward()

    class Bad(ca.autograd.Function):
        @staticmethod
        def forward(ctx, a, k):
            return a * k

        @staticmethod
        def backward(ctx, g):
            return g, g

    z = ca.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="returned a gradient different than None at position "
                                           "2, but the corresponding forward input was not a "
                                           "Variable"):
        Bad.apply(z, 1.0).sum().backward()
    with ca.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        with pytest.raises(RuntimeError, match="no hooks here"):
            with ca.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
                pass


def test_finished_profile_is_not_kept_alive_by_arrays():
    import gc
    import weakref
    w = ca.randn(64, requires_grad=True)
    with ca.memory.profile() as prof:
        (w * 2).sum().backward()   # w.grad outlives the profile
    tracker = weakref.ref(prof._tracker)
    del prof
    gc.collect()
    assert tracker() is None and w.grad is not None


@pytest.mark.parametrize("backend", (None,) + BACKENDS)
def test_what_a_post_accumulate_grad_hook_may_return(backend):
    """As torch 2.13: None or the tensor it was given; another tensor is a
    RuntimeError, anything else a TypeError (on every backend)."""
    cases = [(lambda t: None, None, None), (lambda t: t, None, None),
             (lambda t: t * 0, RuntimeError, "Tensor post accumulate grad hooks should return None."),
             (lambda t: 5, TypeError, "expected Variable, but hook returned 'int'")]
    for hook, error, message in cases:
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        x.register_post_accumulate_grad_hook(hook)
        with ca.compiled_backward(backend=backend) if backend else contextlib.nullcontext():
            if error is None:
                (x * 2).sum().backward()
                assert_close(x.grad.numpy(), [2.0, 2.0])
            else:
                with pytest.raises(error, match=re.escape(message)):
                    (x * 2).sum().backward()
