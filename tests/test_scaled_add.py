"""The "python" backend's scaled add: ``store(x, x + s * y)`` (an optimizer's update
traced into the backward) is one call, ``_scaled_add`` (``kernels.c``'s ``axpy``, in
one pass with numpy's two roundings), and the multiplication allocates nothing
(``ir.passes.in_place_writes`` folds it; the memory schedule agrees). Where the
fold does not apply -- another user of the product, ``s * y - x``, broadcasting,
integers, a node in between -- the graph runs as before. Every case gives numpy's
bits on every backend."""
from __future__ import annotations

import numpy as np
import pytest

from compiled_autograd.compiled.backends import resolve_backend
from compiled_autograd.ir import passes
from compiled_autograd.ir.graph import BOXED, Graph
from compiled_autograd.memory.schedule import memory_schedule
from compiled_autograd.runtime import kernels
from compiled_autograd.codegen.python import generate

from helpers import BACKENDS, needs_cc


def _meta(shape, dtype):
    return {"shape": shape, "dtype": np.dtype(dtype), "source": None, "visit": 0,
            "nbytes": int(np.prod(shape)) * np.dtype(dtype).itemsize}


def _graph(case, dtype=np.float32, scale=0.25):
    """x = inputs[0] (stored into), y = inputs[1]; store(x, x + 0.25 * y), varied
    by ``case``; the output is (x + 0.25 * y,) where something else needs it."""
    g = Graph()
    boxes = {name: g.create_node("placeholder", name, name=name) for name in BOXED}
    y_shape = (1, 4) if case == "broadcast" else (3, 4)
    x = g.create_node("call_function", "getitem", (boxes["inputs"], 0), name="x",
                      meta=_meta((3, 4), dtype))
    y = g.create_node("call_function", "getitem", (boxes["inputs"], 1), name="y",
                      meta=_meta(y_shape, dtype))
    m = g.create_node("call_function", "mul", (scale, y) if case == "scalar first" else (y, scale),
                      name="m", meta=_meta(y_shape, dtype))
    outputs = (m,) if case == "two users" else ()
    if case == "between":
        e = g.create_node("call_function", "neg", (y,), name="e", meta=_meta(y_shape, dtype))
        outputs = (e,)
    if case == "reversed sub":
        v = g.create_node("call_function", "sub", (m, x), name="v", meta=_meta((3, 4), dtype))
    elif case == "sub":
        v = g.create_node("call_function", "sub", (x, m), name="v", meta=_meta((3, 4), dtype))
    else:
        v = g.create_node("call_function", "add", (m, x) if case == "product first" else (x, m),
                          name="v", meta=_meta((3, 4), dtype))
    g.create_node("call_function", "store", (x, v), name="store",
                  meta={"shape": None, "dtype": None, "nbytes": 0, "source": None})
    g.create_node("output", "output", (outputs,), name="output")
    g.lint()
    return g


def _expected(case, x, y):
    p = np.multiply(y, 0.25)
    return {"sub": np.subtract(x, p), "reversed sub": np.subtract(p, x)}.get(case, np.add(x, p))


FOLDED = ["add", "product first", "scalar first", "sub"]
NOT_FOLDED = ["two users", "reversed sub", "broadcast", "between"]


@pytest.mark.parametrize("case", FOLDED + NOT_FOLDED)
def test_the_fold_applies_exactly_where_one_pass_computes_the_same(case):
    g = _graph(case)
    m = next(n for n in g.nodes if n.name == "m")
    folded = passes.in_place_writes(g).get(m) == "folded"
    assert folded == (case in FOLDED)
    code, _ = generate(g)
    assert ("_scaled_add(" in code) == folded
    if folded:
        assert "m = " not in code          # (the product is never an array)
        step = {s.node: s for s in memory_schedule(g).steps}["m"]
        assert step.allocated == 0


def test_integers_are_not_folded():
    g = _graph("add", dtype=np.int64, scale=3)
    m = next(n for n in g.nodes if n.name == "m")
    assert m not in passes.in_place_writes(g)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", FOLDED + NOT_FOLDED)
def test_every_backend_gives_numpys_bits(case, dtype, backend):
    g = _graph(case, dtype)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(dtype)
    y = (rng.standard_normal((1, 4) if case == "broadcast" else (3, 4)) * 1e3).astype(dtype)
    expected = _expected(case, x, y)
    out = resolve_backend(backend)(g)([x, y.copy()], [], [], [], [])
    np.testing.assert_array_equal(x, expected)
    if case == "two users":
        np.testing.assert_array_equal(out[0], np.multiply(y, 0.25))


@needs_cc
def test_axpy_refuses_an_input_that_overlaps_its_output_shifted():
    native = kernels.native("axpy")
    if native is None:
        pytest.skip("the forward's C kernels are off")
    buf = np.arange(10, dtype=np.float64)
    out, a = buf[:8], buf[1:9]
    assert native(out, a, 2.0, np.ones(8)) is NotImplemented
    expected = np.add(buf[1:9], np.multiply(np.ones(8), 2.0))
    kernels.scaled_add(out, a, 2.0, np.ones(8))      # (numpy's two passes then)
    np.testing.assert_array_equal(buf[:8], expected)
    same = np.arange(8, dtype=np.float64)
    assert native(same, same, 2.0, same.reshape(2, 4)) is None     # (element for element)
    np.testing.assert_array_equal(same, np.arange(8) * 3.0)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="not done: where a and b are "
                   "both NaN, axpy's compiled add keeps b's payload, numpy's keeps a's")
@pytest.mark.parametrize("dtype,bits", [(np.float32, np.uint32), (np.float64, np.uint64)])
def test_two_nans_give_numpys_payload(dtype, bits):
    if kernels.native("axpy") is None:
        pytest.skip("the forward's C kernels are off (numpy's two passes then)")
    quiet = np.array(0x7FC00000 if dtype == np.float32 else 0x7FF8000000000000, bits)
    x = np.ones((3, 4), dtype)
    y = np.ones((3, 4), dtype)
    x.view(bits)[0, 0], y.view(bits)[0, 0] = quiet | 1, quiet | 2
    expected = np.add(x, np.multiply(y, 0.25))
    resolve_backend("python")(_graph("add", dtype))([x, y], [], [], [], [])
    assert x.view(bits)[0, 0] == expected.view(bits)[0, 0], \
        f"{x.view(bits)[0, 0]:#x} (numpy: {expected.view(bits)[0, 0]:#x})"
