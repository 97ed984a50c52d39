"""The C backend's call in C (codegen/c_call.c's Runner) against its Python path
(CBackward.__call__ with the runner off): same gradients bit for bit, same
errors, same ownership of the boxed values; and which programs use it."""
import contextlib
import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen.c_run import C_CALL, CBackward
from compiled_autograd.compiled import api as compiled
from compiled_autograd.compiled import cache
from compiled_autograd.autograd import engine
from compiled_autograd.examples import build
from helpers import MLP, TRANSFORMER, needs_cc, status_with

pytestmark = [needs_cc, pytest.mark.usefixtures("fresh_compiled_cache")]

nn = ca.nn
F = nn.functional


@pytest.fixture(autouse=True)
def _runner_available():
    if not C_CALL.enabled():
        pytest.skip("CA_C_CALL=0")
    # with a compiler (needs_cc) it must build: a file left out of the installed
    # package, or a compile error, fails here rather than skipping
    assert C_CALL.module() is not None, C_CALL.status()


def _compiled_fn():
    """The CBackward of the one entry in the compiled cache."""
    fns = _compiled_fns()
    assert len(fns) == 1 and isinstance(fns[0], CBackward), fns
    return fns[0]


def _compiled_fns():
    return [entry.fn for family in cache.families.values() for _, _, entry in family.entries]


def _grads_of(make_loss, params, python_path):
    ca.reset_compiled_autograd()
    for p in params:
        p.grad = None
    with C_CALL.disabled() if python_path else contextlib.nullcontext():
        with ca.compiled_backward(backend="c"):
            make_loss().backward()
    fn = _compiled_fn()
    assert (fn._runner is None) == python_path
    return [p.grad.numpy().copy() for p in params]


def _example(name, **sizes):
    ex = build(name, **sizes)
    return ex.loss, ex.parameters()


def _mixed_leaves():
    """float64 leaves, one used twice, one whose gradient is a broadcast sum."""
    rng = np.random.default_rng(3)
    a = ca.tensor(rng.standard_normal((3, 4)), dtype=np.float64, requires_grad=True)
    b = ca.tensor(rng.standard_normal(4), dtype=np.float64, requires_grad=True)

    def loss():
        h = (a * b).tanh() + a.exp() * 0.5
        return (h * h).sum() + b.sin().sum()
    return loss, [a, b]


CASES = {
    "mlp": lambda: _example("mlp", **MLP),
    "transformer": lambda: _example("transformer", **TRANSFORMER),
    "mlp_float64": lambda: _example("mlp", dtype=np.float64, **MLP),
    "mixed_leaves": _mixed_leaves,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_runner_gives_the_python_paths_gradients_bit_for_bit(case):
    try:
        make_loss, params = CASES[case]()
    except TypeError as e:      # an example without that option
        pytest.skip(str(e))
    eager = []
    for p in params:
        p.grad = None
    make_loss().backward()
    eager = [p.grad.numpy().copy() for p in params]
    native = _grads_of(make_loss, params, python_path=False)
    python = _grads_of(make_loss, params, python_path=True)
    for n, p, e in zip(native, python, eager):
        assert n.dtype == e.dtype and n.shape == e.shape
        np.testing.assert_array_equal(n, p)
        rtol = 1e-10 if n.dtype == np.float64 else 1e-5
        np.testing.assert_allclose(n, e, rtol=rtol, atol=rtol)


def test_grads_accumulate_and_autograd_grad_returns_values():
    make_loss, params = _mixed_leaves()
    for p in params:
        p.grad = None
    make_loss().backward()
    make_loss().backward()
    twice = [p.grad.numpy().copy() for p in params]
    grad_eager = ca.autograd.grad(make_loss(), params)
    for p in params:
        p.grad = None
    with ca.compiled_backward(backend="c"):
        make_loss().backward()
        held = [p.grad for p in params]
        make_loss().backward()        # added in place: .grad stays the same tensor
        grad_c = ca.autograd.grad(make_loss(), params)
    assert all(p.grad is h for p, h in zip(params, held))
    for p, t in zip(params, twice):
        np.testing.assert_allclose(p.grad.numpy(), t, rtol=1e-10)
    for g, e in zip(grad_c, grad_eager):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-10)
    runners = [fn._runner for fn in _compiled_fns()]
    assert len(runners) == 2 and all(r is not None for r in runners)


def test_programs_with_callbacks_use_the_runner_and_dynamic_sizes_the_python_path():
    ex = build("transformer", checkpoint="layer", **TRANSFORMER)   # unpack hooks
    with ca.compiled_backward(backend="c"):
        ex.loss().backward()
    fn = _compiled_fn()
    assert fn.prog.sites and fn._runner is not None
    ca.reset_compiled_autograd()
    ex = build("mlp", **MLP)
    with ca.compiled_backward(backend="c", dynamic=True):
        ex.loss().backward()
    assert _compiled_fn()._runner is None


def test_memory_profiling_takes_the_python_path(monkeypatch):
    ex = build("mlp", **MLP)
    with ca.compiled_backward(backend="c"):
        ex.loss().backward()
    fn = _compiled_fn()
    calls = []
    monkeypatch.setattr(fn, "_runner", lambda *a: calls.append(a))
    with ca.memory.profile() as prof:
        with ca.compiled_backward(backend="c"):
            ex.loss().backward()
    assert calls == [] and prof.peak_bytes > 0


def test_the_boxed_values_are_freed_and_nothing_leaks():
    ex = build("mlp", **MLP)
    with ca.compiled_backward(backend="c"):
        ex.loss().backward()           # the miss: compiles
    fn = _compiled_fn()
    assert fn._runner is not None
    compiled_fn = weakref.ref(fn)
    del fn
    for p in ex.parameters():
        p.grad = None
    loss = ex.loss()
    saved = [weakref.ref(sv._data) for fn in _autograd_nodes(loss)
             for sv in getattr(fn, "saved", ()) if getattr(sv, "_data", None) is not None]
    assert saved
    with ca.compiled_backward(backend="c"):
        loss.backward()
    del loss
    gc.collect()
    assert all(r() is None for r in saved)
    # each gradient array is held by its .grad tensor only (getrefcount's argument is
    # the other reference; counted outside the assert, which would hold one more)
    counts = [sys.getrefcount(p.grad._data) for p in ex.parameters()]
    assert counts == [2] * len(counts)
    # and the compiled function (its runner, whose fix_input reaches it) is freed
    # once the cache lets it go
    ca.reset_compiled_autograd()
    gc.collect()
    assert compiled_fn() is None


def _autograd_nodes(loss):
    seen, stack = [], [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or any(fn is s for s in seen):
            continue
        seen.append(fn)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return seen


# ---------------------------------------------------------------- direct calls: odd inputs

def _boxed(loss):
    """(the CBackward, its boxed arguments) of a cache hit, as compiled.run makes them."""
    options = ca.compiled_backward(backend="c")
    roots = engine.make_root_grads([loss], None, False)
    task, collected, entry = compiled.lookup(roots, None, True, options)
    inputs = [g for _, g in roots] + collected.runtime_inputs(False) + list(entry.constants)
    return entry.fn, [inputs, collected.sizes, collected.scalars, collected.hooks,
                      collected.packed_data]


def _call_both(make_loss, change):
    """Call the compiled function twice on the same boxed arguments, changed by
    ``change(fn, inputs)``: with the runner, then on the Python path. Returns the
    two outcomes: the gradients, or the error's type and message."""
    outcomes = []
    for python_path in (False, True):
        ca.reset_compiled_autograd()
        with C_CALL.disabled() if python_path else contextlib.nullcontext():
            fn, args = _boxed(make_loss())
        assert (fn._runner is None) == python_path
        change(fn, args[0])
        try:
            fn(*args)
            outcomes.append(("ok",))
        except Exception as e:  # noqa: BLE001 -- compared between the two paths
            outcomes.append((type(e), str(e)))
    return outcomes


def _first_2d_input(fn, inputs):
    for i, storage in fn.prog.inputs:
        if len(storage.shape) == 2 and isinstance(inputs[i], np.ndarray):
            return i
    raise AssertionError("no 2-d array input")


def test_a_relaid_input_is_copied_into_the_traced_layout():
    ex = build("mlp", **MLP)
    results = {}

    def fortran_order(fn, inputs):
        i = _first_2d_input(fn, inputs)
        inputs[i] = np.asfortranarray(inputs[i])

    for label, change in (("plain", lambda fn, inputs: None), ("relaid", fortran_order)):
        for p in ex.parameters():
            p.grad = None
        assert _call_both(ex.loss, change) == [("ok",), ("ok",)]
        results[label] = [p.grad.numpy().copy() for p in ex.parameters()]
    for a, b in zip(results["plain"], results["relaid"]):
        np.testing.assert_array_equal(a, b)


def _attention_scores():
    """A loss whose matmul saves strided views of one projection (attention's q
    and k^T), as (make_loss, params)."""
    rng = np.random.default_rng(0)
    qk = ca.tensor(rng.standard_normal((2, 6, 16)).astype(np.float32), requires_grad=True)

    def make_loss():
        q, k = qk.chunk(2, -1)
        q, k = (z.reshape(2, 6, 2, 4).transpose(1, 2) for z in (q, k))
        return (q @ k.transpose(-2, -1)).tanh().sum()
    return make_loss, [qk]


def test_saved_views_are_read_in_place_in_their_layout(monkeypatch):
    make_loss, params = _attention_scores()
    for p in params:
        p.grad = None
    make_loss().backward()
    eager = [p.grad.numpy().copy() for p in params]
    native = _grads_of(make_loss, params, python_path=False)
    fn = _compiled_fn()
    strided = [s for _, s in fn.prog.inputs if s.strides != tuple(
        int(np.prod(s.shape[d + 1:])) for d in range(len(s.shape)))]
    assert len(strided) == 2, [s.strides for _, s in fn.prog.inputs]
    copies = []
    checked = CBackward._checked
    monkeypatch.setattr(CBackward, "_checked", staticmethod(
        lambda *a: copies.append(a[-1]) or checked(*a)))
    for python_path in (False, True):
        for p in params:
            p.grad = None
        with C_CALL.disabled() if python_path else contextlib.nullcontext():
            with ca.compiled_backward(backend="c"):
                make_loss().backward()       # a cache hit on each path
        assert copies == [] and compiled.stats["compiles"] == 1
        np.testing.assert_array_equal(params[0].grad.numpy(), native[0])
    np.testing.assert_allclose(native[0], eager[0], rtol=1e-5, atol=1e-6)
    assert _grads_of(make_loss, params, python_path=True)[0].tobytes() == native[0].tobytes()


def test_a_saved_view_given_in_another_layout_is_copied_into_the_traced_one():
    """The key holds no strides: a hit whose saved value comes contiguous (or in
    any other layout) is copied into the strided layout the C reads."""
    make_loss, params = _attention_scores()
    results = {}

    def contiguous(fn, inputs):
        for i, storage in fn.prog.inputs:
            if isinstance(inputs[i], np.ndarray) and not inputs[i].flags.c_contiguous:
                inputs[i] = np.ascontiguousarray(inputs[i])

    for label, change in (("plain", lambda fn, inputs: None), ("contiguous", contiguous)):
        for p in params:
            p.grad = None
        assert _call_both(make_loss, change) == [("ok",), ("ok",)]
        results[label] = params[0].grad.numpy().copy()
    np.testing.assert_array_equal(results["plain"], results["contiguous"])


def test_only_a_non_overlapping_layout_is_recorded_for_a_saved_value():
    from compiled_autograd.compiled.tracer import _plain_strides
    a = np.zeros((4, 6), np.float32)
    assert _plain_strides(a, a.shape) is None                    # contiguous: the default
    assert _plain_strides(a.T, a.T.shape) == (1, 6)              # transposed
    assert _plain_strides(a[:, :3], (4, 3)) == (6, 1)            # a slice of rows
    assert _plain_strides(np.broadcast_to(a[:1], (4, 6)), (4, 6)) is None   # repeats
    assert _plain_strides(a[::-1], a.shape) is None              # negative stride
    assert _plain_strides(a.T, (6, object())) is None             # a size not static


def test_a_wrong_input_gives_the_python_paths_error():
    ex = build("mlp", **MLP)

    def wrong_shape(fn, inputs):
        i = _first_2d_input(fn, inputs)
        inputs[i] = inputs[i][:1]

    def not_an_array(fn, inputs):
        inputs[_first_2d_input(fn, inputs)] = "not an array"

    def too_few(fn, inputs):
        del inputs[max(i for i, _ in fn.prog.inputs):]

    for change, error, message in (
            (wrong_shape, RuntimeError, "but the backward was compiled for"),
            (not_an_array, RuntimeError, "gave str, expected an array"),
            (too_few, IndexError, "list index out of range")):
        native, python = _call_both(ex.loss, change)
        assert native == python and native[0] is error and message in native[1], native


def test_an_error_the_c_detects_gives_the_python_paths_error():
    """A gather index out of range, found by the generated C (a negative return code)."""
    rng = np.random.default_rng(0)
    logits = ca.tensor(rng.standard_normal((4, 5)).astype(np.float32), requires_grad=True)
    target = ca.tensor(np.array([1, 0, 4, 2]))

    def change(fn, inputs):
        for i, storage in fn.prog.inputs:
            if np.issubdtype(storage.dtype, np.integer):
                inputs[i] = np.full_like(inputs[i], 7)
                return
        raise AssertionError("no index input")

    native, python = _call_both(lambda: F.cross_entropy(logits, target), change)
    assert native == python and native[0] is RuntimeError, native
    assert native[1].startswith("compiled C backward: index out of bounds"), native


# ---------------------------------------------------------------- building it

def test_the_call_compiles_without_warnings(tmp_path):
    from compiled_autograd.runtime import cbuild
    src = tmp_path / "call.c"
    src.write_text(C_CALL.source())
    done = subprocess.run(cbuild.extension_command(str(src), str(tmp_path / "call.so"),
                                                   [np.get_include()]),
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_switched_off_by_its_environment_variable():
    assert status_with("CA_C_CALL", "compiled_autograd.codegen.c_run", "C_CALL") == \
        "None python: disabled by CA_C_CALL=0"
