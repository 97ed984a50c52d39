"""A sum over every dim but the last (a bias's gradient) of a value an elementwise
loop writes is added up in that loop (codegen/c_fusion.py,
``sums_in_producer_loops``): the same bits as the sum's own pass, on one thread
and on two, with fixed and with symbolic sizes; only where the plan allows it."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen import c as c_emitter
from compiled_autograd.runtime import cthreads
from helpers import needs_cc

pytestmark = [needs_cc, pytest.mark.usefixtures("fresh_compiled_cache")]
F = ca.nn.functional


def _mlp(batch, width, dtype=np.float32, seed=0):
    """Two linears with a tanh between over a 3-d input: the second layer's
    input gradient reaches the first bias through tanh's backward (an
    elementwise loop) and a reshape to rows."""
    rng = np.random.default_rng(seed)
    x = ca.tensor(rng.standard_normal((batch, 5, width)).astype(dtype))
    params = [ca.tensor((rng.standard_normal(s) / np.sqrt(width)).astype(dtype),
                        requires_grad=True)
              for s in ((width, width), (width,), (width, width), (width,))]
    w1, b1, w2, b2 = params
    t = ca.tensor(rng.standard_normal((batch, 5, width)).astype(dtype))

    def loss():
        h = F.linear(F.linear(x, w1, b1).tanh(), w2, b2)
        return ((h - t) * (h - t)).sum()
    return loss, params


def _grads(loss, params, backend="c", dynamic=False):
    for p in params:
        p.grad = None
    if backend is None:
        loss().backward()
    else:
        with ca.compiled_backward(backend=backend, dynamic=dynamic):
            loss().backward()
    return [p.grad.numpy().copy() for p in params]


def _unfused(monkeypatch):
    monkeypatch.setattr(c_emitter, "sums_in_producer_loops", lambda graph, elsewhere: {})
    ca.reset_compiled_autograd()


def test_both_bias_sums_are_planned_into_the_loops_before_them():
    """b2's gradient: the loss's (h - t)^2 backward (the sum of its two
    gradients, an add); b1's: tanh's g * (1 - y^2) -- each through a reshape to
    rows."""
    loss, _ = _mlp(4, 48)
    graph = ca.trace_backward(loss()).graph
    plan = c_emitter.Emitter(graph).sums_in_loop
    assert sorted(n.target for n in plan) == ["add", "mul"]
    for producer, total in plan.items():
        assert total.target == "sum" and total.args[0].target == "reshape"
        assert total.args[0].args[0] is producer
    source = ca.trace_backward(loss()).c_code
    assert source.count("+= v;") == 2 and "#pragma omp simd" in source


@pytest.mark.parametrize("width, fused", [(48, True), (16, False)])
def test_same_bits_as_the_sums_own_pass(monkeypatch, width, fused):
    """A last dim below 32 keeps its loop over rows (threads), so is not planned."""
    loss, params = _mlp(64, width)
    assert bool(c_emitter.Emitter(ca.trace_backward(loss()).graph).sums_in_loop) == fused
    got = _grads(loss, params)
    hits = ca.compiled_autograd_stats()["cache_hits"]
    again = _grads(loss, params)                   # a cache hit: the same code again
    assert ca.compiled_autograd_stats()["cache_hits"] == hits + 1
    _unfused(monkeypatch)
    want = _grads(loss, params)
    for a, b, c in zip(got, want, again):
        assert a.tobytes() == b.tobytes() == c.tobytes()
    for a, b in zip(got, _grads(loss, params, backend=None)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_float64_and_symbolic_sizes(monkeypatch):
    """float64 accumulates in double; with dynamic sizes the loop's bounds are
    runtime sizes: a second batch size reuses the graph."""
    runs = {}
    for fused in (True, False):
        if not fused:
            _unfused(monkeypatch)
        for batch in (6, 9):
            loss, params = _mlp(batch, 40, np.float64, seed=batch)
            runs[fused, batch] = _grads(loss, params, dynamic=True)
            for a, b in zip(runs[fused, batch], _grads(loss, params, backend=None)):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    for batch in (6, 9):
        for a, b in zip(runs[True, batch], runs[False, batch]):
            assert a.tobytes() == b.tobytes()


def test_two_threads_give_the_bits_of_one():
    enabled, status = cthreads.openmp()
    if not enabled:
        pytest.skip(status)
    loss, params = _mlp(256, 96)     # large enough for the loop to get threads
    assert "CA_OMP(omp parallel" in ca.trace_backward(loss()).c_code
    bits = []
    for loops in (1, 2, 1):
        with cthreads.threads(loops=loops, blas=2):
            bits.append([g.tobytes() for g in _grads(loss, params)])
    assert bits[0] == bits[1] == bits[2]


def test_the_plan_stops_at_a_barrier_and_at_other_sums():
    """On a hand-made graph: a call into Python between the loop and the sum (it
    may write the value in place) keeps the sum at its own step, as does a sum
    that keeps a leading dim, or a second sum of the same loop."""
    from compiled_autograd.codegen.c_fusion import sums_in_producer_loops
    from compiled_autograd.ir.graph import Graph

    def plan(hook_between, dims=(0,), second=False):
        g = Graph()
        meta = {"shape": (64, 48), "dtype": np.dtype(np.float32)}
        a = g.create_node("placeholder", "a", meta=meta)
        n = g.create_node("call_function", "mul", (a, a), meta=meta)
        if hook_between:
            g.create_node("call_hook", "tensor_pre_hook", (0, a), meta=meta)
        kept = {"shape": (48,) if dims == (0,) else (64,), "dtype": meta["dtype"]}
        r = g.create_node("call_function", "sum", (n,), {"dims": dims, "keepdim": False},
                          meta=kept)
        if second:
            g.create_node("call_function", "sum", (n,), {"dims": dims, "keepdim": False},
                          meta=kept)
        return sums_in_producer_loops(g, set()), n, r
    got, n, r = plan(False)
    assert got == {n: r}
    assert plan(True)[0] == {}
    assert plan(False, dims=(1,))[0] == {}
    got, n, r = plan(False, second=True)
    assert got == {n: r}            # (the first; the second keeps its own pass)


def test_through_two_reshapes(monkeypatch):
    """A language model's head: logits (batch, seq, vocab) reshaped to rows for
    the loss; the bias's gradient reads the loss's gradient reshaped back and
    again to rows."""
    rng = np.random.default_rng(3)
    x = ca.tensor(rng.standard_normal((4, 6, 16)).astype(np.float32))
    w = ca.tensor(rng.standard_normal((40, 16)).astype(np.float32), requires_grad=True)
    b = ca.tensor(rng.standard_normal(40).astype(np.float32), requires_grad=True)
    targets = ca.tensor(rng.integers(0, 40, 24))

    def loss():
        return F.cross_entropy(F.linear(x, w, b).reshape(24, 40), targets)
    plan = c_emitter.Emitter(ca.trace_backward(loss()).graph).sums_in_loop
    assert len(plan) == 1
    ((producer, total),) = plan.items()
    assert total.args[0].target == "reshape" and total.args[0].args[0].target == "reshape"
    got = _grads(loss, [w, b])
    _unfused(monkeypatch)
    want = _grads(loss, [w, b])
    for a, c in zip(got, want):
        assert a.tobytes() == c.tobytes()
    for a, c in zip(got, _grads(loss, [w, b], backend=None)):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
