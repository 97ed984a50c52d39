"""Programs with callback sites (hooks, custom backwards run as Python, unpack
hooks) called by c_call.c's Runner against the same program on the Python path
(``CBackward._on_callback``, the runner off): the same gradients bit for bit,
the same order of everything user code sees, the same arrays alive at each
callback (released after their last use, not at the end), the same errors."""
import contextlib
import gc
import weakref

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen.c_run import C_CALL, CBackward
from compiled_autograd.autograd import Function
from compiled_autograd.compiled import cache
from compiled_autograd.examples import build
from helpers import TRANSFORMER, needs_cc

pytestmark = [needs_cc, pytest.mark.usefixtures("fresh_compiled_cache")]


@pytest.fixture(autouse=True)
def _runner_available():
    if not C_CALL.enabled():
        pytest.skip("CA_C_CALL=0")
    assert C_CALL.module() is not None, C_CALL.status()


def _fns():
    return [e.fn for family in cache.families.values() for _, _, e in family.entries]


def _on(python_path, run):
    """``run()`` compiled on "c" (twice: the first backward of a structure runs
    eagerly), with the runner or on the Python path; checks which one ran."""
    ca.reset_compiled_autograd()
    with C_CALL.disabled() if python_path else contextlib.nullcontext():
        with ca.compiled_backward(backend="c"):
            run()
            out = run()
    fns = [f for f in _fns() if isinstance(f, CBackward)]
    assert fns and all((f._runner is None) == python_path for f in fns)
    assert any(f.prog.sites for f in fns)
    return out


def _both(run):
    return _on(False, run), _on(True, run)


def _mlp_of_custom_tanh(log, layers=4):
    """A custom tanh MLP whose backward logs, at each call, which saved arrays
    of the earlier layers are still alive."""
    rng = np.random.default_rng(0)
    ws = [ca.tensor((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), requires_grad=True)
          for _ in range(layers)]
    x = ca.tensor(rng.standard_normal((4, 8)).astype(np.float32))
    alive = []

    class Tanh(Function):
        @staticmethod
        def forward(ctx, h):
            y = h.tanh()
            ctx.save_for_backward(y)
            ctx.layer = len(alive)
            alive.append(weakref.ref(y._data))
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            gc.collect()
            log.append((ctx.layer, tuple(r() is not None for r in alive)))
            return g * (1.0 - y * y)

    for w in ws:
        w.register_post_accumulate_grad_hook(lambda t, i=len(log): log.append(("acc", i)))

    def run():
        alive.clear()
        for w in ws:
            w.grad = None
        h = x
        for w in ws:
            h = Tanh.apply(h @ w)
        (h * h).mean().backward()
        return [w.grad.numpy().copy() for w in ws]
    return run


def test_custom_backwards_see_the_same_arrays_alive_and_the_same_order():
    logs = []

    def run_logged(python_path):
        log = []
        run = _mlp_of_custom_tanh(log)
        grads = _on(python_path, run)
        logs.append(log)
        return grads
    native, python = run_logged(False), run_logged(True)
    for a, b in zip(native, python):
        np.testing.assert_array_equal(a, b)
    assert logs[0] == logs[1]
    # the saved array of the layer done last is gone by the next backward (the
    # last layer's output is the test's own ``h``, which keeps it)
    calls = [entry for entry in logs[0] if entry[0] != "acc"][-4:]
    assert [layer for layer, _ in calls] == [3, 2, 1, 0]
    assert [alive[layer + 1] for layer, alive in calls if layer < 2] == [False, False]


def test_a_checkpointed_transformer_gives_the_python_paths_gradients():
    ex = build("transformer", checkpoint="layer", **TRANSFORMER)

    def run():
        for p in ex.parameters():
            p.grad = None
        ex.loss().backward()
        return [p.grad.numpy().copy() for p in ex.parameters()]
    native, python = _both(run)
    for a, b in zip(native, python):
        np.testing.assert_array_equal(a, b)


def _hooked(log, hook_result=None):
    x = ca.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), requires_grad=True)
    w = ca.tensor(np.linspace(0, 2, 16, dtype=np.float32).reshape(4, 4), requires_grad=True)

    def run():
        x.grad = w.grad = None
        h = x @ w
        y = h.tanh()
        h.register_hook(lambda g: log.append("h") or hook_result and hook_result(g))
        y.grad_fn.register_prehook(lambda g: log.append("pre"))
        y.grad_fn.register_hook(lambda gi, go: log.append("post"))
        w.register_post_accumulate_grad_hook(lambda t: log.append(("w", float(t.grad.sum()))))
        (y * y).sum().backward()
        return x.grad.numpy().copy(), w.grad.numpy().copy()
    return run


def test_hooks_run_in_the_same_order_with_the_same_gradients():
    logs = [[], []]
    native = _on(False, _hooked(logs[0]))
    python = _on(True, _hooked(logs[1]))
    for a, b in zip(native, python):
        np.testing.assert_array_equal(a, b)
    assert logs[0] == logs[1] and "pre" in logs[0] and logs[0][-1][0] == "w"


def test_a_hook_result_in_another_layout_is_copied_into_the_compiled_one():
    def fortran(g):
        return ca.from_numpy(np.asfortranarray(g.numpy() * 2))
    plain = _on(False, _hooked([], lambda g: g * 2))
    for python_path in (False, True):
        relaid = _on(python_path, _hooked([], fortran))
        for a, b in zip(plain, relaid):
            np.testing.assert_array_equal(a, b)


def _failing(kind):
    rng = np.random.default_rng(1)
    x = ca.tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)

    class Bad(Function):
        @staticmethod
        def forward(ctx, h):
            ctx.save_for_backward(h)
            return h * 2

        @staticmethod
        def backward(ctx, g):
            if ctx.fail:
                if kind == "raises":
                    raise ValueError("the user's backward failed")
                if kind == "shape":
                    return g[:1] * 2
                if kind == "interrupt":
                    raise KeyboardInterrupt
            return g * 2

    def run(fail):
        x.grad = None
        y = Bad.apply(x * 1.5)
        y.grad_fn.fail = fail
        (y * y).sum().backward()
        return x.grad.numpy().copy()
    return run


@pytest.mark.parametrize("kind,error,match", [
    ("raises", ValueError, "the user's backward failed"),
    ("shape", RuntimeError, "invalid gradient at index 0"),
    ("interrupt", KeyboardInterrupt, None)])
def test_a_failing_backward_raises_the_python_paths_error_and_the_next_one_runs(kind, error,
                                                                                 match):
    outcomes = []
    for python_path in (False, True):
        run = _failing(kind)
        ca.reset_compiled_autograd()
        with C_CALL.disabled() if python_path else contextlib.nullcontext():
            with ca.compiled_backward(backend="c"):
                good = run(False)
                run(False)                       # compiled (the first ran eagerly)
                with pytest.raises(error, match=match) as caught:
                    run(True)
                np.testing.assert_array_equal(run(False), good)   # and it still works
        assert all((f._runner is None) == python_path for f in _fns()
                   if isinstance(f, CBackward))
        outcomes.append((caught.type, str(caught.value)))
    assert outcomes[0] == outcomes[1]


def test_a_backward_that_runs_a_compiled_backward_inside_nests():
    """A custom backward that itself runs a compiled "c" backward (with a
    callback of its own): the inner call's callbacks reach the inner call."""
    rng = np.random.default_rng(2)
    x = ca.tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    inner_w = ca.tensor(rng.standard_normal((4, 4)).astype(np.float32), requires_grad=True)
    inner_log = []

    class Outer(Function):
        @staticmethod
        def forward(ctx, h):
            ctx.save_for_backward(h)
            return h.sin()

        @staticmethod
        def backward(ctx, g):
            (h,) = ctx.saved_tensors
            with ca.enable_grad():       # (a backward runs without grad mode)
                z = (ca.tensor(h.detach().numpy()) @ inner_w).tanh()
                z.register_hook(lambda t: inner_log.append("inner"))
                with ca.compiled_backward(backend="c"):
                    z.sum().backward()
            return g * h.cos()

    def run():
        x.grad = inner_w.grad = None
        Outer.apply(x * 2.0).sum().backward()
        return x.grad.numpy().copy(), inner_w.grad.numpy().copy()
    native, python = _both(run)
    for a, b in zip(native, python):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(native[0], 2 * np.cos(2 * x.detach().numpy()), rtol=1e-6)
    assert inner_log and set(inner_log) == {"inner"}


@pytest.mark.parametrize("site", [
    (None, ((0, 5),), (), (), ()),               # flush past the accumulations
    (None, ((2, 0),), (), (), ()),               # release of an array there is none of
    (print, (), (), ((1, 3),), ()),              # an argument from a ref slot past the refs
    (print, (), (), ((3, 3, 0, 0, ((2,), 11), (4,), True),), ()),   # a view on a block
    (print, (), (), (), ((-1, 0, ((2,), 11), (4,)),)),              # a result with no ext
])
def test_a_site_spec_out_of_range_is_refused_when_the_runner_is_made(site):
    with pytest.raises(ValueError, match="out of range"):
        C_CALL.module().Runner(fn=1, refs=(), inputs=(), outputs=(), accumulations=(),
                               results=(), arena_bytes=0, errors=(), accumulate=print,
                               fix_input=print, sites=(site,))
