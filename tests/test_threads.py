"""Backwards run from several threads at once, on every backend, with checkpointed
and offloaded models: each thread's gradients must be those of a run alone.

The interpreter is told to switch threads as often as it can, so that one thread's
backward is interrupted inside another's: in the cache hit's walks (the C walk calls
back into Python), in the unpack hooks (recomputation, reloading from disk) and in
the C backend's callbacks.
"""
import sys
import threading

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.autograd import engine
from compiled_autograd.examples import build
from helpers import BACKENDS

MODELS = [dict(layers=3, width=8, batch=4, checkpoint="layer"),
          dict(layers=4, width=6, batch=3),
          dict(layers=2, width=5, batch=2, checkpoint="sqrt"),
          dict(layers=3, width=7, batch=2, offload=True)]


def _backward(ex, backend):
    if backend == "eager":
        ex.loss().backward()
    else:
        with ca.compiled_backward(backend=backend):
            ex.loss().backward()
    return [p.grad.numpy().copy() for p in ex.parameters()]


@pytest.fixture
def switch_often():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_each_get_their_own_gradients(backend, switch_often):
    alone = [_backward(build("mlp", **sizes), "eager") for sizes in MODELS]
    # Built here, not in the threads: build() seeds and draws from ca's one global
    # RNG, so two threads building at once would interleave their draws.
    models = [build("mlp", **MODELS[i % len(MODELS)]) for i in range(2 * len(MODELS))]
    failures = {}

    def run(i):
        try:
            for _ in range(10):
                models[i].zero_grad()
                grads = _backward(models[i], backend)
                for g, expected in zip(grads, alone[i % len(MODELS)]):
                    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)
        except BaseException as e:     # noqa: BLE001 -- reported by the main thread
            failures[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(models))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_one_compiled_backward_shared_by_two_threads():
    """Leaving a compiled_backward on one thread ends it for that thread only (the
    engine's compiler stack is per thread): the thread that left runs eager, the
    other, still inside, runs compiled."""
    cb = ca.compiled_backward(backend="eager")
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with cb:
            a_in.set()
            b_in.wait()
        seen["a, after leaving"] = engine.current_compiler()
        a_out.set()

    def b():
        a_in.wait()
        with cb:
            b_in.set()
            a_out.wait()
            seen["b, still inside"] = engine.current_compiler()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a, after leaving": None, "b, still inside": cb}
