"""Long graphs (issue 29, item 5): a chain of 1,000+ single-use elementwise ops (a
simulation's steps) compiles on every backend without depending on Python's
recursion limit; the C fuses at most MAX_FUSED_DEPTH levels into one loop.
(Capture and codegen time against graph size: benchmarks/long_graph.py.)"""
import sys

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen import c as c_codegen
from compiled_autograd.codegen import c_fusion
from helpers import needs_cc


def simulate(steps):
    x = ca.tensor(np.linspace(-1, 1, 16), requires_grad=True, dtype=np.float64)
    h = x
    for _ in range(steps):
        h = (h * 0.999 + 0.001).tanh()
    return x, h.sum()


def test_c_codegen_of_a_long_elementwise_chain_needs_no_deep_recursion():
    _, loss = simulate(700)              # > 2,000 single-use elementwise ops
    graph = ca.trace_backward(loss).graph
    assert len(graph.nodes) > 3000
    prog = c_codegen.generate(graph)
    depth = max(_nesting(line) for line in prog.source.splitlines())
    assert depth < 4 * c_fusion.MAX_FUSED_DEPTH, depth


def _nesting(line):
    deepest = level = 0
    for ch in line:
        level += ch == "("
        level -= ch == ")"
        deepest = max(deepest, level)
    return deepest


@pytest.mark.parametrize("backend", ["python", pytest.param("c", marks=needs_cc)])
def test_a_long_chain_compiles_and_gives_eagers_gradients(backend, monkeypatch,
                                                          fresh_compiled_cache):
    # (A short fusion limit on C: the same materialized cuts as a long chain, with
    # a build that stays quick)
    monkeypatch.setattr(c_fusion, "MAX_FUSED_DEPTH", 4)
    x, loss = simulate(1200 if backend == "python" else 60)
    steps = 1200 if backend == "python" else 60
    loss.backward()
    expected = x.grad.numpy().copy()
    x, loss = simulate(steps)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(400)            # far below the graph's length
    try:
        with ca.compiled_backward(backend=backend):
            loss.backward()
    finally:
        sys.setrecursionlimit(old)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)
