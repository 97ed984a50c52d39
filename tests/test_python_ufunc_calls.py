"""The "python" backend calls a prim that is one numpy ufunc (``Prim.ufunc``, no
params) as the ufunc itself, ``_n_<prim>``, where its value has dimensions: the
kernel's only other work is making a 0-d result an array. These tests hold the
backend to that: every such kernel is its ufunc, bit for bit, on arrays; a 0-d
value still calls the kernel; a param (sqrt's ``zero_grad_at_zero``) keeps the
kernel. (``ca.memory.profile`` counts what an ``_n_`` call allocates:
tests/test_schedule.py aligns the measured schedule node by node.)"""
from __future__ import annotations

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.compiled.api import backward_on
from compiled_autograd.runtime.prims import PRIMS

ONE_UFUNC = sorted(name for name, p in PRIMS.items() if p.ufunc is not None)


@pytest.mark.parametrize("name", ONE_UFUNC)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_kernel_is_its_ufunc(name, dtype):
    prim = PRIMS[name]
    rng = np.random.default_rng(0)
    args = [np.abs(rng.standard_normal((3, 4))).astype(dtype) + 0.5
            for _ in range(prim.ufunc.nin)]
    if prim.ufunc.nin == 2:
        args[1] = args[1][0]            # (broadcast, as a graph's operands may)
    got, want = prim.kernel(*args), prim.ufunc(*args)
    assert type(got) is np.ndarray and got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()
    if prim.ufunc.nin == 2:             # a Python float operand keeps the array's dtype
        assert prim.kernel(args[0], 0.5).tobytes() == prim.ufunc(args[0], 0.5).tobytes()


def _code(fn):
    x = ca.tensor(np.linspace(0.5, 2.0, 6).reshape(2, 3), requires_grad=True)
    return ca.trace_backward(fn(x)).code


def test_a_value_with_dimensions_calls_the_ufunc_a_0d_one_the_kernel():
    code = _code(lambda x: (x * x).sum() * 3.0)
    assert "_n_mul(" in code                 # the (2, 3) gradient of x * x
    assert "_k_mul(grad_root" in code        # the 0-d gradient of the sum times 3


def test_a_param_keeps_the_kernel():
    from compiled_autograd.ir.graph import BOXED, Graph
    from compiled_autograd.codegen.python import generate
    g = Graph()
    box = g.create_node("placeholder", "inputs", name="inputs")
    for name in BOXED:
        if name != "inputs":
            g.create_node("placeholder", name, name=name)
    meta = {"shape": (3,), "dtype": np.dtype(np.float32), "nbytes": 12, "source": None}
    x = g.create_node("call_function", "getitem", (box, 0), name="x", meta=meta)
    s = g.create_node("call_function", "sqrt", (x,), {"zero_grad_at_zero": True}, name="s",
                      meta=meta)
    g.create_node("output", "output", ((s,),), name="output")
    code, _ = generate(g)
    assert "_k_sqrt(x, zero_grad_at_zero=True)" in code


# ------------------------------------------------- numbers as 0-d arrays of the dtype

def _f(x):
    return ((x * 0.1 + 2) / 3.0 - x.tanh() * 1e-3 + (x - 7)).sum() * 0.5


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_number_beside_arrays_of_a_float_dtype_is_a_0d_array_of_it(dtype):
    """Literals become read-only constants of the dtype, runtime scalars 0-d arrays
    made once at the start; the gradient is eager's, bit for bit (numpy casts a
    Python number to the array's dtype anyway)."""
    name = np.dtype(dtype).name
    x = ca.tensor(np.linspace(0.5, 2.0, 6).reshape(2, 3), dtype=getattr(ca, name),
                  requires_grad=True)
    g = ca.trace_backward(_f(x))
    assert f"_n_sub(_{name}_1_0, " in g.code               # tanh's 1 - y * y
    assert f"= _as(scalars[" in g.code and f", _{name})" in g.code
    assert "scalars[" not in g.code.split("grad_root = ")[1]   # only in the preamble
    from compiled_autograd.codegen.python import generate
    constant = generate(g.graph)[1][f"_{name}_1_0"]
    assert constant.dtype == dtype and constant.shape == () and not constant.flags.writeable
    grads = []
    for backend in (None, "python"):
        x.grad = None
        backward_on(_f(x), backend)
        grads.append(x.grad.numpy().copy())
    assert grads[0].tobytes() == grads[1].tobytes()


def test_a_number_beside_an_array_of_another_dtype_stays_a_number():
    """An integer array's arithmetic, or mixed dtypes, keep numpy's own rules."""
    from compiled_autograd.codegen.python import _Source
    from compiled_autograd.ir.graph import Graph
    g = Graph()
    box = g.create_node("placeholder", "inputs", name="inputs")
    f32 = {"shape": (3,), "dtype": np.dtype(np.float32), "nbytes": 12, "source": None}
    i64 = {"shape": (3,), "dtype": np.dtype(np.int64), "nbytes": 24, "source": None}
    f64 = {"shape": (3,), "dtype": np.dtype(np.float64), "nbytes": 24, "source": None}
    i = g.create_node("call_function", "getitem", (box, 0), name="i", meta=i64)
    x = g.create_node("call_function", "getitem", (box, 1), name="x", meta=f32)
    cases = {"ints": g.create_node("call_function", "mul", (i, 2), name="ints", meta=i64),
             "int array to float": g.create_node("call_function", "mul", (i, 0.5),
                                                  name="half", meta=f64),
             "float": g.create_node("call_function", "mul", (x, 0.5), name="f", meta=f32)}
    src = _Source(g)
    src.out = {}
    args = {k: src.line(n, [])["args"][1]["text"] for k, n in cases.items()}
    assert args == {"ints": "2", "int array to float": "0.5", "float": "_float32_0_5"}


_LITERALS = [1.0, 1, -1.0, -1, 0.0, -0.0, 0, 0.1, 1e16, 1e-16, 5e-324, 2**70 + 1,
             float("inf"), float("-inf"), float("nan"), -float("nan")]


def test_every_literal_operand_gives_the_kernels_bits():
    """Literal operands of every binary ufunc prim, first or second, beside arrays
    of float16/32/64: the generated function's results are the kernel's on the
    Python number, bit for bit, and the constants' names never collide (1e16 and
    1e-16 give the same identifier; -nan's repr is "nan": it shared +nan's constant
    and lost its sign bit)."""
    from compiled_autograd.codegen.python import PythonBackward
    from compiled_autograd.ir.graph import BOXED, Graph
    g = Graph()
    box = g.create_node("placeholder", "inputs", name="inputs")
    for name in BOXED:
        if name != "inputs":
            g.create_node("placeholder", name, name=name)
    inputs, nodes, want = [], [], []
    for k, dtype in enumerate(map(np.dtype, (np.float16, np.float32, np.float64))):
        meta = {"shape": (3,), "dtype": dtype, "nbytes": 3 * dtype.itemsize, "source": None}
        x = g.create_node("call_function", "getitem", (box, k), name="x", meta=meta)
        inputs.append(np.array([1.5, -2.0, 0.0], dtype))
        for lit in _LITERALS:
            for op in ("add", "sub", "mul", "div", "maximum"):
                for args in ((x, lit), (lit, x)):
                    nodes.append(g.create_node("call_function", op, args, name=op, meta=meta))
                    with np.errstate(all="ignore"):
                        want.append(PRIMS[op].kernel(*[inputs[k] if a is x else a
                                                       for a in args]))
    g.create_node("output", "output", (tuple(nodes),), name="output")
    with np.errstate(all="ignore"):
        fn = PythonBackward(g)
        got = fn(list(inputs), [], [], [], [])
    assert "_n_sub(_float32__1_0, x" in fn.code and "_float64_1e_16_" in fn.code
    bad = [(n.target, n.args, w.tobytes().hex(), r.tobytes().hex())
           for n, w, r in zip(nodes, want, got)
           if w.dtype != r.dtype or w.tobytes() != r.tobytes()]
    assert not bad
