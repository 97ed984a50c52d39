"""Tests ported from PyTorch's test/test_autograd.py (second half of the file), part 3:
TestMultithreadAutograd, backwards from several Python threads at once, on the eager
engine and under every compiled backend (each thread enters ``under(mode)`` itself).
"""
import sys
import threading

import numpy as np
import pytest

import compiled_autograd as ca
from ported import mode, under  # noqa: F401  (mode is a fixture)


@pytest.fixture(autouse=True)
def switch_often():
    """Threads switch as often as the interpreter allows, so that backwards interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def run_py_multithread_fn(fn, args=(), num_threads=10):
    failures = []

    def target(*a):
        try:
            fn(*a)
        except BaseException as e:     # noqa: BLE001 -- re-raised by the main thread
            failures.append(e)

    threads = []
    for _ in range(num_threads):
        p = threading.Thread(target=target, args=args)
        p.start()
        threads.append(p)

    for p in threads:
        p.join()
    if failures:
        raise failures[0]


# torch: test_autograd.py::TestMultithreadAutograd::test_simple_backward
def test_simple_backward(mode):
    # simple multithreaded backward that create threads in the beginning of training
    # and everything else is training separately, i.e. inputs, operations, etc.
    def train_fn():
        x = ca.ones(5, 5, requires_grad=True)
        y = (x + 3) * (x + 4) * 0.5
        with under(mode):
            y.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), (x + 3.5).detach().numpy())

    run_py_multithread_fn(train_fn)


# torch: test_autograd.py::TestMultithreadAutograd::test_simple_backward_same_input
def test_simple_backward_same_input(mode):
    # (its two halves in the other order here, so that the grad() one comes first)
    x = ca.ones(5, 5, requires_grad=True)

    def train_fn_grad(x):
        y = (x + 3) * (x + 4) * 0.5
        with under(mode):
            grads = ca.autograd.grad(y.sum(), x)
        assert len(grads) == 1
        np.testing.assert_allclose(grads[0].numpy(), (x + 3.5).detach().numpy())

    # since we use functional grad() api, gradients will not
    # be accumulate to the same place and should be the same
    run_py_multithread_fn(train_fn_grad, (x,))

    # simple multithreaded backward with only shared inputs (i.e. This is common
    # for things like Hogwild multithreaded training with multiple CPU threads)
    def train_fn_backward(x):
        y = (x + 3) * (x + 4) * 0.5
        with under(mode):
            y.sum().backward()

    run_py_multithread_fn(train_fn_backward, (x,))
    # Since we are calling backward from multiple threads
    # and all threads share the same input, when we do backward
    # concurrently, different backwards will all accumulate to
    # the same .grad for each input, and the gradients should
    # be equal to num_threads * gradient
    np.testing.assert_allclose(x.grad.numpy(), 10 * (x + 3.5).detach().numpy())


# torch: test_autograd.py::TestMultithreadAutograd::test_python_thread_in_middle
def test_python_thread_in_middle(mode):
    # User might write a network that starts on one CPU thread, then runs its second half
    # concurrently with other threads (either via python threading or fork/join calls),
    # then calls backward()/grad() on BOTH threads, like a Y pattern from input at the
    # bottom to output at the top. This way part of the GraphTask is being shared across
    # different threads and we need to ensure user specify retain_graph=True, otherwise
    # error out with the correct error message

    # Case 1: multiple backward with python threads, retain_graph=False
    # should throw error in some threads with no retain_graph.
    success_vs_raises = [0, 0]
    messages = []

    def train_fn_no_retain_graph(x):
        y = x + x ** 2
        try:
            with under(mode):
                y.sum().backward()
            success_vs_raises[0] += 1
        except RuntimeError as error:
            success_vs_raises[1] += 1
            messages.append(str(error))

    x_no_retain = ca.ones(5, 5, requires_grad=True)
    y_no_retain = x_no_retain + x_no_retain ** 2
    run_py_multithread_fn(train_fn_no_retain_graph, (y_no_retain,), num_threads=5)
    # at least one thread will be success in this case, all other threads should raise
    # with the error that throw to user to recommend them specify retain_graph=True
    assert success_vs_raises[0] >= 1
    assert all("Specify retain_graph=True" in m for m in messages), messages

    # multiple backward with python threads, no error with retain_graph=True
    def train_fn_retain_graph(x):
        y = x + x ** 2
        with under(mode):
            y.sum().backward(retain_graph=True)

    x_retain = ca.ones(5, 5, requires_grad=True)
    y_retain = x_retain + x_retain ** 2
    run_py_multithread_fn(train_fn_retain_graph, (y_retain,), num_threads=5)
    # result should equal to num_thread * gradients
    xr = x_retain.detach().numpy()
    np.testing.assert_allclose(x_retain.grad.numpy(),
                               5 * (4 * xr ** 3 + 6 * (xr ** 2) + 4 * xr + 1))
