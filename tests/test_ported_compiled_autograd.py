"""Tests ported from PyTorch's test/inductor/test_compiled_autograd.py
(class TestCompiledAutograd): models, hooks, outputs and leaves, cache hits and
recompiles, dynamic shapes, retain_graph, user compiler functions, logs.

torch's ``check_output_and_recompiles(fn, count)`` is ``ported_ca``'s, run on
every compiled backend and a user compiler (``lambda gm: gm``). The custom
``autograd.Function`` tests are in test_ported_compiled_autograd_functions.py.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

import compiled_autograd as ca
from ported_ca import CA_BACKENDS, check_output_and_recompiles, compiler

nn = ca.nn


@pytest.fixture(params=CA_BACKENDS)
def backend(request):
    ca.reset_compiled_autograd()
    yield request.param
    ca.reset_compiled_autograd()


class Sigmoid(nn.Module):
    def forward(self, x):
        return x.sigmoid()


def mlp():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU())


# torch's module-level hooks (functions, not lambdas, so every iteration has the same hook)
def hook1(grad):
    return grad * 2


def hook2(grads):
    return (grads[0] + 1,)


def hook3(gI, gO):
    return (gI[0].sin() + gO[0],)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_basic
def test_basic(backend):
    def fn():
        model = mlp()
        x = ca.randn(2, 4)
        result = model(x).sum()
        result.backward()
        yield model[0].weight.grad
        yield model[0].bias.grad
        yield model[2].weight.grad
        yield model[2].bias.grad

    check_output_and_recompiles(fn, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_cache_hit
def test_cache_hit(backend):
    def fn():
        for _ in range(3):
            model = mlp()
            x = ca.randn(2, 4)
            result = model(x).sum()
            result.backward()
            yield model[0].weight.grad
            yield model[0].bias.grad
            yield model[2].weight.grad
            yield model[2].bias.grad

    check_output_and_recompiles(fn, backend=backend)
    assert ca.compiled_autograd_stats()["cache_hits"] == 2


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_tensor_grad_hook1
def test_tensor_grad_hook1(backend):
    def fn():
        for _ in range(3):
            model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            x = ca.randn(2, 4)
            model[0].weight.register_hook(hook1)
            result = model(x).sum()
            result.backward()
            yield model[0].weight.grad
            yield model[0].bias.grad

    expected = check_output_and_recompiles(fn, backend=backend)
    # the hook ran: the weight's gradient is twice the plain one
    ca.manual_seed(123)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    model(ca.randn(2, 4)).sum().backward()
    np.testing.assert_allclose(expected[0], 2 * model[0].weight.grad.numpy())


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_tensor_grad_hook2
def test_tensor_grad_hook2(backend):
    calls = []

    def counting_hook2(grads):
        calls.append(1)
        return hook2(grads)

    def fn():
        for _ in range(3):
            model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            x = ca.randn(1, 4)
            result = model(x).sum()
            result.grad_fn.register_prehook(counting_hook2)
            result.backward()
            yield model[0].weight.grad
            yield model[0].bias.grad

    check_output_and_recompiles(fn, backend=backend)
    assert len(calls) == 6      # 3 eager, 3 compiled


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_tensor_grad_hook3
def test_tensor_grad_hook3(backend):
    def fn():
        for _ in range(3):
            model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            x = ca.randn(1, 4)
            result = model(x).sum()
            result.grad_fn.register_hook(hook3)
            result.backward()
            yield model[0].weight.grad
            yield model[0].bias.grad

    check_output_and_recompiles(fn, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_torch_compile
# (the forward is not compiled here: ca has no torch.compile; the backward part)
def test_torch_compile(backend):
    def fn():
        model = nn.Sequential(nn.Linear(4, 4), Sigmoid())
        for _ in range(3):
            x = ca.randn(1, 4)
            result = model(x).sum()
            result.backward()
            yield model[0].weight.grad
            yield model[0].bias.grad
            model.zero_grad()

    check_output_and_recompiles(fn, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_multiple_torch_compile
# (only backwards run inside the context are captured)
def test_multiple_torch_compile(backend):
    ca.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Sigmoid())
    x = ca.randn(1, 4)
    model2 = nn.Linear(4, 4)
    x2 = ca.randn(1, 4)

    def fn():
        model(x).sum().backward()

    def fn2():
        model2(x2).sum().backward()

    fn()
    assert ca.compiled_autograd_stats()["captures"] == 0
    with ca.compiled_backward(backend=compiler(backend)):
        fn2()
    assert ca.compiled_autograd_stats()["captures"] == 1
    fn()
    assert ca.compiled_autograd_stats()["captures"] == 1


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_dynamo_flaky_segfault
# (run in-process, small: a compiled backward, a reset, the same again)
def test_dynamo_flaky_segfault(backend):
    def inner():
        x = ca.randn(10, 30)
        w = ca.randn(10, 30, requires_grad=True)
        loss = nn.functional.linear(x, w).sum()
        with ca.compiled_backward(backend=compiler(backend)):
            loss.backward()
        assert w.grad is not None
        np.testing.assert_allclose(w.grad.numpy(), np.broadcast_to(x.numpy().sum(0), (10, 30)),
                                   rtol=1e-5)

    inner()
    ca.reset_compiled_autograd()
    inner()
    assert ca.compiled_autograd_stats()["captures"] == 1


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_dynamo_boxed
# (torch's backward graph takes one boxed list; ca's takes its five boxed lists)
def test_dynamo_boxed():
    seen = []

    def compiler_fn(gm):
        seen.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        return gm

    inputs = [ca.randn(1, 2, requires_grad=True), ca.randn(2, 3, requires_grad=True),
              ca.randn(3, 4, requires_grad=True)]
    args_0, args_1, args_2 = inputs
    loss = ((args_0 @ args_1) @ args_2).sum()
    with ca.compiled_backward(backend=compiler_fn):
        loss.backward()
    assert seen == [["inputs", "sizes", "scalars", "hooks", "packed_data"]]
    assert all(t.grad is not None for t in inputs)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_implicit_add
def test_implicit_add(backend):
    def fn():
        y = ca.randn(1, 4, requires_grad=True)

        def model(x):
            # y is used multiple times, gradients get added
            return (x * y + y.sin() + y.cos()).sigmoid()

        for _ in range(3):
            x = ca.randn(1, 4)
            result = model(x).sum()
            result.backward()
            yield result
            yield y.grad
            y.grad = None

    check_output_and_recompiles(fn, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_output_nodes_all_leaves
def test_output_nodes_all_leaves(backend):
    def fn():
        y = ca.randn(1, 4, requires_grad=True)
        z = ca.randn(1, 4, requires_grad=True)

        def model(x):
            return (x * z + y.sin() + y.cos()).sigmoid()

        for _ in range(3):
            x = ca.randn(1, 4)
            result = model(x).sum()
            gy, gz = ca.autograd.grad(result, inputs=[y, z])
            assert y.grad is None
            assert z.grad is None
            yield gy
            yield gz

    check_output_and_recompiles(fn, backend=backend)


class UnreachableBwd(ca.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, gO):
        raise RuntimeError


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_output_nodes_some_leaves
def test_output_nodes_some_leaves(backend):
    def fn():
        y = ca.randn(1, 4, requires_grad=True)
        z = ca.randn(1, 4, requires_grad=True)

        def model(x):
            return (UnreachableBwd.apply(y) * z).sigmoid()

        for _ in range(3):
            x = ca.randn(1, 4)
            result = model(x).sum()
            gz = ca.autograd.grad(result, inputs=[z])
            assert y.grad is None
            assert z.grad is None
            yield from gz

    check_output_and_recompiles(fn, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_no_output_nodes_all_leaves
def test_no_output_nodes_all_leaves(backend):
    def fn():
        y = ca.randn(1, 4, requires_grad=True)
        z = ca.randn(1, 4, requires_grad=True)

        def model(x):
            return (x * z + y.sin() + y.cos()).sigmoid()

        for _ in range(3):
            x = ca.randn(1, 4)
            result = model(x).sum()
            out = result.backward()
            assert out is None
            assert y.grad is not None
            assert z.grad is not None
            yield y.grad
            yield z.grad
            y.grad = None
            z.grad = None

    check_output_and_recompiles(fn, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_no_output_nodes_some_leaves
def test_no_output_nodes_some_leaves(backend):
    def fn():
        y = ca.randn(1, 4, requires_grad=True)
        z = ca.randn(1, 4, requires_grad=True)
        a = ca.randn(1, 4, requires_grad=True)

        def model(x):
            return (x * y * z * UnreachableBwd.apply(a)).sigmoid()

        for _ in range(3):
            x = ca.randn(1, 4)
            result = model(x).sum()
            out = result.backward(inputs=[y, z])
            assert out is None
            assert y.grad is not None
            assert z.grad is not None
            assert a.grad is None
            yield y.grad
            yield z.grad
            y.grad = None
            z.grad = None

    check_output_and_recompiles(fn, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_no_output_nodes_different_leaves_will_recompile
def test_no_output_nodes_different_leaves_will_recompile(backend):
    def fn():
        def fwd(x, y, z):
            out = x * y
            out2 = out * z
            return out2.sum()

        x = ca.randn(5, requires_grad=True)
        y = ca.randn(5, requires_grad=True)
        z = ca.randn(5, requires_grad=True)
        loss = fwd(x, y, z)
        ca.autograd.backward(loss, inputs=[x])
        yield x.grad
        x.grad = None

        loss = fwd(x, y, z)
        ca.autograd.backward(loss, inputs=[y])
        yield y.grad

    # a different set of inputs to accumulate into: a new graph
    check_output_and_recompiles(fn, 2, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_dynamic_shapes
def test_dynamic_shapes(backend):
    def fn():
        model = mlp()
        for b in range(10, 100, 10):
            x = ca.randn(b, 4)
            result = model(x).sum()
            result.backward()
            yield model[0].weight.grad
            yield model[0].bias.grad
            yield model[2].weight.grad
            yield model[2].bias.grad
            model.zero_grad()

    # the batch size changes once: static graph, then one dynamic graph
    check_output_and_recompiles(fn, count=2, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_accumulate_without_zero
# torch captures 2 graphs here (its key holds whether the leaf's .grad is defined:
# the first backward steals the gradient, the others add to it); ca's
# accumulate_grad hook decides that at run time, so one graph serves all ten.
def test_accumulate_without_zero(backend):
    def fn():
        model = mlp()
        for _ in range(10):
            x = ca.randn(10, 4)
            result = model(x).sum()
            result.backward()
            yield model[0].weight.grad.clone()
            yield model[0].bias.grad.clone()
            yield model[2].weight.grad.clone()
            yield model[2].bias.grad.clone()

    expected = check_output_and_recompiles(fn, count=1, backend=backend)
    # the gradients did accumulate
    assert not np.allclose(expected[0], expected[4])


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_inplace_grad_update
def test_inplace_grad_update(backend):
    def fn():
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        for _ in range(10):
            w_grad = ca.rand(*model[0].weight.shape)
            b_grad = ca.rand(*model[0].bias.shape)
            model[0].weight.grad = w_grad
            model[0].bias.grad = b_grad

            x = ca.randn(10, 4)
            result = model(x).sum()
            result.backward()
            assert model[0].weight.grad is w_grad
            assert model[0].bias.grad is b_grad
            yield w_grad.clone()
            yield b_grad.clone()

    check_output_and_recompiles(fn, count=1, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_keep_graph_simple
def test_keep_graph_simple(backend):
    x = ca.tensor([2.0], requires_grad=True)
    y = x ** 2

    # First backward pass; keep the computation graph
    y.backward(retain_graph=True)
    np.testing.assert_array_equal(x.grad.numpy(), [4.0])  # dy/dx at x=2 is 4

    # runs under both the eager and compiled regime
    def fn():
        # Reset the gradients
        x.grad = ca.tensor([0.0])
        # Second and Third backward pass; keep the computation graph
        y.backward(retain_graph=True)
        np.testing.assert_array_equal(x.grad.numpy(), [4.0])
        yield x.grad

    check_output_and_recompiles(fn, count=1, backend=backend)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_keep_graph_usage_after_compiled
def test_keep_graph_usage_after_compiled(backend):
    x = ca.tensor([2.0], requires_grad=True)
    y = x ** 2

    # First backward pass; keep the computation graph
    def eager_check():
        y.backward(retain_graph=True)
        np.testing.assert_array_equal(x.grad.numpy(), [4.0])  # dy/dx at x=2 is 4
        x.grad = ca.tensor([0.0])

    eager_check()
    compiler_fn = compiler(backend)
    for _ in range(5):
        with ca.compiled_backward(backend=compiler_fn):
            eager_check()
        eager_check()
    stats = ca.compiled_autograd_stats()
    assert (stats["captures"], stats["cache_hits"]) == (1, 4)


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_accumulate_grad_accuracy
def test_accumulate_grad_accuracy(backend):
    def fn():
        model = nn.Sequential(nn.Linear(2, 1, bias=False), nn.Linear(1, 2, bias=False))
        x = ca.randn(2, 2)
        out = model(x)
        loss = out.sum()
        ca.manual_seed(0)
        loss.backward()
        yield model[0].weight.grad
        yield model[1].weight.grad

    check_output_and_recompiles(fn, 1, backend=backend)


@pytest.fixture
def verbose_logs(monkeypatch, caplog):
    monkeypatch.setenv("CA_LOGS", "verbose")
    caplog.set_level(logging.INFO, logger="compiled_autograd")
    return caplog


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_verbose_logs_graph
# (ca's format: the logged graph names each op's autograd node in a comment,
# torch's names it with its NodeCall index)
def test_verbose_logs_graph(verbose_logs):
    def fn():
        model = mlp()
        x = ca.randn(2, 4)
        result = model(x).sum()
        result.backward()
        yield model[0].weight.grad
        yield model[0].bias.grad
        yield model[2].weight.grad
        yield model[2].bias.grad

    check_output_and_recompiles(fn, backend="python")
    graphs = [r.getMessage() for r in verbose_logs.records
              if r.getMessage().startswith("compiled autograd graph")]
    assert len(graphs) == 1
    sources = [line.rsplit("# ", 1)[1] for line in graphs[0].splitlines() if "  # " in line]
    # each node of the backward, in the order it runs: torch's expected_logs
    # (SumBackward0, ReluBackward0, AddmmBackward0, TBackward0, AccumulateGrad, ...)
    order = []
    for s in sources:
        if not order or order[-1] != s:
            order.append(s)
    assert order[:3] == ["SumBackward", "ReluBackward", "LinearBackward"]
    assert order.count("ReluBackward") == 2
    assert order.count("LinearBackward") == 2
    assert sum(1 for line in graphs[0].splitlines()
               if "call_hook[accumulate_grad]" in line) == 4


# torch: test_compiled_autograd.py::TestCompiledAutograd::test_verbose_logs_cpp
# (ca's messages: first "new autograd node"/"empty cache", then sizes marked dynamic)
def test_verbose_logs_cpp(verbose_logs):
    def fn():
        model = mlp()
        for i in [10, 11, 12]:
            model.zero_grad()
            x = ca.randn(i, 4)
            result = model(x).sum()
            result.backward()
            yield model[0].weight.grad
            yield model[0].bias.grad
            yield model[2].weight.grad
            yield model[2].bias.grad

    check_output_and_recompiles(fn, count=2, backend="python")
    misses = [r.getMessage() for r in verbose_logs.records
              if r.getMessage().startswith("cache miss")]
    assert len(misses) == 2, misses
    assert misses[0] == "cache miss: empty cache"
    assert misses[1].startswith("cache miss: sizes changed; dynamic now: s")
