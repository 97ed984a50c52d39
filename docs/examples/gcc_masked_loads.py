"""Why the C backend's where() is a call (ca_select) and not ``c ? a : b``.

A masked sum over the middle dim of an (n0, n1, n2) array, the loop nest the
backend generates for ReluBackward fused into ExpandBackward's sum:

    out[i0, i2] = sum over i1 of (m[i0, i1, i2] > 0 ? a[...] * b[...] : 0)

written two ways, with the extents baked in (as the backend does), for every
shape with extents 1 to 5, built with the backend's own compiler and flags
(compiled_autograd.runtime.cbuild) and compared with numpy. With GCC 12 at -O3 on an AVX2 or AVX-512
CPU the ternary form gives wrong sums for some shapes; the call form, whose
arguments load unconditionally, gives none.

    python docs/examples/gcc_masked_loads.py
"""
from __future__ import annotations

import ctypes
import itertools
import subprocess

import numpy as np

from compiled_autograd.runtime import cbuild

SHAPES = list(itertools.product(range(1, 6), repeat=3))
SELECT = ("static inline __attribute__((always_inline)) double select_d(int c, double a, "
          "double b) { return c ? a : b; }\n")


def _kernel(name, shape, form):
    n0, n1, n2 = shape
    k = f"(i0 * {n1 * n2} + i1 * {n2} + i2)"
    value = (f"m[{k}] > 0 ? a[{k}] * b[{k}] : 0.0" if form == "ternary"
             else f"select_d(m[{k}] > 0, a[{k}] * b[{k}], 0.0)")
    return (f"void {name}(const double *a, const double *b, const double *m, double *out)\n"
            f"{{\n  for (long k = 0; k < {n0 * n2}; k++) out[k] = 0;\n"
            f"  for (long i0 = 0; i0 < {n0}; i0++)\n"
            f"    for (long i1 = 0; i1 < {n1}; i1++)\n"
            f"      for (long i2 = 0; i2 < {n2}; i2++)\n"
            f"        out[i0 * {n2} + i2] += {value};\n}}\n")


def main():
    source = "#include <stdint.h>\n" + SELECT + "".join(
        _kernel(f"{form}_{i}", shape, form)
        for i, shape in enumerate(SHAPES) for form in ("ternary", "select"))
    path, _ = cbuild.build(source)
    lib = ctypes.CDLL(str(path))
    version = subprocess.run(cbuild.compiler().split() + ["--version"], capture_output=True,
                             text=True).stdout.splitlines()[0]
    print(f"compiler: {version}")
    print(f"flags: {' '.join(cbuild.OPT_FLAGS + tuple(cbuild.arch_flags()))}")
    wrong = {"ternary": [], "select": []}
    for i, shape in enumerate(SHAPES):
        size = int(np.prod(shape))
        k = np.arange(size)
        a, b = (k % 7 + 1.0), (1.0 + k % 3)
        m = np.where((k * 7) % 5 == 3, 0.0, 1.0)
        expected = np.where(m > 0, a * b, 0.0).reshape(shape).sum(1)
        for form in wrong:
            out = np.zeros((shape[0], shape[2]))
            getattr(lib, f"{form}_{i}")(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, m, out)))
            if not np.array_equal(out, expected):
                wrong[form].append(shape)
    for form, shapes in wrong.items():
        shown = ", ".join("x".join(map(str, s)) for s in shapes[:6])
        print(f"{form:8s} wrong for {len(shapes):3d} of {len(SHAPES)} shapes"
              + (f": {shown}{', ...' if len(shapes) > 6 else ''}" if shapes else ""))


if __name__ == "__main__":
    main()
