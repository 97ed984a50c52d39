"""The update of ``ca.optim.in_backward`` traced into the compiled backward (issue 30):
prims and ``store`` nodes in the graph, no call into the optimizer's Python, its
state and floats runtime inputs; the cases where it is called as Python instead; and
the ``store`` node itself on every backend (a barrier to fusion in C, in place in
the Python backend)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.compiled import cache
from compiled_autograd.compiled.backends import resolve_backend
from compiled_autograd.examples.mlp import make_mlp
from compiled_autograd.ir.graph import BOXED, Graph
from helpers import needs_cc

OPTIMIZERS = [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
              ("SGD", dict(lr=0.1, momentum=0.5, dampening=0.2, maximize=True)),
              ("SGD", dict(lr=0.1)),
              ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.01)),
              ("AdamW", dict(lr=0.01, weight_decay=0.1)),
              ("RMSprop", dict(lr=0.01, centered=True, momentum=0.5, weight_decay=0.01)),
              ("RMSprop", dict(lr=0.01)),
              ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, maximize=True))]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)]


def _backward(loss, backend, **kwargs):
    ctx = (contextlib.nullcontext() if backend == "eager"
           else ca.compiled_backward(backend=backend))
    with ctx:
        loss.backward(**kwargs)


def _graphs():
    return [entry.graph for family in cache.families.values() for _, _, entry in family.entries]


def _kinds(graph):
    return [n.target for n in graph.nodes if n.op in ("call_hook", "call_function")
            and n.target in ("store", "post_acc_grad_hook", "accumulate_grad")]


def _train(name, kwargs, backend, steps=5):
    ex = make_mlp(layers=3, width=8, batch=4)
    opt = ca.optim.in_backward(getattr(ca.optim, name)(ex.parameters(), **kwargs))
    sched = ca.optim.lr_scheduler.ExponentialLR(opt, 0.7)
    for _ in range(steps):
        _backward(ex.loss(), backend)
        sched.step()
    return ex, opt


@pytest.mark.parametrize("backend", ["python", "c"])
@pytest.mark.parametrize("name,kwargs", OPTIMIZERS, ids=IDS)
def test_the_update_is_prims_and_stores_and_equals_eager(name, kwargs, backend):
    ca.reset_compiled_autograd()
    ref, ref_opt = _train(name, kwargs, "eager")
    got, got_opt = _train(name, kwargs, backend)
    n = len(got.parameters())
    graphs = _graphs()
    # The first backward makes the state, calling the update as Python (no state
    # to trace yet) where the rule keeps any; the traced graph is then the only one
    # used, whatever the scheduler does to lr.
    traced = graphs[-1]
    kinds = _kinds(traced)
    assert "post_acc_grad_hook" not in kinds and "accumulate_grad" not in kinds
    assert kinds.count("store") >= n
    assert len(graphs) <= 2 and ca.compiled_autograd_stats()["cache_hits"] >= 3
    # "python": the same numpy calls in the same order, so the same bits; "c": its
    # gradients differ from eager's in the last bits (BLAS, sums' order), which
    # RMSprop's centered variance (a difference of squares) amplifies to ~2e-5.
    # (tests/test_optim_in_backward.py compares each backend with its own step().)
    rtol = 0 if backend == "python" else 1e-4
    for a, b in zip(ref.parameters(), got.parameters()):
        assert b.grad is None
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=rtol,
                                   atol=rtol * 1e-2)
    ours, theirs = got_opt.state_dict(), ref_opt.state_dict()
    for i, st in theirs["state"].items():
        for k, v in st.items():
            np.testing.assert_allclose(ours["state"][i][k].numpy(), v.numpy(), rtol=rtol,
                                       atol=rtol * 1e-2)


@needs_cc
def test_on_c_the_traced_update_calls_no_python():
    ca.reset_compiled_autograd()
    _train("Adam", dict(lr=0.01), "c", steps=3)
    entries = [e for fam in cache.families.values() for _, _, e in fam.entries]
    prog = entries[-1].fn.prog
    assert prog.sites == []          # no callback at all: the C runner runs it whole


def _case(backend, setup):
    """Two steps of SGD with momentum, after ``setup(ex, opt)``; the last graph."""
    ca.reset_compiled_autograd()
    ca.manual_seed(0)
    ex = make_mlp(layers=2, width=6, batch=3)
    opt = ca.optim.in_backward(ca.optim.SGD(ex.parameters(), lr=0.1, momentum=0.9))
    _backward(ex.loss(), backend)
    setup(ex, opt)
    _backward(ex.loss(), backend)
    graphs = _graphs()
    return ex, (graphs[-1] if graphs else None)


def _grad_set_by_hand(ex, opt):
    ex.parameters()[0].grad = ca.ones_like(ex.parameters()[0])


def _another_hook(ex, opt):
    seen = []
    ex.parameters()[1].register_post_accumulate_grad_hook(lambda p: seen.append(1))


@pytest.mark.parametrize("backend", ["python", "c"])
@pytest.mark.parametrize("setup", [_grad_set_by_hand, _another_hook])
def test_called_as_python_where_tracing_cannot_say_the_same(backend, setup):
    # A .grad set before the backward (the update takes the sum), or another hook
    # on the parameter (DDP's all-reduce must come first): the update is a call.
    ref, _ = _case("eager", setup)
    got, graph = _case(backend, setup)
    assert "post_acc_grad_hook" in _kinds(graph) and "store" in _kinds(graph)
    for a, b in zip(ref.parameters(), got.parameters()):
        assert b.grad is None and a.grad is None
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize("backend", ["eager", "python", "c"])
def test_a_retained_graph_sees_the_parameters_were_updated(backend):
    ex = make_mlp(layers=2, width=6, batch=3)
    opt = ca.optim.in_backward(ca.optim.SGD(ex.parameters(), lr=0.1, momentum=0.9))
    _backward(ex.loss(), backend)          # (the state is made)
    loss = ex.loss()
    _backward(loss, backend, retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _backward(loss, backend)
    assert opt.optimizer.state


def _store_graph():
    """out = x * 2 + 1, with ``store(x, y)`` between the multiply and the add: the
    multiply must read x before the store (C would fuse it into the add's loop)."""
    f32 = np.dtype(np.float32)

    def meta(shape):
        return {"shape": shape, "dtype": f32, "nbytes": 16, "source": None, "visit": 0}
    g = Graph()
    boxes = {name: g.create_node("placeholder", name, name=name) for name in BOXED}
    x = g.create_node("call_function", "getitem", (boxes["inputs"], 0), name="x",
                      meta=meta((4,)))
    y = g.create_node("call_function", "getitem", (boxes["inputs"], 1), name="y",
                      meta=meta((4,)))
    a = g.create_node("call_function", "mul", (x, 2.0), name="a", meta=meta((4,)))
    g.create_node("call_function", "store", (x, y), name="store",
                  meta={"shape": None, "dtype": None, "nbytes": 0, "source": None})
    b = g.create_node("call_function", "add", (a, 1.0), name="b", meta=meta((4,)))
    g.create_node("output", "output", ((b,),), name="output")
    g.lint()
    return g


@pytest.mark.parametrize("backend", ["eager", "python", "c"])
def test_store_writes_in_place_and_nothing_reads_past_it(backend):
    from compiled_autograd.ir import passes
    graph = _store_graph()
    assert passes.eliminate_dead_code(graph) == 0          # a store is a side effect
    fn = resolve_backend(backend)(graph)
    x = np.arange(4, dtype=np.float32)
    y = np.full(4, 10, np.float32)
    (out,) = fn([x, y], [], [], [], [])
    np.testing.assert_array_equal(out, np.arange(4) * 2 + 1)
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("backend", ["python", "c"])
def test_a_hook_updating_a_parameter_in_place_is_a_barrier_to_fusion(backend):
    # (review finding) The gradient of tanh(X @ p1) * p0 reads p0 in an elementwise
    # node; the C backend fused it into a loop after p0's hook had updated p0.
    def go(mode):
        rng = np.random.default_rng(1)
        p0 = ca.tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
        p1 = ca.tensor(rng.standard_normal((4, 4)).astype(np.float32), requires_grad=True)
        x = ca.tensor(rng.standard_normal((3, 4)).astype(np.float32))

        def update(p):
            p._data -= 0.3 * p.grad._data
            p.grad = None
        for p in (p0, p1):
            p.register_post_accumulate_grad_hook(update)
        for _ in range(3):
            _backward(((x @ p1).tanh() * p0).sum(), mode)
        return [p.detach().numpy() for p in (p0, p1)]
    for got, ref in zip(go(backend), go("eager")):
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_a_scheduler_moving_adams_betas_is_no_recompile():
    # (review finding) lerp_'s abs(1 - beta1) pinned beta1 by a guard: OneCycleLR,
    # which cycles beta1, made every step a new graph.
    ca.reset_compiled_autograd()
    ex = make_mlp(layers=2, width=8, batch=4)
    opt = ca.optim.in_backward(ca.optim.Adam(ex.parameters(), lr=0.01))
    sched = ca.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=12)
    for _ in range(10):
        _backward(ex.loss(), "python")
        sched.step()
    stats = ca.compiled_autograd_stats()
    assert stats["compiles"] == 2 and stats["cache_hits"] == 8, stats


@pytest.mark.parametrize("backend", ["eager", "python", "c"])
def test_a_saved_copy_of_an_updated_parameter_read_after_its_update_raises(backend):
    # (review finding) p0's update runs before MulBackward reads the detached p0 it
    # saved: eager's unpack raises; the trace raises the same, before anything runs.
    p0 = ca.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    p1 = ca.tensor(np.array([3.0, 4.0], np.float32), requires_grad=True)
    ca.optim.in_backward(ca.optim.SGD([p0, p1], lr=1.0))
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*MulBackward"):
        _backward((p1 * p0.detach()).sum() + (p0 * 2).sum(), backend)
    if backend != "eager":     # (eager updated p0 before its unpack raised)
        np.testing.assert_array_equal(p0.detach().numpy(), [1.0, 2.0])
        np.testing.assert_array_equal(p1.detach().numpy(), [3.0, 4.0])


@pytest.mark.parametrize("backend", ["python", "c"])
def test_state_of_another_dtype_is_updated_as_eager_does(backend):
    # (review finding) Adam's moments in float32 beside a float64 parameter: eager
    # computes in the parameter's dtype (its scratch); the update is called as Python.
    def go(mode):
        ca.manual_seed(0)
        p = ca.nn.Parameter(np.linspace(-1, 1, 6).astype(np.float32))
        opt = ca.optim.in_backward(ca.optim.Adam([p], lr=0.1))
        _backward((p * p).sum(), mode)                 # float32 state is made
        p._data = p._data.astype(np.float64)
        for _ in range(3):
            _backward((p * p).sum(), mode)
        return p.detach().numpy()
    np.testing.assert_array_equal(go(backend), go("eager"))


@pytest.mark.parametrize("backend", ["python", "c"])
@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_a_loaded_state_with_a_none_momentum_buffer_is_updated_as_eager_does(backend, momentum):
    # (an older torch's SGD state_dict holds "momentum_buffer": None; eager's rule
    # makes the buffer on the first step; the traced update raised AttributeError)
    def train(backend):
        ca.reset_compiled_autograd()
        p = ca.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
        q = ca.tensor(np.array([1.0, -2.0], np.float32), requires_grad=True)
        opt = ca.optim.SGD([p, q], lr=0.1, momentum=momentum)
        sd = opt.state_dict()
        sd["state"] = {0: {"momentum_buffer": None}, 1: {"momentum_buffer": None}}
        opt.load_state_dict(sd)
        ca.optim.in_backward(opt)
        for _ in range(3):
            _backward((p * p).sum() + (q * 3).sum(), backend)
        return p.detach().numpy(), q.detach().numpy()

    ref = train("eager")
    got = train(backend)
    rtol = 0 if backend == "python" else 1e-6
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=rtol)
