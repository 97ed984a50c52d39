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


def test_threads_sharing_a_fresh_leaf_get_one_accumulate_grad_and_lose_no_gradient(
        switch_often):
    """Threads start at a barrier on a leaf with no AccumulateGrad node and no .grad
    yet: they must all find the one node (torch makes it under the leaf's lock) and
    all their gradients must be summed (accumulation takes the leaf's lock). Without
    the locks, some of the 300 rounds give two nodes (grad() then says the leaf
    "appears to not have been used") and lose a gradient: each does in about 1 round
    in 50 here, so this test fails without them in all but about 1 run in 500."""
    nthreads, rounds_with_two_nodes, rounds_with_lost_grad = 6, 0, 0
    for _ in range(300):
        x = ca.ones(3, requires_grad=True)
        barrier = threading.Barrier(nthreads)
        errors, nodes = [], []

        def work():
            barrier.wait()
            y = x * 2                       # each thread asks for x's AccumulateGrad
            nodes.append(y.grad_fn.next_functions[0][0])
            try:
                ca.autograd.grad(y.sum(), x, retain_graph=True)
            except RuntimeError as e:
                errors.append(e)
            y.sum().backward()              # each thread accumulates into x.grad

        threads = [threading.Thread(target=work) for _ in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rounds_with_two_nodes += len({id(n) for n in nodes}) > 1 or bool(errors)
        rounds_with_lost_grad += not np.array_equal(x.grad.numpy(),
                                                    np.full(3, 2.0 * nthreads))
    assert (rounds_with_two_nodes, rounds_with_lost_grad) == (0, 0)
