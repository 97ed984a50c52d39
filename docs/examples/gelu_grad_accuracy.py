"""How close the C backend's float GELU derivative (ca_gelu_grad_f in
runtime/ca_math.h) is to float64 below zero, where its cdf is small:
the largest relative error on x in (-5.6, -1.5), and the values at x = -6 and
-12, past t = |x|/sqrt(2) = 4, where R's argument is clamped, with torch's float32
gelu_backward beside them when torch is installed. Needs a C compiler.

    python docs/examples/gelu_grad_accuracy.py
"""
import ctypes
import math

import numpy as np

from compiled_autograd.codegen.c import _ENV
from compiled_autograd.runtime import cbuild

DRIVER = """
#include <stdint.h>
#include <string.h>
#include <math.h>
{% include "ca_math.h" %}
void gelu_grad(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = ca_gelu_grad_f(x[i]); }
"""


def reference(x):
    x = x.astype(np.float64)
    return np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x]) + \
        x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def main():
    lib = cbuild.load(cbuild.build(_ENV.from_string(DRIVER).render())[0])
    lib.gelu_grad.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    def run(x):
        y = np.empty_like(x)
        lib.gelu_grad(x.ctypes.data, y.ctypes.data, x.size)
        return y
    x = np.linspace(-5.6, -1.5, 400_001, dtype=np.float32)[1:-1]
    rel = np.abs(run(x) - reference(x)) / np.abs(reference(x))
    print(f"largest relative error on (-5.6, -1.5): {rel.max():.2e} at x = {x[rel.argmax()]:.4f}")
    try:
        import torch
    except ImportError:
        torch = None
    for v in (-6.0, -12.0):
        x = np.array([v], np.float32)
        got, ref = run(x)[0], reference(x)[0]
        line = f"x = {v:g}: {got:.6e} against {ref:.6e} ({abs(got / ref - 1):.2%} off)"
        if torch is not None:
            theirs = torch.ops.aten.gelu_backward(torch.ones(1), torch.tensor([v])).item()
            line += f"; torch {theirs:.6e} ({abs(theirs / ref - 1):.2%} off)"
        print(line)


if __name__ == "__main__":
    main()
