"""Activation checkpointing: same gradients as plain runs, recomputation only in
backward, non-tensor inputs/outputs, nesting, RNG, determinism checks, selective
checkpointing, the reentrant variant, checkpoint_sequential."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.utils.checkpoint import (CheckpointError, CheckpointPolicy, checkpoint,
                                                checkpoint_sequential,
                                                create_selective_checkpoint_contexts,
                                                set_checkpoint_early_stop)
from helpers import assert_close, needs_torch, torch

F = ca.nn.functional


def _model(seed=0):
    ca.manual_seed(seed)
    return ca.nn.Linear(8, 8), ca.nn.LayerNorm(8), ca.nn.Linear(8, 8)


def _grads(params, x):
    return [p.grad.numpy().copy() for p in params] + [x.grad.numpy().copy()]


def _run(use_checkpoint, **kw):
    lin1, ln, lin2 = _model()
    params = list(lin1.parameters()) + list(ln.parameters()) + list(lin2.parameters())
    x = ca.tensor(np.random.default_rng(0).standard_normal((4, 8)), requires_grad=True)
    calls = []

    def block(h, scale, tag, extra=None):
        calls.append(tag)
        h = F.dropout(F.gelu(ln(lin1(h))), 0.25) * scale
        return lin2(h).tanh(), tag, (scale, None)

    ca.manual_seed(7)
    if use_checkpoint:
        out, tag, rest = checkpoint(block, x, 2.0, "blk", extra=None, **kw)
    else:
        out, tag, rest = block(x, 2.0, "blk")
    assert tag == "blk" and rest == (2.0, None)
    forward_calls = len(calls)
    out.pow(2).sum().backward()
    return _grads(params, x), forward_calls, len(calls)


@pytest.mark.parametrize("early_stop", [True, False])
def test_checkpoint_matches_plain_with_dropout_and_non_tensor_values(early_stop):
    plain, _, _ = _run(False)
    with set_checkpoint_early_stop(early_stop):
        ckpt, forward_calls, total_calls = _run(True)
    for a, b in zip(plain, ckpt):
        np.testing.assert_array_equal(a, b)
    assert forward_calls == 1 and total_calls == 2  # recomputed once, in backward


def test_recompute_only_during_backward_and_once_per_backward():
    x = ca.randn(3, requires_grad=True)
    calls = []

    def fn(h):
        calls.append(1)
        return (h.exp() * h).sin()

    out = checkpoint(fn, x)
    assert len(calls) == 1
    loss = out.sum()
    loss.backward(retain_graph=True)
    assert len(calls) == 2
    loss.backward()
    assert len(calls) == 3  # a new backward recomputes again
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_nested_checkpoints_and_kwargs():
    x = ca.tensor(np.linspace(-1, 1, 6).reshape(2, 3), requires_grad=True)

    def inner(h, *, power):
        return (h ** power).tanh()

    def outer(h):
        return checkpoint(inner, h.sin(), power=3).exp() * h

    checkpoint(outer, x).sum().backward()
    ckpt = x.grad.numpy().copy()
    x.grad = None
    outer_plain = (x.sin() ** 3).tanh().exp() * x
    outer_plain.sum().backward()
    assert_close(ckpt, x.grad.numpy(), rtol=1e-6)


@needs_torch
def test_checkpointed_mlp_matches_torch():
    arrays = [np.random.default_rng(i).standard_normal(s).astype(np.float32)
              for i, s in enumerate([(5, 4), (6, 4), (6,), (3, 6)])]

    def run(m):
        x, w1, b1, w2 = [m.tensor(a, requires_grad=True) for a in arrays]

        def block(h):
            return m.nn.functional.gelu(m.nn.functional.linear(h, w1, b1))
        ck = m.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        (ck @ w2.t()).pow(2).mean().backward()
        return [t.grad.numpy() for t in (x, w1, b1, w2)]
    for a, b in zip(run(ca), run(torch)):
        assert_close(a, b)


def test_modifying_a_checkpoint_input_in_place_is_caught():
    x = ca.randn(3, requires_grad=True)
    h = x * 1
    out = checkpoint(lambda t: t.exp(), h)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_determinism_check_reports_different_metadata():
    state = {"first": True}

    def fn(h):
        if state.pop("first", False):
            return h.exp().sum()
        return h.reshape(3, 1).exp().sum()   # the recomputation saves a different shape

    x = ca.randn(3, requires_grad=True)
    out = checkpoint(fn, x)
    with pytest.raises(CheckpointError, match=r"Recomputed values for the following tensors "
                       r"have different metadata than during the forward pass.\ntensor at "
                       r"position 0:\nsaved metadata: \{'shape': \(3,\), 'dtype': 'float32'\}"):
        out.backward()


def test_determinism_check_reports_a_different_count():
    state = {"first": True}

    def fn(h):
        if state.pop("first", False):
            return (h.exp() * h.sin()).sum()
        return h.exp().sum()  # saves fewer tensors

    x = ca.randn(3, requires_grad=True)
    out = checkpoint(fn, x)
    with pytest.raises(CheckpointError, match=r"A different number of tensors was saved during "
                       r"the original forward and recomputation.\nNumber of tensors saved "
                       r"during forward: 4\nNumber of tensors saved during recomputation: 1"):
        out.backward()


def test_selective_checkpoint_saves_chosen_prims():
    lin1, ln, lin2 = _model()
    x = ca.randn(4, 8, requires_grad=True)
    counts = {"matmul": 0}

    def block(h):
        return lin2(F.gelu(ln(lin1(h)))).sum()

    def policy(ctx, op, *args, **kwargs):
        if op == "linear" and ctx.is_recompute:
            counts["matmul"] += 1
        return CheckpointPolicy.MUST_SAVE if op == "linear" else CheckpointPolicy.PREFER_RECOMPUTE

    out = checkpoint(block, x, context_fn=lambda: create_selective_checkpoint_contexts(policy))
    out.backward()
    sac = [p.grad.numpy().copy() for p in lin1.parameters()] + [x.grad.numpy().copy()]
    for p in list(lin1.parameters()) + [x]:
        p.grad = None
    block(x).backward()
    plain = [p.grad.numpy() for p in lin1.parameters()] + [x.grad.numpy()]
    for a, b in zip(sac, plain):
        np.testing.assert_array_equal(a, b)
    assert counts["matmul"] >= 1  # asked during recomputation, served from the cache
    # the list form of the policy
    x.grad = None
    checkpoint(block, x, context_fn=lambda: create_selective_checkpoint_contexts(["linear"])
               ).backward()
    np.testing.assert_array_equal(x.grad.numpy(), plain[-1])


def test_reentrant_checkpoint_and_its_limits():
    lin1, ln, lin2 = _model()
    x = ca.randn(4, 8, requires_grad=True)

    def block(h):
        return lin2(F.gelu(ln(lin1(h))))

    checkpoint(block, x, use_reentrant=True).sum().backward()
    reentrant = [p.grad.numpy().copy() for p in lin1.parameters()] + [x.grad.numpy().copy()]
    for p in list(lin1.parameters()) + [x]:
        p.grad = None
    block(x).sum().backward()
    plain = [p.grad.numpy() for p in lin1.parameters()] + [x.grad.numpy()]
    for a, b in zip(reentrant, plain):
        assert_close(a, b, rtol=1e-6)
    out = checkpoint(block, x, use_reentrant=True).sum()
    with pytest.raises(RuntimeError, match="When use_reentrant=True, torch.utils.checkpoint is "
                                           "incompatible with .grad()"):
        ca.autograd.grad(out, [x])


def test_checkpoint_sequential():
    ca.manual_seed(0)
    layers = [ca.nn.Linear(6, 6) if i % 2 == 0 else ca.nn.Tanh() for i in range(8)]
    model = ca.nn.Sequential(*layers)
    x = ca.randn(3, 6, requires_grad=True)
    checkpoint_sequential(model, 2, x).sum().backward()
    ck = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for a, p in zip(ck, model.parameters()):
        np.testing.assert_array_equal(a, p.grad.numpy())


def test_a_saved_input_that_needs_no_grad_is_the_same_object_after_recomputation():
    """As torch (its recomputation hook detaches only tensors that require grad):
    ctx.saved_tensors gives a no-grad input back as the very object."""
    seen = {}

    class Mul(ca.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            seen["x"], seen["w"] = x, w
            return g * w, g * x

    x, w = ca.randn(3), ca.randn(3, requires_grad=True)
    checkpoint(lambda a, b: Mul.apply(a, b), x, w, use_reentrant=False).sum().backward()
    assert seen["x"] is x and seen["w"] is not w
    np.testing.assert_allclose(w.grad.numpy(), x.numpy())
