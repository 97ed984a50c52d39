"""Sums over inner dims in the C backend (a layer norm's means, a softmax's
backward): a float32 row of at most FLOAT_SUM_MAX elements is added in float32
vector lanes, a longer one (and float64) in double. Either is close to the
exact sum, as numpy's pairwise sum is, and the same at any thread count (a
thread takes whole rows)."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen import c as c_emitter
from compiled_autograd.codegen.c_ops import FLOAT_SUM_MAX
from compiled_autograd.runtime import cthreads
from helpers import needs_cc

pytestmark = [needs_cc, pytest.mark.usefixtures("fresh_compiled_cache")]
F = ca.nn.functional


def _layer_norm(width, dtype=np.float32, rows=64, seed=0):
    rng = np.random.default_rng(seed)
    x = ca.tensor((rng.standard_normal((rows, width)) * 3 + 1).astype(dtype), dtype=dtype,
                  requires_grad=True)
    c = ca.tensor(rng.standard_normal((rows, width)).astype(dtype), dtype=dtype)

    def loss():
        return (F.layer_norm(x, (width,)) * c).sum()
    return x, loss


def _accumulators(loss):
    source = c_emitter.generate(ca.trace_backward(loss()).graph).source
    body = source[source.index("ca_backward("):]
    return body.count("float acc = "), body.count("double acc = ")


@pytest.mark.parametrize("width,dtype,expect", [
    (128, np.float32, "float"), (FLOAT_SUM_MAX, np.float32, "float"),
    (FLOAT_SUM_MAX + 1, np.float32, "double"), (128, np.float64, "double")])
def test_which_rows_are_added_in_float(width, dtype, expect):
    _, loss = _layer_norm(width, dtype)
    floats, doubles = _accumulators(loss)
    assert (floats > 0, doubles > 0) == ((True, False) if expect == "float" else (False, True))


def _c_grad(x, loss):
    x.grad = None
    with ca.compiled_backward(backend="c"):
        loss().backward()
    return x.grad.numpy().copy()


@pytest.mark.parametrize("width", [37, 128, FLOAT_SUM_MAX, 1000])
def test_row_sums_are_close_to_float64s(width):
    """The C's float32 gradient against the same model run in float64 (eager):
    within float32's rounding of the values themselves."""
    x, loss = _layer_norm(width)
    got = _c_grad(x, loss)
    x64, loss64 = _layer_norm(width, np.float64)
    loss64().backward()
    exact = x64.grad.numpy()
    x.grad = None
    loss().backward()
    eager = x.grad.numpy()
    scale = np.abs(exact).max()
    assert np.abs(got - exact).max() <= 4 * np.abs(eager - exact).max() + 1e-6 * scale


def test_two_threads_give_the_bits_of_one():
    enabled, status = cthreads.openmp()
    if not enabled:
        pytest.skip(status)
    x, loss = _layer_norm(128, rows=512)     # large enough for the loops to get threads
    assert "CA_OMP(omp parallel" in ca.trace_backward(loss()).c_code
    bits = []
    for loops in (1, 2, 1):
        with cthreads.threads(loops=loops, blas=2):
            bits.append(_c_grad(x, loss).tobytes())
    assert bits[0] == bits[1] == bits[2]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_and_inf_in_a_row_are_eagers():
    """A row whose sum meets inf, -inf and NaN: the float lanes give what eager's
    sums give there (NaN, inf), and the other rows are untouched."""
    x, _ = _layer_norm(128)
    c = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    c[3, 5], c[7, 0], c[7, 9], c[11, 100] = np.inf, np.inf, -np.inf, np.nan
    ct = ca.tensor(c)

    def loss():
        return (F.layer_norm(x, (128,)) * ct).sum()
    got = _c_grad(x, loss)
    x.grad = None
    loss().backward()
    want = x.grad.numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fine = np.isfinite(want)
    assert not fine[[3, 7, 11]].any() and fine.sum() == 61 * 128
    np.testing.assert_allclose(got[fine], want[fine], rtol=1e-4, atol=1e-5)
