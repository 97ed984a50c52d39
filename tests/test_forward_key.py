"""The cache key kept up to date during the forward (compiled/forward_key.py)
against compiled_args' walk, which stays the reference.

Every scenario of test_compiled.py and test_dynamic_shapes.py runs again here with
``check_key`` on: a backward that takes the forward's segment is collected by
walking the graph too, and any difference -- key items, sizes, scalars, or a
runtime value by identity -- fails. (The random programs run with it on as well:
test_fuzz_backends.py.) Below them, what must make a backward walk instead, and
what the segment must not keep alive."""
import gc
import threading
import weakref

import numpy as np
import pytest

import compiled_autograd as ca
import test_compiled
from compiled_autograd.autograd import dispatch
from compiled_autograd.compiled import compiled_args, forward_key
from compiled_autograd.compiled.compiled_args import Key, fold_hash, KEY_SEED
from compiled_autograd.examples import build
from fuzz_programs import BACKEND_TOL
from helpers import BACKENDS
from test_compiled import *  # noqa: F401,F403  (the scenarios, collected again here)
from test_dynamic_shapes import *  # noqa: F401,F403  (and the dynamic-shape ones)

# (The imported tests' own pytestmark is replaced by this one: keep their fixture.)
pytestmark = [pytest.mark.usefixtures("fresh_compiled_cache")]


@pytest.fixture(autouse=True, params=["python"])
def backend(request):
    """Overrides test_compiled's: one backend is enough to exercise the keys."""
    test_compiled.BACKEND = request.param
    yield request.param
    test_compiled.BACKEND = "eager"


@pytest.fixture(autouse=True)
def checked():
    forward_key.check_key(True)
    yield
    forward_key.check_key(False)


def _taken(fn):
    """Run ``fn``; how many backwards took the forward's segment meanwhile."""
    before = forward_key.stats["taken"]
    fn()
    return forward_key.stats["taken"] - before


_ON = ["python"]     # the backend the tests below run their backwards on


@pytest.fixture(params=BACKENDS)
def on_backend(request):
    """The tests below on every backend (eager interpreter, python, c)."""
    _ON[0] = request.param
    yield request.param
    _ON[0] = "python"


def _same(got, want):
    """Eager's gradient: bit for bit on "eager" and "python"; on "c", within the
    tolerance the backends are held to (fuzz_programs.BACKEND_TOL: its own loops
    round differently)."""
    if _ON[0] == "c":
        rtol, atol = BACKEND_TOL[np.asarray(want).dtype.type]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, want)


def _compiled_backward(loss, **kw):
    with ca.compiled_backward(backend=_ON[0]):
        loss.backward(**kw)


@pytest.mark.parametrize("name,kw", [
    ("mlp", dict(layers=3, width=8, batch=4)),
    ("transformer", dict(layers=2, d_model=16, heads=2, seq=4, batch=2, vocab=20)),
])
def test_bundled_models_take_the_segment_and_match_eager(name, kw, on_backend):
    ex = build(name, **kw)
    ex.loss().backward()
    eager = [p.grad.numpy().copy() for p in ex.parameters()]
    for _ in range(2):                       # a miss, then a hit
        for p in ex.parameters():
            p.grad = None
        ca.compiled_backward(backend="python")   # (keeps segments from here on)
        loss = ex.loss()
        assert _taken(lambda: _compiled_backward(loss)) == 1
        for e, p in zip(eager, ex.parameters()):
            _same(p.grad.numpy(), e)
    assert ca.compiled_autograd_stats()["cache_hits"] == 1


def _forward():
    x = ca.tensor(np.linspace(-1.0, 1.0, 6).reshape(2, 3), requires_grad=True)
    w = ca.tensor(np.linspace(0.5, 1.5, 3), requires_grad=True)
    h = (x * w).tanh()
    return x, w, h, (h * h).sum()


def _eager_grads(change=None):
    x, w, h, loss = _forward()
    if change is not None:
        change(x, w, h)
    loss.backward()
    return x.grad.numpy(), w.grad.numpy()


def _hook_on_intermediate(x, w, h):
    h.register_hook(lambda g: g * 2)


def _retain_intermediate(x, w, h):
    h.retain_grad()


def _hook_on_leaf(x, w, h):
    w.register_hook(lambda g: g * 3)


def _unrelated_write(x, w, h):
    ca.zeros(3).add_(1.0)                    # moves the write clock, changes no saved value


@pytest.mark.parametrize("change,takes", [
    (None, True),
    (_hook_on_intermediate, False),        # a node gained a hook: walk
    (_retain_intermediate, False),
    (_hook_on_leaf, True),                 # leaves are collected at the backward
    (_unrelated_write, True),              # versions checked one by one, all unchanged
])
def test_what_changes_after_the_forward(change, takes, on_backend):
    want = _eager_grads(change)
    ca.compiled_backward(backend="python")
    for _ in range(2):
        x, w, h, loss = _forward()
        if change is not None:
            change(x, w, h)
        assert _taken(lambda: _compiled_backward(loss)) == int(takes)
        _same(x.grad.numpy(), want[0])
        _same(w.grad.numpy(), want[1])


def test_a_modified_saved_value_fails_as_eager(on_backend):
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.arange(1.0, 5.0), requires_grad=True)
    a = x * 1.0
    b = a.sin()
    a.add_(1.0)                              # a's node is rebased: the graph is not the segment's
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _compiled_backward(b.sum())
    y = x.exp()
    z = (y * 2).sum()
    with ca.no_grad():
        y.mul_(2.0)                          # no node: the segment is whole, the value is not
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _compiled_backward(z)


def test_a_second_backward_fails_as_eager_and_retain_graph_works(on_backend):
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.arange(1.0, 5.0), requires_grad=True)
    loss = (x.exp() * 2).sum()
    assert _taken(lambda: _compiled_backward(loss)) == 1
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _compiled_backward(loss)
    x.grad = None
    loss = (x.exp() * 2).sum()
    assert _taken(lambda: _compiled_backward(loss, retain_graph=True)) == 1
    assert _taken(lambda: _compiled_backward(loss)) == 0      # (the segment ended)
    np.testing.assert_allclose(x.grad.numpy(), 4 * np.exp(np.arange(1.0, 5.0)))


def test_two_forwards_summed_take_one_segment_and_one_alone_walks(on_backend):
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.arange(1.0, 4.0), requires_grad=True)
    first, second = (x * 2).sum(), (x.exp()).sum()
    assert _taken(lambda: _compiled_backward(first + second)) == 1
    np.testing.assert_allclose(x.grad.numpy(), 2 + np.exp(np.arange(1.0, 4.0)))
    x.grad = None
    first, second = (x * 2).sum(), (x.exp()).sum()
    assert _taken(lambda: _compiled_backward(first)) == 0      # not the whole segment
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 2.0))
    assert _taken(lambda: _compiled_backward(second)) == 0     # (the segment ended)
    np.testing.assert_allclose(x.grad.numpy(), 2 + np.exp(np.arange(1.0, 4.0)))


def _scaled_tanh(inline):
    """A custom Function saving its output (and its input, under ``inline``), with
    a flag and a scale on ctx that its backward reads."""
    class ScaledTanh(ca.autograd.Function):
        inline_backward = inline

        @staticmethod
        def forward(ctx, h, scale):
            y = h.tanh()
            ctx.scale, ctx.flip = scale, False
            ctx.save_for_backward(y, h) if inline else ctx.save_for_backward(y)
            return y * scale

        @staticmethod
        def backward(ctx, g):
            y = ctx.saved_tensors[0]
            out = g * (1 - y * y) * ctx.scale
            return (-out if ctx.flip else out), None
    return ScaledTanh


def _custom_forward(fn, x, w):
    """Prims and custom Function nodes, interleaved."""
    h = x
    for k in range(3):
        h = fn.apply(h @ w, 0.5 + k)
    return (h * h).sum()


@pytest.mark.parametrize("inline", [False, True])
def test_custom_functions_take_the_segment(inline, on_backend):
    fn = _scaled_tanh(inline)
    rng = np.random.default_rng(0)
    x = ca.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    w = ca.tensor(rng.standard_normal((3, 3)) * 0.5, requires_grad=True)
    _custom_forward(fn, x, w).backward()
    want = x.grad.numpy().copy(), w.grad.numpy().copy()
    ca.compiled_backward(backend="python")
    for _ in range(3):                       # a miss, (eager, learning Nones,) hits
        x.grad = w.grad = None
        loss = _custom_forward(fn, x, w)
        assert _taken(lambda: _compiled_backward(loss)) == 1
        _same(x.grad.numpy(), want[0])
        _same(w.grad.numpy(), want[1])


@pytest.mark.parametrize("inline", [False, True])
def test_a_ctx_changed_after_the_forward_is_read_at_the_backward(inline, on_backend):
    fn = _scaled_tanh(inline)
    x = ca.tensor(np.linspace(-1, 1, 6).reshape(2, 3), requires_grad=True)
    w = ca.tensor(np.eye(3) * 0.7, requires_grad=True)

    def change(loss):
        node = loss.grad_fn.next_functions[0][0].next_functions[0][0]   # the last ScaledTanh
        node.scale, node.flip = 4.0, True
    loss = _custom_forward(fn, x, w)
    change(loss)
    loss.backward()
    want = x.grad.numpy().copy()
    ca.compiled_backward(backend="python")
    for _ in range(3):
        x.grad = w.grad = None
        _compiled_backward(_custom_forward(fn, x, w))   # (unchanged: cached)
        x.grad = w.grad = None
        loss = _custom_forward(fn, x, w)
        change(loss)
        assert _taken(lambda: _compiled_backward(loss)) == 1
        _same(x.grad.numpy(), want)


def test_a_custom_functions_second_backward_fails_as_eager(on_backend):
    fn = _scaled_tanh(False)
    x = ca.tensor(np.ones((2, 3)), requires_grad=True)
    w = ca.tensor(np.eye(3), requires_grad=True)
    ca.compiled_backward(backend="python")
    loss = _custom_forward(fn, x, w)
    _compiled_backward(loss, retain_graph=True)
    _compiled_backward(loss)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _compiled_backward(loss)
    loss = _custom_forward(fn, x, w)
    loss.grad_fn.next_functions[0][0].next_functions[0][0].release_variables()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _compiled_backward(loss)


def test_a_function_with_no_differentiable_output_leaves_the_segment(on_backend):
    """A Function whose outputs carry no gradient (an argmax beside the loss) has
    a node in no graph: it does not end the segment."""
    class Argmax(ca.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return ca.from_numpy(np.argmax(a.numpy(), axis=-1))

        @staticmethod
        def backward(ctx, g):
            return None
    x = ca.tensor(np.linspace(0, 1, 32).reshape(4, 8), requires_grad=True)
    ca.compiled_backward(backend="python")
    for _ in range(2):
        x.grad = None
        h = x.exp()
        Argmax.apply(h)
        loss = (h * 2).sum()
        assert _taken(lambda: _compiled_backward(loss)) == 1
        _same(x.grad.numpy(), 2 * np.exp(x.detach().numpy()))


def test_a_graph_the_collector_frees_while_a_node_is_added(monkeypatch):
    """A dropped graph in a reference cycle goes at a garbage collection, which
    can run at any allocation while the forward adds a node: its segment ends
    then, and the forward goes on."""
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.ones(4), requires_grad=True)
    collect_node = forward_key.collect_node

    def collecting(*args, **kwargs):        # (a collection at an allocation in there)
        gc.collect()
        return collect_node(*args, **kwargs)
    gc.disable()
    try:
        y = x.exp() * 2
        y.register_hook(lambda g, y=y: g)   # tensor -> hook -> tensor: a cycle
        del y
        monkeypatch.setattr(forward_key, "collect_node", collecting)
        h = x.sin()
        monkeypatch.setattr(forward_key, "collect_node", collect_node)
    finally:
        gc.enable()
    _compiled_backward(h.sum())
    np.testing.assert_allclose(x.grad.numpy(), np.cos(np.ones(4)))


def test_graphs_the_segment_cannot_describe_walk(on_backend):
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.arange(1.0, 4.0), requires_grad=True)
    cases = [
        lambda: _compiled_backward((x * 1.0).sum(), inputs=[x]),        # inputs=
        lambda: ca.autograd.grad((x * 3).sum(), [x]),                   # (outside compiled)
    ]
    for case in cases:
        assert _taken(case) == 0
    v = x * 1.0
    v[1:].mul_(2.0)                          # in place on a view: CopySlices
    assert _taken(lambda: _compiled_backward(v.sum())) == 0


def _under_identity_hooks(f, x):
    with ca.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        return f(x)


def _checkpointed(f, x):
    from compiled_autograd.utils.checkpoint import checkpoint
    return checkpoint(f, x, use_reentrant=False)


def _offloaded(f, x):
    with ca.autograd.graph.save_on_disk():
        return f(x)


@pytest.mark.parametrize("under", [_under_identity_hooks, _checkpointed, _offloaded])
def test_values_under_saved_tensor_hooks_take_the_segment(under, on_backend):
    """The unpack hooks and packed data are read from the saved variables at the
    backward, as the walk collects them (check_key compares them by identity)."""
    def f(x):
        return (x.exp() * x).sin().sum()

    x = ca.tensor(np.linspace(-1.0, 1.0, 6), requires_grad=True)
    f(x).backward()
    want = x.grad.numpy().copy()
    ca.compiled_backward(backend="python")
    for _ in range(2):
        x.grad = None
        loss = under(f, x)
        assert _taken(lambda: _compiled_backward(loss)) == 1
        _same(x.grad.numpy(), want)


def test_a_forward_on_another_thread_walks(on_backend):
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.arange(1.0, 4.0), requires_grad=True)
    out = []
    t = threading.Thread(target=lambda: out.append((x.exp() * 2).sum()))
    t.start()
    t.join()
    assert _taken(lambda: _compiled_backward(out[0])) == 0
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(np.arange(1.0, 4.0)))


def _dropped_graph_frees(end):
    """A forward whose graph ``end(h)`` makes from h = exp(x) is dropped without a
    backward: h's array goes at once (by reference counts alone)."""
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.ones((64, 64)), requires_grad=True)
    h = x.exp()
    watched = weakref.ref(h._data)
    graph = [end(h)]
    del h
    assert watched() is not None
    gc.disable()
    try:
        graph.clear()
        assert watched() is None
    finally:
        gc.enable()


def test_a_dropped_graph_frees_its_saved_values():
    """The segment holds the saved variables; when the forward's graph is dropped
    without a backward, they (and their arrays) go at once."""
    _dropped_graph_frees(lambda h: (h * 2).sin().sum())


def test_a_dropped_graph_ending_in_a_custom_function_frees_its_values():
    """The segment holds its custom Function nodes by weak reference: a graph whose
    newest node is one goes when it is dropped."""
    fn = _scaled_tanh(False)
    _dropped_graph_frees(lambda h: fn.apply(h, 2.0))


def test_the_segment_holds_no_array():
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.ones(8), requires_grad=True)
    loss = (x.exp() * 2).sum()
    segment = forward_key._local.segment
    assert segment.pure and segment.args.saved and not segment.args.inputs
    assert _taken(lambda: _compiled_backward(loss)) == 1


def test_the_forward_pays_nothing_until_compiled_autograd_is_used():
    import subprocess
    import sys
    code = ("import compiled_autograd as ca\n"
            "from compiled_autograd.autograd import dispatch\n"
            "print(dispatch.node_made is None)\n"
            "ca.compiled_backward(backend='python')\n"
            "print(dispatch.node_made is not None)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["True", "True"], done.stderr
    assert dispatch.node_made is forward_key.node_made      # (this process used it)


def test_the_key_hash_folds_its_items():
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.arange(1.0, 4.0), requires_grad=True)
    roots = ca.autograd.engine.make_root_grads([(x.exp() * 2).sum()], None, False)
    collected, key = forward_key.take(roots, None, True)
    walked = compiled_args.collect(ca.autograd.engine.make_task(roots, True, False), roots,
                                   record=False).freeze()
    assert key == walked and hash(key) == hash(walked) == fold_hash(KEY_SEED, tuple(key))
    assert all(a is b for a, b in zip(key, walked))      # interned: compared by identity
    assert Key(list(key)) == key


def test_fresh_leaves_whose_ids_are_reused(on_backend):
    """Leaf tensors made and dropped every step, of changing rank: a part kept for
    a dead tensor is never taken for a new one that got its id (once it was)."""
    ca.compiled_backward(backend="python")
    for i in range(40):
        x = ca.tensor(np.ones((2,) * (1 + i % 3)), requires_grad=True)
        _compiled_backward((x * 2).sum())
        _same(x.grad.numpy(), np.full(x.shape, 2.0))
        del x


def test_nodes_made_by_a_pack_hook_keep_the_order(on_backend):
    """A pack hook that computes with grad on makes nodes while a node saves its
    values, before that node reaches the segment: out of creation order, the
    segment spoils instead of keying the graph in another order (it once gave a
    wrong gradient on the cache hit)."""
    def run(compiled):
        x = ca.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
        w = ca.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
        stash, busy = [], [False]

        def pack(t):
            if not busy[0]:
                busy[0] = True
                stash.append(t * 3.0 if not stash else t.exp())
                busy[0] = False
            return t
        with ca.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = x * w
        loss = (y * stash[0] * stash[1]).sum()
        if compiled:
            _compiled_backward(loss)
        else:
            loss.backward()
        return x.grad.numpy(), w.grad.numpy()

    want = run(False)
    forward_key.check_key(False)        # (the wrong hit passed the walk's check too)
    for _ in range(3):
        got = run(True)
        _same(got[0], want[0])
        _same(got[1], want[1])


def test_kept_leaf_parts_hold_no_array():
    """What is kept of a leaf's part between backwards (per tensor, and per set
    of tensors) holds no array: a dropped model's parameters are freed."""
    ca.compiled_backward(backend="python")
    x = ca.tensor(np.ones((2, 8)))
    watched = []
    for _ in range(3):
        params = [ca.tensor(np.full((8, 8), 0.1), requires_grad=True) for _ in range(2)]
        for _ in range(2):
            h = x
            for p in params:
                h = (h @ p).tanh()
            _compiled_backward(h.sum())
        watched += [weakref.ref(p._data) for p in params]
        del p, params, h
    gc.collect()
    assert [r() for r in watched] == [None] * len(watched)
