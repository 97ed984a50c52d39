"""Where the coefficients of the C backend's float exp and erf come from
(runtime/ca_math.h): weighted least-squares fits in float64 on
Chebyshev-spaced points, printed as float32 literals. tests/test_c_math.py checks
the resulting functions on a dense sweep of float32 inputs.

    python docs/examples/fit_c_math.py
"""
import math

import numpy as np


def chebyshev(lo, hi, n=6000):
    return (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.linspace(0, np.pi, n))


def fit(x, target, basis_of, degree, weight):
    """Coefficients c of sum(c[k] * basis**k) ~ target, errors weighted by weight."""
    basis = np.vander(basis_of(x), degree + 1, increasing=True)
    c, *_ = np.linalg.lstsq(basis * weight[:, None], target * weight, rcond=None)
    return c


def main():
    # exp(r) = 1 + r + r^2 P(r) on |r| <= ln2/2; weight: relative error of exp(r).
    r = chebyshev(-math.log(2) / 2, math.log(2) / 2)
    r = r[np.abs(r) > 1e-9]
    exp_p = fit(r, (np.exp(r) - 1 - r) / r ** 2, lambda v: v, 5, r ** 2 / np.exp(r))
    # erf(t) = t + t P(t^2) on [0, 1].
    t = chebyshev(0, 1)
    t = t[t > 1e-6]
    erf_small = fit(t, np.array([math.erf(v) for v in t]) / t - 1, lambda v: v * v, 5,
                    np.ones_like(t))
    # erfc(t) = exp(-t^2) R(t) on [1, 4], R a polynomial in v = (t - 2.5) / 1.5;
    # weight: relative error of R. The same R serves erf (1 - erfc) and GELU's
    # derivative, which shares exp(-t^2) with the normal density.
    t = chebyshev(1, 4)
    scaled = np.array([math.erfc(v) * math.exp(v * v) for v in t])
    erfc_r = fit(t, scaled, lambda v: (v - 2.5) / 1.5, 10, 1 / scaled)
    # The same R on [0, 4], a polynomial in v = (t - 2) / 2: GELU's cdf from one
    # exp and one polynomial (exp(-t^2) R(t) / 2 below zero, 1 minus it above).
    t = chebyshev(0, 4)
    scaled = np.array([math.erfc(v) * math.exp(v * v) for v in t])
    erfc_r0 = fit(t, scaled, lambda v: (v - 2) / 2, 14, 1 / scaled)
    for name, c in (("exp P(r)", exp_p), ("erf P(t^2), t < 1", erf_small),
                    ("erfc R(v), 1 <= t <= 4", erfc_r), ("erfc R(v), 0 <= t <= 4", erfc_r0)):
        print(f"{name:<24}" + ", ".join(f"{np.float32(v):.9e}" for v in c))


if __name__ == "__main__":
    main()
