"""The cache hit's C walks (compiled_autograd/native_walk.c) against the Python
walks they mirror. Every scenario of test_compiled.py runs again here, on the
"python" backend (and those of test_dynamic_shapes.py, on theirs), with each
cache-hit collection done both ways and compared: the graph task (nodes, ranks,
edges) and every collected list, by value for the key and sizes and by identity
for the runtime values; an error must be the same error."""

import numpy as np
import pytest

import compiled_autograd as ca
import test_compiled
from compiled_autograd.compiled import api as compiled
from compiled_autograd.compiled import cache
from compiled_autograd.autograd import engine
from compiled_autograd.compiled import native_walk
from compiled_autograd.compiled import compiled_args
from compiled_autograd.examples import build
from helpers import needs_cc
from test_compiled import *  # noqa: F401,F403  (the scenarios, collected again here)
from test_dynamic_shapes import *  # noqa: F401,F403  (and the dynamic-shape ones)

# (The imported tests' own pytestmark is replaced by this one: keep their fixture.)
pytestmark = [needs_cc, pytest.mark.usefixtures("fresh_compiled_cache")]


@pytest.fixture(autouse=True, params=["python"])
def backend(request):
    """Overrides test_compiled's: one backend is enough to exercise the walks."""
    test_compiled.BACKEND = request.param
    yield request.param
    test_compiled.BACKEND = "eager"


class _Walks:
    compared = 0


def _outcome(prepare, *args):
    try:
        return prepare(*args, record=False)
    except Exception as e:      # noqa: BLE001 -- compared, then raised again
        return e


def assert_same_walk(py, c):
    if isinstance(py, Exception) or isinstance(c, Exception):
        assert type(py) is type(c) and str(py) == str(c), (py, c)
        return
    (task_p, col_p, key_p), (task_c, col_c, key_c) = py, c
    assert len(task_p.nodes) == len(task_c.nodes)
    assert all(a is b for a, b in zip(task_p.nodes, task_c.nodes))
    assert all(a is b for a, b in zip(task_p._ranked, task_c._ranked))
    assert task_p.index == task_c.index
    assert [tuple(e) for e in task_p.edges] == [tuple(e) for e in task_c.edges]
    assert key_p == key_c
    assert hash(key_c) == tuple.__hash__(key_c) == hash(key_p)
    walk = native_walk.loaded()             # (none in the no-compiler test)
    assert walk is None or walk.key_hash(key_c) == tuple.__hash__(key_c)
    assert col_p.sizes == col_c.sizes and col_p.scalars == col_c.scalars
    for field in ("saved", "inputs", "hooks", "packed_data", "release_nodes"):
        ours, theirs = getattr(col_p, field), getattr(col_c, field)
        assert len(ours) == len(theirs), field
        assert all(a is b for a, b in zip(ours, theirs)), field
    assert col_p.uncacheable_reason == col_c.uncacheable_reason


@pytest.fixture(autouse=True)
def both_walks(monkeypatch):
    """Every cache-hit collection (compiled._prepare with record=False) runs the
    Python walks and the C walks and compares them; the C result is used."""
    if not native_walk.enabled():
        pytest.skip("CA_NATIVE_WALK=0")
    assert native_walk.module() is not None, native_walk.status()
    real = compiled._prepare

    def checked(roots, input_edges, accumulate, record=True):
        if record:
            return real(roots, input_edges, accumulate, record)
        with native_walk.disabled():
            py = _outcome(real, roots, input_edges, accumulate)
        c = _outcome(real, roots, input_edges, accumulate)
        assert_same_walk(py, c)
        _Walks.compared += 1
        if isinstance(c, Exception):
            raise c
        return c
    monkeypatch.setattr(compiled, "_prepare", checked)
    yield


@pytest.mark.parametrize("name,kw", [
    ("mlp", dict(layers=3, width=8, batch=4)),
    ("transformer", dict(layers=2, d_model=16, heads=2, seq=4, batch=2, vocab=20)),
    ("transformer", dict(layers=2, d_model=16, heads=2, seq=4, batch=2, vocab=20,
                         checkpoint="layer")),
    ("mlp", dict(layers=3, width=8, batch=4, offload=True)),
])
def test_the_c_walk_collects_what_the_python_walk_does(name, kw):
    ex = build(name, **kw)
    with ca.compiled_backward(backend="python"):
        ex.loss().backward()                 # a miss: traced
    before = _Walks.compared
    roots = engine.make_root_grads([ex.loss()], None, False)
    with native_walk.disabled():
        py = _prepare_plain(roots)
    c = _prepare_plain(roots, native=True)
    assert_same_walk(py, c)
    assert c[1].saved and c[1].inputs     # the C path collected real values
    with ca.compiled_backward(backend="python"):
        ex.loss().backward()                 # a hit, compared by the fixture
    assert _Walks.compared > before


def _chain_loss(x, n):
    h = x
    for i in range(n):
        h = h * 1.001 if i % 2 else h.sin()
    return h.sum()


def test_a_hit_key_is_the_stored_key_item_for_item():
    """The shared tuples are found again exactly: the key stored at the miss and a
    later hit's key hold the same objects (all but the per-hit roots and sizes), so
    the cache lookup compares them by identity."""
    x = ca.tensor(np.arange(1.0, 17.0, dtype=np.float32), requires_grad=True)
    ca.reset_compiled_autograd()
    native_walk.module().clear_shared()    # not emptied (when half full) in between
    with ca.compiled_backward(backend="python"):
        _chain_loss(x, 200).backward()
    (stored,) = [k[-1] for k in cache.families]
    roots = engine.make_root_grads([_chain_loss(x, 200)], None, False)
    key = _prepare_plain(roots, native=True)[2]
    assert key == stored
    different = [a for a, b in zip(stored, key) if a is not b]
    assert [item[0] for item in different] == ["roots", "sizes"]


def test_more_shared_tuples_than_the_table_keeps():
    """A graph with more distinct key tuples than the table holds (16384) empties
    it mid-walk: the keys stay equal, hash alike, and the backward is right."""
    x = ca.tensor(np.linspace(0.1, 0.2, 4), requires_grad=True)
    ca.reset_compiled_autograd()
    grads = []
    for _ in range(2):
        x.grad = None
        with ca.compiled_backward(backend="python"):
            _chain_loss(x, 9000).backward()     # two new tuples per node
        grads.append(x.grad.numpy().copy())
    assert ca.compiled_autograd_stats()["cache_hits"] == 1
    roots = engine.make_root_grads([_chain_loss(x, 9000)], None, False)
    tuples = set()

    def walk(t):
        if isinstance(t, tuple) and id(t) not in tuples:
            tuples.add(id(t))
            for item in t:
                walk(item)
    walk(_prepare_plain(roots, native=True)[2])
    assert len(tuples) > native_walk.module().SHARED_TUPLE_LIMIT   # so it was emptied
    x.grad = None
    _chain_loss(x, 9000).backward()
    np.testing.assert_allclose(grads[0], x.grad.numpy(), rtol=1e-12)
    np.testing.assert_array_equal(grads[0], grads[1])


def _prepare_plain(roots, native=False):
    discover = native_walk.module().discover if native else None
    task = engine.make_task(roots, keep_graph=True, create_graph=False, discover=discover)
    collected = compiled_args.collect(task, roots, record=False)
    return task, collected, collected.freeze()


def test_freed_and_modified_saved_values_fail_the_same_way():
    x = ca.tensor(np.arange(1.0, 5.0), requires_grad=True)
    with ca.compiled_backward(backend="python"):
        (x.exp() * 2).sum().backward()
        y = (x.exp() * 2).sum()
        y.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.backward()                     # the fixture compared the two errors
    with ca.compiled_backward(backend="python"):
        a = x * 1.0
        b = a.sin()
        a.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            b.sum().backward()


def test_without_a_compiler_the_python_walk_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-for-the-walk")
    monkeypatch.setenv("CA_CACHE_DIR", str(tmp_path))
    native_walk.reset()
    try:
        assert native_walk.module() is None
        assert native_walk.status().startswith("python: the C walk could not be built"), \
            native_walk.status()
        assert "no-such-compiler-for-the-walk" in native_walk.status()
        x = ca.tensor(np.arange(1.0, 5.0), requires_grad=True)
        for _ in range(2):
            with ca.compiled_backward(backend="python"):
                (x * x).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), 4 * np.arange(1.0, 5.0))
    finally:
        monkeypatch.undo()
        native_walk.reset()
    assert native_walk.status().startswith("native: ")


def test_ca_native_walk_0_turns_it_off():
    from helpers import status_with
    assert (status_with("CA_NATIVE_WALK", "compiled_autograd.compiled", "native_walk")
            == "None python: disabled by CA_NATIVE_WALK=0")
    with native_walk.disabled():
        assert native_walk.module() is None
    assert native_walk.module() is not None


def test_the_walk_compiles_without_warnings(tmp_path):
    import subprocess

    from runtime import cbuild
    src = tmp_path / "walk.c"
    src.write_text(native_walk.source())
    done = subprocess.run(cbuild.extension_command(str(src), str(tmp_path / "walk.so")),
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_a_changed_class_is_read_anew(monkeypatch):
    """The C walk reads __slots__ members at offsets kept per type; a type changed
    since (here a member replaced by a property) must be read through Python."""
    from compiled_autograd.autograd.node import SavedVariable
    x = ca.tensor(np.arange(1.0, 5.0), requires_grad=True)
    for _ in range(2):                        # a miss, then a hit: the offsets are kept
        with ca.compiled_backward(backend="python"):
            (x.exp() * 2).sum().backward()
    loss = (x.exp() * 2).sum()
    monkeypatch.setattr(SavedVariable, "released", property(lambda self: True))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        with ca.compiled_backward(backend="python"):
            loss.backward()


def test_a_borrowed_slot_descriptor_is_refused_as_python_does():
    """A class holding another class's member descriptor: getattr raises, and the
    C walk's offset reads must not read the other layout (it once crashed)."""
    from compiled_autograd.autograd.node import Node

    class Plain:
        next_functions = Node.__dict__["next_functions"]
    with pytest.raises(TypeError) as python_error:
        Plain().next_functions
    with pytest.raises(TypeError) as c_error:
        native_walk.module().discover([Plain()], {}, [], [], [])
    assert str(c_error.value) == str(python_error.value)
