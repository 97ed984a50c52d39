"""Compiled autograd on every backend: the scenarios of PyTorch's
test_compiled_autograd.py, ported (not the code). Each runs the same backward
eagerly and compiled and compares: bit for bit on "eager" and "python" (same
kernels, same order); on "c" within rtol 1e-5 (float32) / 1e-10 (float64), since
its loops and fused expressions round differently."""
import gc
import logging

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.examples import build
from helpers import assert_backend_matches, profile_backward
from op_cases import CASES, make_inputs

BACKEND = "eager"


@pytest.fixture(autouse=True, params=["eager", "python", "c"])
def backend(request):
    """Every scenario runs on the reference interpreter, generated Python and C."""
    global BACKEND
    BACKEND = request.param
    yield request.param
    BACKEND = "eager"


@pytest.fixture(autouse=True)
def fresh_cache():
    ca.reset_compiled_autograd()
    yield
    ca.reset_compiled_autograd()


def _both(run):
    """run(compiled: bool) -> list of arrays; compare eager with compiled."""
    eager = run(False)
    compiled = run(True)
    assert len(eager) == len(compiled)
    for a, b in zip(eager, compiled):
        if a is None or b is None:
            assert a is None and b is None
        else:
            assert_matches(a, b)
    return eager


def assert_matches(eager, compiled):
    assert_backend_matches(BACKEND, eager, compiled)


def _maybe(compiled, **kw):
    return ca.compiled_backward(backend=BACKEND, **kw) if compiled else _Null()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("name,fn,specs", CASES, ids=[c[0] for c in CASES])
def test_every_op_case_compiled_equals_eager(name, fn, specs):
    def run(compiled):
        arrays, grads = make_inputs(specs, seed=5)
        inputs = [ca.tensor(a, requires_grad=True) if g else ca.from_numpy(a)
                  for a, g in zip(arrays, grads)]
        out = fn(ca, *inputs)
        up = ca.tensor(np.random.default_rng(1).standard_normal(out.shape))
        if compiled:
            ca.trace_backward(out, grad_outputs=up).graph.lint()
        with _maybe(compiled):
            out.backward(up)
        return [t.grad.numpy() for t, g in zip(inputs, grads) if g]
    _both(run)


@pytest.mark.parametrize("name,sizes", [
    ("mlp", dict(layers=3, width=16, batch=4)),
    ("transformer", dict(layers=2, d_model=32, heads=4, seq=8, batch=2, vocab=50))])
@pytest.mark.parametrize("checkpoint", ["none", "layer", "selective"])
@pytest.mark.parametrize("offload", [False, True])
def test_bundled_models_bitwise(name, sizes, checkpoint, offload):
    def run(compiled):
        ex = build(name, checkpoint=checkpoint, offload=offload, **sizes)
        with _maybe(compiled):
            ex.loss().backward()
        return [p.grad.numpy() for p in ex.parameters()]
    _both(run)


def test_cache_hit_skips_tracing():
    ex = build("mlp", layers=3, width=8, batch=4)
    with ca.compiled_backward(backend=BACKEND):
        for _ in range(3):
            ex.loss().backward()
    stats = ca.compiled_autograd_stats()
    assert stats["captures"] == 1 and stats["compiles"] == 1 and stats["cache_hits"] == 2
    grads = [p.grad.numpy().copy() for p in ex.parameters()]
    ex.zero_grad()
    for _ in range(3):
        ex.loss().backward()
    for g, p in zip(grads, ex.parameters()):
        assert_matches(g, p.grad.numpy())


def test_changes_miss_the_cache():
    x = ca.randn(4, 3, requires_grad=True)
    with ca.compiled_backward(backend=BACKEND):
        (x * 2).sum().backward()
        (x * 2).sum().backward()               # hit
        (x * 3).sum().backward()               # a scalar constant is baked in: miss
        (x * x).sum().backward()               # a saved tensor: different node args
        x.sum(0).sum().backward()              # different node attributes
        ca.randn(5, 3, requires_grad=True).exp().sum().backward()   # new shape
    stats = ca.compiled_autograd_stats()
    assert stats["cache_hits"] == 1
    assert stats["captures"] == 5


def _hooked(compiled):
    calls = []
    a = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = ca.tensor([0.5, -1.0, 2.0], requires_grad=True)
    x = a * b
    y = x.exp()
    z = (y * x).sum()
    x.retain_grad()
    x.register_hook(lambda g: calls.append("x.hook") or g * 2)
    y.register_hook(lambda g: calls.append("y.hook"))
    a.register_hook(lambda g: calls.append("a.hook"))
    a.register_post_accumulate_grad_hook(lambda t: calls.append("a.post_acc"))
    x.grad_fn.register_prehook(lambda gs: calls.append("MulX.pre") or (gs[0] + 1,))
    x.grad_fn.register_hook(lambda gi, go: calls.append("MulX.post"))
    y.grad_fn.register_hook(lambda gi, go: calls.append("Exp.post") or (gi[0] * 3,))
    with _maybe(compiled):
        z.backward()
    return calls, [a.grad.numpy(), b.grad.numpy(), x.grad.numpy()]


def test_hooks_order_and_effects_equal_eager():
    eager_calls, eager_grads = _hooked(False)
    compiled_calls, compiled_grads = _hooked(True)
    assert eager_calls == compiled_calls
    for e, c in zip(eager_grads, compiled_grads):
        assert_matches(e, c)


def test_hook_nodes_in_the_graph_survive_dce():
    a = ca.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    h = a * 2
    h.register_hook(lambda g: seen.append(1))   # returns None: only a side effect
    g = ca.trace_backward(h.sum())
    kinds = [n.target for n in g.graph.nodes if n.op == "call_hook"]
    assert kinds.count("tensor_pre_hook") == 1 and "accumulate_grad" in kinds
    g.graph.lint()


def test_reused_leaf_implicit_add():
    def run(compiled):
        a = ca.tensor([0.3, -1.2, 2.0], requires_grad=True)
        with _maybe(compiled):
            (a * a + a.sin() * a + a).sum().backward()
        return [a.grad.numpy()]
    _both(run)


def test_grad_leaves_dot_grad_untouched_and_inputs_recompile():
    def run(compiled):
        a = ca.tensor([1.0, 2.0], requires_grad=True)
        b = ca.tensor([3.0, -1.0], requires_grad=True)
        with _maybe(compiled):
            ga, = ca.autograd.grad((a * b).exp().sum(), [a])
            gb, ga2 = ca.autograd.grad((a * b).exp().sum(), [b, a])
        assert a.grad is None and b.grad is None
        return [ga.numpy(), gb.numpy(), ga2.numpy()]
    _both(run)
    assert ca.compiled_autograd_stats()["captures"] == 2  # different inputs= recompile


def test_backward_inputs():
    def run(compiled):
        a = ca.tensor([1.0, 2.0], requires_grad=True)
        b = ca.tensor([3.0, -1.0], requires_grad=True)
        h = a * b
        with _maybe(compiled):
            (h * h).sum().backward(inputs=[b, h])
        assert a.grad is None
        return [b.grad.numpy(), h.grad.numpy()]
    _both(run)


def test_accumulate_into_existing_grad_keeps_the_object():
    a = ca.tensor([1.0, 2.0], requires_grad=True)
    (a * 2).sum().backward()
    g = a.grad
    with ca.compiled_backward(backend=BACKEND):
        (a * 3).sum().backward()
    assert a.grad is g
    assert_matches(g.numpy(), [5.0, 5.0])


def _custom_function(scale, inline=False):
    class Scaled(ca.autograd.Function):
        inline_backward = inline

        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            ctx.scale = scale
            ctx.offset = ca.ones(*x.shape) * 0.5   # a Tensor attribute
            return x * y * scale

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y * ctx.scale + ctx.offset, g * x * ctx.scale
    return Scaled


@pytest.mark.parametrize("inline", [False, True])
def test_custom_function_saved_tensors_attributes_and_dynamic_classes(inline):
    def run(compiled, fn_cls):
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        y = ca.tensor([3.0, 4.0], requires_grad=True)
        with _maybe(compiled):
            fn_cls.apply(x, y).sum().backward()
        return [x.grad.numpy(), y.grad.numpy()]
    two = _custom_function(2.0, inline)
    _both(lambda c: run(c, two))
    _both(lambda c: run(c, two))
    assert ca.compiled_autograd_stats()["cache_hits"] == 1
    three = _custom_function(3.0, inline)   # a new class, defined at run time: keyed by identity
    _both(lambda c: run(c, three))
    assert ca.compiled_autograd_stats()["captures"] == 2


def test_checkpoint_puts_unpack_hooks_before_their_users():
    ex = build("mlp", layers=3, width=8, batch=4, checkpoint="layer")
    g = ca.trace_backward(ex.loss())
    g.graph.lint()
    nodes = g.graph.nodes
    unpacks = [n for n in nodes if n.op == "call_hook" and n.target == "unpack_hook"]
    assert len(unpacks) >= 4
    for n in unpacks:
        first_user = min(nodes.index(u) for u in n.users)
        assert first_user == nodes.index(n) + 1, n.name
    upfront = ca.trace_backward(build("mlp", layers=3, width=8, batch=4,
                                      checkpoint="layer").loss(), unpack="upfront")
    un = [i for i, n in enumerate(upfront.graph.nodes) if n.target == "unpack_hook"]
    first_prim = next(i for i, n in enumerate(upfront.graph.nodes)
                      if n.op == "call_function" and n.target != "getitem")
    assert max(un) < first_prim  # every unpack before any computation
    upfront.graph.lint()


def test_trace_backward_runs_and_frees_nothing():
    ex = build("mlp", layers=2, width=8, batch=4)
    loss = ex.loss()
    g = ca.trace_backward(loss)
    assert all(p.grad is None for p in ex.parameters())
    loss.backward()  # the graph is intact
    assert all(p.grad is not None for p in ex.parameters())
    assert "digraph" in g.to_dot() and '"nodes"' in g.to_json()


def test_backward_twice_errors():
    x = ca.randn(3, requires_grad=True)
    loss = x.exp().sum()
    with ca.compiled_backward(backend=BACKEND):
        loss.backward()
        with pytest.raises(RuntimeError, match="Trying to backward through the graph a second "
                                               "time"):
            loss.backward()



def test_retain_graph_keeps_saved_values():
    def run(compiled):
        x = ca.tensor([0.5, 1.5], requires_grad=True)
        loss = (x.exp() * x).sum()
        with _maybe(compiled):
            loss.backward(retain_graph=True)
            loss.backward()
        return [x.grad.numpy()]
    _both(run)


def test_user_compiler_fn_receives_a_graph_module():
    """As torch's compiled autograd: compiler_fn(gm) once per new graph; gm is
    callable (the reference interpreter) and has .graph, .code, .print_readable()."""
    seen = []

    def compiler(gm):
        seen.append(gm)
        return gm

    x = ca.randn(3, requires_grad=True)
    for _ in range(2):
        x.grad = None
        with ca.compiled_backward(backend=compiler):
            x.tanh().sum().backward()
    (gm,) = seen                                  # the second backward was a hit
    np.testing.assert_allclose(x.grad.numpy(), 1 - np.tanh(x.detach().numpy()) ** 2,
                               rtol=1e-6)
    assert [n.target for n in gm.graph.nodes if n.op == "call_hook"] == ["accumulate_grad"]
    assert "def compiled_backward(" in gm.code and gm.print_readable(False) == gm.code
    assert str(gm) == str(gm.graph)
    with pytest.raises(ValueError, match="unknown compiled autograd backend 'nope'"):
        ca.compiled_backward(backend="nope")


def test_logging_reports_graphs_and_miss_reasons(monkeypatch, caplog):
    monkeypatch.setenv("CA_LOGS", "verbose")
    x = ca.randn(3, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="compiled_autograd"):
        with ca.compiled_backward(backend=BACKEND):
            (x * 2).sum().backward()
            (x * 2).exp().sum().backward()
    text = caplog.text
    assert "cache miss: empty cache" in text
    assert "cache miss: new autograd node ExpBackward (NodeCall 1)" in text
    assert "compiled autograd graph 1:" in text and "call_hook[accumulate_grad]" in text


def test_compiled_backward_frees_saved_values_progressively():
    x = ca.randn(64, 64, requires_grad=True)
    h = x
    for _ in range(4):
        h = (h * 1.0).tanh()
    loss = h.sum()
    with ca.compiled_backward(backend=BACKEND):
        loss.backward()
    gc.collect()
    assert all(sv.released for sv in loss.grad_fn.saved_variables())


def _backward_peak(unpack, checkpoint="layer", offload=False):
    ex = build("transformer", checkpoint=checkpoint, offload=offload)  # the bundled size
    return profile_backward(ex.loss(), None if unpack is None else BACKEND, unpack).peak_bytes


@pytest.mark.parametrize("checkpoint,offload", [("layer", False), ("none", True)])
def test_progressive_unpacking_peaks_no_higher_than_eager(checkpoint, offload):
    eager = _backward_peak(None, checkpoint, offload)
    progressive = _backward_peak("progressive", checkpoint, offload)
    upfront = _backward_peak("upfront", checkpoint, offload)
    assert progressive <= eager, (progressive, eager)
    assert upfront >= 1.5 * progressive, (upfront, progressive)


def test_ctx_attributes_are_keyed_by_value_or_not_cached():
    # A traced backward (inline_backward) bakes in what it reads of ctx.
    class Scaled(ca.autograd.Function):
        inline_backward = True

        @staticmethod
        def forward(ctx, x, cfg):
            ctx.cfg = cfg
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g * ctx.cfg["scale"] * ctx.cfg["ws"][0], None

    cfg = {"scale": 2.0, "ws": (ca.ones(3),)}
    with ca.compiled_backward(backend=BACKEND):
        for k in (2.0, 3.0, 3.0):
            cfg["scale"] = k
            cfg["ws"] = (ca.full((3,), k),)
            x = ca.ones(3, requires_grad=True)
            Scaled.apply(x, cfg).sum().backward()
            assert_matches(x.grad.numpy(), np.full(3, k * k))
    assert ca.compiled_autograd_stats()["cache_hits"] == 1  # the repeated 3.0

    class Opaque(ca.autograd.Function):
        inline_backward = True

        @staticmethod
        def forward(ctx, x, fn):
            ctx.fn = fn
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return ctx.fn(g), None

    with ca.compiled_backward(backend=BACKEND):
        for k in (2.0, 3.0):
            x = ca.ones(3, requires_grad=True)
            Opaque.apply(x, lambda g, k=k: g * k).sum().backward()
            assert_matches(x.grad.numpy(), np.full(3, k))


def test_hooks_run_without_grad_mode_like_eager():
    def run(compiled):
        w = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
        def sgd_step(p):
            p.sub_(p.grad * 0.1)  # an optimizer step inside the backward

        w.register_post_accumulate_grad_hook(sgd_step)
        with _maybe(compiled):
            (w * w).sum().backward()
        return [w.detach().numpy()]
    _both(run)


def test_ctx_attributes_are_read_at_run_time_by_a_backward_run_as_python():
    class Scaled(ca.autograd.Function):
        @staticmethod
        def forward(ctx, x, cfg):
            ctx.cfg = cfg
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g * ctx.cfg["scale"] * ctx.cfg["fn"](ctx.cfg["ws"][0]), None

    with ca.compiled_backward(backend=BACKEND):
        for k in (2.0, 3.0, 3.0):
            cfg = {"scale": k, "ws": (ca.full((3,), k),), "fn": lambda t, k=k: t + k}
            x = ca.ones(3, requires_grad=True)
            Scaled.apply(x, cfg).sum().backward()
            assert_matches(x.grad.numpy(), np.full(3, k * 2 * k))
    stats = ca.compiled_autograd_stats()
    assert (stats["captures"], stats["cache_hits"]) == (1, 2)   # nothing keyed by value


def test_reentrant_checkpoint_compiles():
    from compiled_autograd.utils.checkpoint import checkpoint
    runs = []

    def segment(t):
        runs.append(1)
        return (t.exp() * t).sin()

    def grads(compiled):
        x = ca.tensor([0.5, -1.0, 2.0], requires_grad=True)
        out = (checkpoint(segment, x, use_reentrant=True) * 2).sum()
        with _maybe(compiled):
            out.backward()
        return x.grad.numpy()
    want = grads(False)
    for _ in range(2):
        runs.clear()
        assert_matches(want, grads(True))
        assert len(runs) == 2                 # the forward, and its recomputation
    stats = ca.compiled_autograd_stats()
    # The outer backward (its checkpoint node runs as Python) and the nested one
    # (the recomputed segment's), each compiled once, then hits.
    assert (stats["captures"], stats["cache_hits"]) == (2, 2)


def test_custom_function_saved_values_are_released_after_a_compiled_backward():
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    y = ca.tensor([3.0, 4.0], requires_grad=True)
    loss = _custom_function(2.0).apply(x, y).sum()
    with ca.compiled_backward(backend=BACKEND):
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
    assert_matches(x.grad.numpy(), [2 * 3.0 + 0.5, 2 * 4.0 + 0.5])


def test_a_new_compiler_callable_never_hits_an_old_ones_entry():
    """The cache is keyed by the compiler itself: a freed callable's id, handed on
    to the next one, must not find the old compiled graph."""
    from compiled_autograd.compiled.interpreter import Interpreter
    calls = []
    x = ca.randn(3, requires_grad=True)
    for i in range(3):
        def compiler(gm, i=i):
            calls.append(i)
            return Interpreter(gm.graph)
        with ca.compiled_backward(backend=compiler):
            (x * 2).sum().backward()
        del compiler
    assert calls == [0, 1, 2]


def test_a_compiler_that_cannot_be_hashed():
    from dataclasses import dataclass

    from compiled_autograd.compiled.interpreter import Interpreter

    @dataclass
    class Compiler:            # a dataclass: __hash__ is None
        name: str = "mine"

        def __call__(self, gm):
            return Interpreter(gm.graph)
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    with ca.compiled_backward(backend=Compiler()):
        (x * x).sum().backward()
    assert_matches(x.grad.numpy(), [2.0, 4.0])


def test_saved_arrays_are_freed_during_the_backward():
    """Each saved array is freed right after its last use, not when the backward
    returns: by the time the leaf's hook runs, every one of them is gone."""
    import weakref
    x = ca.randn(64, requires_grad=True)
    h = x
    refs = []
    for _ in range(4):
        h = h.tanh()                     # TanhBackward saves its output
        refs.append(weakref.ref(h.grad_fn.saved[0]._data))
    loss = h.sum()
    del h
    seen = []
    x.register_hook(lambda g: seen.append([r() is None for r in refs]))
    with ca.compiled_backward(backend=BACKEND):
        loss.backward()
    assert seen == [[True] * 4]


def test_a_fresh_gradient_becomes_dot_grad_without_a_copy_and_shared_ones_are_copied():
    """The first accumulation keeps a gradient a prim just made as .grad; one that
    reaches two leaves (add's backward hands both the same array) is copied, so
    accumulating again into one never changes the other."""
    def run(compiled):
        rng = np.random.default_rng(0)
        w = ca.tensor(rng.standard_normal((3, 4)), requires_grad=True)
        a = ca.tensor(rng.standard_normal((2, 4)), requires_grad=True)
        b = ca.tensor(rng.standard_normal((2, 4)), requires_grad=True)
        x = ca.tensor(rng.standard_normal((2, 3)))
        with _maybe(compiled):
            for _ in range(2):
                ((x @ w) * (a + b)).sum().backward()
        return [w.grad.numpy(), a.grad.numpy(), b.grad.numpy()]
    _both(run)
    if BACKEND == "python":
        w = ca.randn(3, 4, requires_grad=True)
        x = ca.randn(2, 3)
        with ca.memory.profile(tracemalloc_witness=False) as prof:
            with ca.compiled_backward(backend="python"):
                (x @ w).sum().backward()
        assert not [e for e in prof.timeline if e.name == "AccumulateGrad"]


def test_autograd_grad_returns_a_hook_result_or_a_root_gradient():
    """The returned gradient is a hook's array, or the incoming gradient itself."""
    def run(compiled):
        x = ca.tensor([0.0, 1.0, 2.0], requires_grad=True)
        x.register_hook(lambda g: g * 3.0)
        a = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
        b = a.clone()
        b.register_hook(lambda g: g)
        with _maybe(compiled):
            gx = ca.autograd.grad((x * x).sum(), [x])
            gb = ca.autograd.grad(b, [b], grad_outputs=[ca.ones(3)])
        return [g.numpy() for g in gx + gb]
    _both(run)


def test_a_custom_function_may_name_a_ctx_attribute_variable():
    """Only AccumulateGrad's ``variable`` is a leaf whose hooks count."""
    class Scale(ca.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.variable = 5
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * float(ctx.variable)

    def run(compiled):
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        with _maybe(compiled):
            Scale.apply(x).sum().backward()
        return [x.grad.numpy()]
    assert _both(run)[0].tolist() == [5.0, 5.0]


def test_create_graph_runs_on_the_eager_engine(monkeypatch, caplog):
    # The compiled code records no graph of the gradients it computes; a double
    # backward needs one: such a backward runs eagerly, exactly as eager, and says so.
    import logging
    monkeypatch.setenv("CA_LOGS", "verbose")

    def run(compiled):
        x = ca.tensor([0.5, -1.0, 2.0], requires_grad=True)
        with _maybe(compiled):
            (g,) = ca.autograd.grad((x.exp() * x).sum(), x, create_graph=True)
            g.sum().backward()
        return [g.detach().numpy(), x.grad.numpy()]
    want = run(False)
    with caplog.at_level(logging.INFO, logger="compiled_autograd"):
        got = run(True)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)
    assert "create_graph=True: this backward runs on the eager engine" in caplog.text
    assert ca.compiled_autograd_stats()["captures"] == 1   # (the second, first-order one)
