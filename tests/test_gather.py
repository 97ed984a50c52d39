"""Tensor.gather / ca.gather (torch.gather), and gather's gradient: with one
index per line along the dim (a class target, an argmax) it is a select of g
at the index, computed inside its users' loops by the C backend, not zeros
written and then scattered into; otherwise scatter_add's. Every backend gives
eager's gradient; the index is checked where scatter_add checked it."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.autograd.gradcheck import gradcheck
from compiled_autograd.runtime.prims import ops
from helpers import needs_cc, needs_torch, torch

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")
F = ca.nn.functional

# (input shape, dim, index shape): one per line, several per line, a smaller index
CASES = [((4, 6), 1, (4, 1)), ((5, 3), 0, (1, 3)), ((2, 3, 4), 2, (2, 3, 1)),
         ((4, 6), 1, (4, 3)), ((4, 3), 0, (2, 2)), ((3, 5), -1, (3, 2))]


def _index(shape, dim, idx_shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, shape[dim], size=idx_shape)


def _grad(shape, dim, idx, backend, dtype=np.float64):
    x = ca.tensor(np.linspace(-1, 1, int(np.prod(shape))).reshape(shape), dtype=dtype,
                  requires_grad=True)
    w = ca.tensor(np.arange(1, idx.size + 1, dtype=dtype).reshape(idx.shape))

    def loss():
        return (x.gather(dim, ca.from_numpy(idx)) * w).sum()
    if backend is None:
        loss().backward()
    else:
        with ca.compiled_backward(backend=backend):
            loss().backward()
    return x.grad.numpy()


@pytest.mark.parametrize("shape,dim,idx_shape", CASES)
def test_gather_gradient_is_the_index_counted(shape, dim, idx_shape):
    """Each input element's gradient is the sum of the weights of the output
    elements that read it (duplicates add)."""
    idx = _index(shape, dim, idx_shape)
    d = dim % len(shape)
    expect = np.zeros(shape)
    w = np.arange(1, idx.size + 1, dtype=np.float64).reshape(idx.shape)
    for pos in np.ndindex(*idx.shape):
        target = list(pos)
        target[d] = idx[pos]
        expect[tuple(target)] += w[pos]
    np.testing.assert_array_equal(_grad(shape, dim, idx, None), expect)


@pytest.mark.parametrize("shape,dim,idx_shape", CASES)
@pytest.mark.parametrize("backend", ["python", pytest.param("c", marks=needs_cc)])
@pytest.mark.parametrize("int_type", [np.int64, np.int32])
def test_compiled_gather_gradient_is_eagers(shape, dim, idx_shape, backend, int_type):
    idx = _index(shape, dim, idx_shape, seed=1).astype(int_type)
    np.testing.assert_array_equal(_grad(shape, dim, idx, backend),
                                  _grad(shape, dim, idx, None))


def test_gather_gradcheck_float64():
    x = ca.tensor(np.random.default_rng(2).standard_normal((3, 5)), dtype=np.float64,
                  requires_grad=True)
    for idx in (np.array([[4], [0], [2]]), np.array([[1, 1, 3], [0, 4, 4], [2, 2, 2]])):
        assert gradcheck(lambda t: t.gather(1, ca.from_numpy(idx)).sin(), (x,))


def test_one_index_per_line_is_a_select_without_scatter_add():
    logits = ca.tensor(np.random.default_rng(3).standard_normal((6, 7)), requires_grad=True)
    target = ca.from_numpy(np.array([0, 6, 3, 3, 1, 5]))
    graph = ca.trace_backward(F.cross_entropy(logits, target)).graph
    used = [n.target for n in graph.nodes if n.op == "call_function"]
    assert "scatter_add" not in used and {"wrap_index", "eq", "where"} <= set(used)
    several = ca.tensor(np.ones((3, 4)), requires_grad=True)
    graph = ca.trace_backward(several.gather(1, ca.from_numpy(np.zeros((3, 2), np.int64)))
                              .sum()).graph
    assert "scatter_add" in [n.target for n in graph.nodes]


@needs_cc
def test_the_log_softmax_backward_reads_no_zeros():
    """The C of cross-entropy's backward: no loop fills the logits' shape with
    zeros; the select is in the log-softmax backward's loops."""
    from compiled_autograd.codegen import c as c_emitter
    logits = ca.tensor(np.random.default_rng(4).standard_normal((64, 100)).astype(np.float32),
                       requires_grad=True)
    target = ca.from_numpy(np.random.default_rng(5).integers(0, 100, 64))
    prog = c_emitter.generate(ca.trace_backward(F.cross_entropy(logits, target)).graph)
    body = prog.source[prog.source.index("ca_backward("):]
    assert "< 6400; i0++)" not in body and body.count("ca_select_f") == 2


def test_wrap_index_wraps_negatives_and_checks_bounds():
    idx = np.array([[-1], [0], [-5], [4]])
    np.testing.assert_array_equal(ops.wrap_index(idx, size=5), [[4], [0], [0], [4]])
    assert ops.wrap_index(idx, size=5).dtype == np.int32
    for bad in (5, -6):
        with pytest.raises(IndexError, match=f"index {bad} is out of bounds"):
            ops.wrap_index(np.array([[0], [bad]]), size=5)


@needs_cc
@pytest.mark.parametrize("backend", ["python", "c"])
def test_dynamic_sizes_keep_scatter_add(backend):
    """A symbolic size: the select's positions are not known, scatter_add is used."""
    def run(n, compiled):
        logits = ca.tensor(np.linspace(-2, 2, n * 5).reshape(n, 5), dtype=np.float64,
                           requires_grad=True)
        target = ca.from_numpy(np.arange(n) % 5)
        loss = F.cross_entropy(logits, target)
        if compiled:
            with ca.compiled_backward(backend=backend, dynamic=True):
                loss.backward()
        else:
            loss.backward()
        return logits.grad.numpy()
    for n in (3, 6):
        np.testing.assert_allclose(run(n, True), run(n, False), rtol=1e-12, atol=1e-15)


@needs_torch
@pytest.mark.parametrize("shape,dim,idx_shape", CASES)
@pytest.mark.parametrize("int_type", [np.int64, np.int32])
def test_gather_matches_torch(shape, dim, idx_shape, int_type):
    idx = _index(shape, dim, idx_shape, seed=6).astype(int_type)
    x = np.random.default_rng(7).standard_normal(shape)
    ours = ca.tensor(x, dtype=np.float64, requires_grad=True)
    theirs = torch.tensor(x, requires_grad=True)
    a = ca.gather(ours, dim, ca.from_numpy(idx))
    b = torch.gather(theirs, dim, torch.from_numpy(idx))
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    (a * a).sum().backward()
    (b * b).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-12)


@needs_torch
@pytest.mark.parametrize("idx", [np.array([[5]]), np.array([[-1], [0], [0]]),
                                 np.zeros((3, 1), np.int16), np.zeros((3,), np.int64),
                                 np.zeros((4, 1), np.int64)])
def test_gather_errors_are_torchs(idx):
    x = np.arange(15.0).reshape(3, 5)
    with pytest.raises(RuntimeError) as theirs:
        torch.tensor(x).gather(1, torch.from_numpy(idx))
    with pytest.raises(RuntimeError) as ours:
        ca.tensor(x, dtype=np.float64).gather(1, ca.from_numpy(idx))
    assert str(ours.value) == str(theirs.value).splitlines()[0]


@pytest.mark.parametrize("backend", ["python", pytest.param("c", marks=needs_cc)])
def test_a_cache_hit_gives_the_same_gradient(backend):
    """cross-entropy's backward twice on one structure: the second is a cache hit
    (the positions are a constant of the graph) and gives the first's bits."""
    rng = np.random.default_rng(8)
    logits = ca.tensor(rng.standard_normal((16, 9)).astype(np.float32), requires_grad=True)
    target = ca.from_numpy(rng.integers(0, 9, 16))
    grads = []
    for _ in range(2):
        logits.grad = None
        hits = ca.compiled_autograd_stats()["cache_hits"]
        with ca.compiled_backward(backend=backend):
            F.cross_entropy(logits * 2.0, target).backward()
        grads.append(logits.grad.numpy().tobytes())
    assert ca.compiled_autograd_stats()["cache_hits"] == hits + 1
    assert grads[0] == grads[1]
    logits.grad = None
    F.cross_entropy(logits * 2.0, target).backward()
    np.testing.assert_allclose(np.frombuffer(grads[1], np.float32).reshape(16, 9),
                               logits.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", [None, "python", pytest.param("c", marks=needs_cc)])
def test_a_negative_zero_gradient_comes_out_positive_as_torchs(backend):
    """scatter_add added g to zeros (-0.0 + 0.0 = +0.0); the select keeps that."""
    x = ca.tensor(np.array([[-0.0, 1.0], [2.0, 3.0]]), dtype=np.float64, requires_grad=True)
    idx = ca.from_numpy(np.array([[0], [1]]))

    def run():
        x.gather(1, idx).mul(-0.0).sum().backward()
    if backend is None:
        run()
    else:
        with ca.compiled_backward(backend=backend):
            run()
    assert not np.signbit(x.grad.numpy()).any()


@needs_torch
@pytest.mark.parametrize("x_shape,idx", [((), 0), ((2,), 1), ((), [0]), ((), [0, 0])])
def test_zero_dim_gather_is_torchs(x_shape, idx):
    """A 0-d input or index counts as 1-d, as in torch."""
    x = np.arange(1.0, 3.0)[:int(np.prod(x_shape))].reshape(x_shape) + 1
    i = np.array(idx)
    ours = ca.tensor(x, dtype=np.float64, requires_grad=True)
    theirs = torch.tensor(x, requires_grad=True)
    a = ours.gather(0, ca.from_numpy(i))
    b = theirs.gather(0, torch.from_numpy(i))
    assert a.shape == tuple(b.shape)
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    a.sum().backward()
    b.sum().backward()
    np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())
