"""The C backend's own float exp and erf (codegen/templates/c/math.h.j2): branch-free
so that loops calling them vectorise. Checked here against float64 references on
a dense sweep of float32 inputs, the special values, and the sign of zero."""
import ctypes
import math
import shutil

import numpy as np
import pytest

from codegen.c import _ENV
from runtime import cbuild

pytestmark = pytest.mark.skipif(shutil.which(cbuild.compiler().split()[0]) is None,
                                reason="no C compiler")

DRIVER = """
#include <stdint.h>
#include <string.h>
#include <math.h>
{% include "math.h.j2" %}
void test_exp(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = ca_expf(x[i]); }
void test_erf(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = ca_erff(x[i]); }
"""


@pytest.fixture(scope="module")
def lib():
    path, _ = cbuild.build(_ENV.from_string(DRIVER).render())
    lib = cbuild.load(path)
    for name in ("test_exp", "test_erf"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def _run(lib, name, x):
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    getattr(lib, name)(x.ctypes.data, y.ctypes.data, x.size)
    return y


def _sweep(limit, n=200_000):
    """n float32 values evenly spaced in bit pattern over [1e-30, limit] (so every
    binade gets its share), and their negatives."""
    lo, hi = np.array([1e-30, limit], np.float32).view(np.int32)
    positive = np.linspace(lo, hi, n).astype(np.int32).view(np.float32)
    return np.concatenate([-positive, positive])


def _ulps(got, ref64):
    """|got - ref| in units of the float32 spacing at the reference value."""
    ref32 = ref64.astype(np.float32)
    spacing = np.spacing(np.abs(ref32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - ref64) / spacing


def test_exp_is_within_one_ulp(lib):
    x = np.concatenate([_sweep(87.0), np.linspace(87, 88.7, 1000, dtype=np.float32)])
    ref = np.exp(x.astype(np.float64))
    assert _ulps(_run(lib, "test_exp", x), ref).max() <= 1.0


def test_exp_special_values_and_range_ends(lib):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 89.0, 88.8, -104.0, -120.0, -100.0],
                 np.float32)
    y = _run(lib, "test_exp", x)
    assert np.isnan(y[0]) and y[1] == np.inf and y[2] == 0.0 and y[3] == 1.0 and y[4] == 1.0
    assert y[5] == np.inf and y[6] == np.inf and y[7] < 1e-44 and y[8] == 0.0
    assert y[9] == pytest.approx(math.exp(-100.0), rel=1e-2)   # subnormal: few bits left


def test_erf_is_within_two_ulp(lib):
    x = _sweep(6.0)
    ref = np.array([math.erf(v) for v in x.astype(np.float64)])
    got = _run(lib, "test_erf", x)
    assert _ulps(got, ref).max() <= 2.0
    assert np.abs(got - ref).max() <= 1.2e-7


def test_erf_special_values_and_signed_zero(lib):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 4.0, 10.0], np.float32)
    y = _run(lib, "test_erf", x)
    assert np.isnan(y[0]) and y[1] == 1.0 and y[2] == -1.0
    assert y[3] == 0.0 and not np.signbit(y[3]) and y[4] == 0.0 and np.signbit(y[4])
    assert y[5] == pytest.approx(math.erf(1.0), abs=1.2e-7) and y[6] == -y[5]
    assert y[7] == np.float32(math.erf(4.0)) and y[8] == 1.0
