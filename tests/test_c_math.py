"""The C backend's own float exp, erf and GELU derivative (runtime/ca_math.h): branch-free
so that loops calling them vectorise. Checked here against float64 references on
a dense sweep of float32 inputs, the special values, and the sign of zero."""
import ctypes
import math
import shutil

import numpy as np
import pytest

from compiled_autograd.codegen.c import _ENV
from compiled_autograd.runtime import cbuild

pytestmark = pytest.mark.skipif(shutil.which(cbuild.compiler().split()[0]) is None,
                                reason="no C compiler")

DRIVER = """
#include <stdint.h>
#include <string.h>
#include <math.h>
{% include "ca_math.h" %}
void test_exp(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = ca_expf(x[i]); }
void test_exp_neg(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = ca_exp_neg_f(x[i]); }
void test_erf(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = ca_erff(x[i]); }
void test_gelu(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = ca_gelu_f(x[i]); }
void test_gelu_grad(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = ca_gelu_grad_f(x[i]); }
void test_gelu_grad_tanh(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = ca_gelu_grad_tanh_f(x[i]); }
#ifdef FP_FAST_FMAF
int test_has_fma(void) { return 1; }
#else
int test_has_fma(void) { return 0; }
#endif
"""


@pytest.fixture(scope="module")
def lib():
    path, _ = cbuild.build(_ENV.from_string(DRIVER).render())
    lib = cbuild.load(path)
    for name in ("test_exp", "test_exp_neg", "test_erf", "test_gelu", "test_gelu_grad",
                 "test_gelu_grad_tanh"):
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


def test_exp_of_a_non_positive_argument_is_exps_bit_for_bit(lib):
    # ca_exp_neg_f (softmax's, erf's and the GELU derivative's exp) scales by
    # 2^(k+64) through the exponent bits, then by 2^-64: for every x <= 0 that is
    # ca_expf's two scalings, subnormal results (x < -87.3) and the clamp included.
    x = np.concatenate([-_sweep(110.0)[:300_000], np.linspace(-110, 0, 200_001, dtype=np.float32),
                        np.array([0.0, -0.0, -86.0, -87.33655, -103.97, -104.0, -1e30, -np.inf],
                                 np.float32)])
    x = x[x <= 0]
    assert _run(lib, "test_exp_neg", x).tobytes() == _run(lib, "test_exp", x).tobytes()
    y = _run(lib, "test_exp_neg", np.array([np.nan, -np.nan, -np.inf, -100.0, -0.0], np.float32))
    assert np.isnan(y[:2]).all() and y[2] == 0.0 and y[4] == 1.0
    assert y[3] == pytest.approx(math.exp(-100.0), rel=1e-2)   # subnormal: few bits left
    with np.errstate(invalid="ignore"):
        inf_minus_inf = np.float32(np.inf) - np.array([np.inf], np.float32)   # the invalid-op NaN
    assert np.isnan(_run(lib, "test_exp_neg", inf_minus_inf)).all()


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


def _gelu_grad64(x):
    x = x.astype(np.float64)
    return np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x]) + \
        x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _gelu64(x):
    x = x.astype(np.float64)
    return x * np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])


def test_gelu_keeps_relative_accuracy_down_to_its_clamp(lib):
    # x cdf(x), the cdf 1 - h above zero and h below (h = exp(-u^2) R(|u|) / 2): no
    # cancellation, so small values keep their relative accuracy (a float32
    # 1 + erf(u) is 0 once erf(u) rounds to -1, below x = -5.4) down to |u| = 4, where
    # R's argument is clamped; past it the value is below 1e-8 |x|.
    x = np.concatenate([_sweep(12.0), np.linspace(-12, 12, 200_001, dtype=np.float32)])
    got, ref = _run(lib, "test_gelu", x).astype(np.float64), _gelu64(x)
    inside = (x > -5.6) & (ref != 0)
    bound = 4e-7 if lib.test_has_fma() else 1.2e-6
    assert (np.abs(got - ref)[inside] / np.abs(ref[inside])).max() <= bound
    assert (np.abs(got - ref) <= 2e-7 * np.abs(x.astype(np.float64))).all()
    y = _run(lib, "test_gelu", np.array([np.nan, 0.0, -0.0, 30.0, -30.0, np.inf, -np.inf,
                                         1e20, -1e20], np.float32))
    assert np.isnan(y[0]) and y[1] == 0.0 and y[2] == 0.0 and np.signbit(y[2])
    assert y[3] == 30.0 and y[4] == 0.0 and y[5] == np.inf and np.isnan(y[6])
    assert y[7] == np.float32(1e20) and y[8] == 0.0     # x^2 overflows float: no NaN


def test_gelu_grad_is_within_two_ulp(lib):
    # cdf + x pdf lies in [-0.13, 1.13] and crosses zero near x = -0.75: ulps are
    # counted at the result, but never finer than at 0.5 (an absolute 6e-8 each).
    # (numpy's float32 evaluation of the same formula, the python backend's, is
    # within 1.72 of these units on this sweep; this is within 1.63.)
    x = np.concatenate([_sweep(20.0), np.linspace(-6, 6, 100_001, dtype=np.float32)])
    ref = _gelu_grad64(x)
    unit = np.spacing(np.maximum(np.abs(ref), 0.5).astype(np.float32)).astype(np.float64)
    err = np.abs(_run(lib, "test_gelu_grad", x).astype(np.float64) - ref) / unit
    assert err.max() <= 2.0, x[err.argmax()]


def test_gelu_grad_keeps_relative_accuracy_below_zero(lib):
    # Below zero the cdf is e R(t) / 2, not (1 + erf) / 2: the small values keep
    # their relative accuracy (numpy's float32 composite is off by 3% at x = -5.5),
    # down to t = |x|/sqrt(2) = 4, where R's argument is clamped. With fused
    # multiply-adds x^2 is split exactly for exp (its rounding cost 6.7e-7 here).
    x = np.concatenate([np.linspace(-5.6, -1.5, 200_001, dtype=np.float32), _sweep(5.6)])
    x = x[(x < -1.5) & (x > -5.6)]
    got, ref = _run(lib, "test_gelu_grad", x), _gelu_grad64(x)
    bound = 4e-7 if lib.test_has_fma() else 1e-6
    assert (np.abs(got - ref) / np.abs(ref)).max() <= bound


def test_gelu_grad_special_values(lib):
    x = np.array([np.nan, 0.0, -0.0, 30.0, -30.0, np.inf, -np.inf, 1e20, -1e20], np.float32)
    y = _run(lib, "test_gelu_grad", x)
    assert np.isnan(y[0]) and y[1] == 0.5 and y[2] == 0.5 and y[3] == 1.0 and y[4] == 0.0
    assert y[7] == 1.0 and y[8] == 0.0           # x^2 overflows float: no NaN
    assert np.isnan(y[5]) and np.isnan(y[6])     # inf * pdf(inf) = inf * 0, as in numpy


def test_gelu_grad_tanh_matches_float64(lib):
    x = np.linspace(-10, 10, 20_001, dtype=np.float32)
    x64 = x.astype(np.float64)
    k, c = math.sqrt(2 / math.pi), 0.044715
    t = np.tanh(k * (x64 + c * x64 ** 3))
    ref = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * k * (1 + 3 * c * x64 ** 2)
    # (numpy's float32 evaluation, the python backend's, is within 1.2e-6 here)
    assert np.abs(_run(lib, "test_gelu_grad_tanh", x) - ref).max() <= 1e-6
