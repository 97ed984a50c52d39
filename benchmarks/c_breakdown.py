"""Where the C backend's time goes, at 1 thread: the generated C function alone
against the whole compiled backward (the rest: the cache lookup's walk and the
call), with the call in C (codegen/c_call.c, the default) and in Python
(``CA_C_CALL=0``), on the small MLP, the 200-op chain and the transformer, and one
256x1024x1024 sgemm in the OpenBLAS the generated code links (numpy's) against torch,
and GELU's backward loop over one transformer layer's 512x512 activations three
ways: libm's scalar erff/expf, the backend's vectorisable ca_erff/ca_expf, and the
one helper the backend generates for the gelu_backward prim (ca_gelu_grad_f: one
exp shared by erf's tail and the density), built with the backend's own flags.

    python benchmarks/c_breakdown.py [--reps N]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))


def _fmt(seconds):
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def c_function_share(case, reps):
    """(median whole compiled backward with the call in C, the same with the call
    in Python, median of the generated function alone). The function is timed on
    the Python call path, where it is a ctypes call that can be wrapped."""
    import backward
    import compiled_autograd as ca
    from codegen.c_run import C_CALL, CBackward
    make_loss, params = backward._ca_setup(case)
    inner = []
    original = CBackward.__call__

    def timed_call(self, *args):
        fn = self.fn

        def timed_fn(*a):
            start = time.perf_counter()
            rc = fn(*a)
            inner.append(time.perf_counter() - start)
            return rc
        self.fn = timed_fn
        try:
            return original(self, *args)
        finally:
            self.fn = fn

    def whole():
        ca.reset_compiled_autograd()

        def run(loss):
            with ca.compiled_backward(backend="c"):
                loss.backward()
        return backward._median_backward(make_loss, params, reps, run)

    native = whole()
    CBackward.__call__ = timed_call
    try:
        with C_CALL.disabled():
            python = whole()
    finally:
        CBackward.__call__ = original
    return native, python, statistics.median(inner[3:])  # (3 warm-up calls)


def sgemm(reps):
    import numpy as np
    from runtime.cbuild import blas
    lib = blas()
    name = lib.link[1:] if lib.link.startswith(":") else f"lib{lib.link}.so"
    f = getattr(ctypes.CDLL(os.path.join(lib.lib_dir, name)), lib.sgemm)
    n = ctypes.c_int64 if lib.int_type == "int64_t" else ctypes.c_int
    f.argtypes = [ctypes.c_int] * 3 + [n] * 3 + [ctypes.c_float, ctypes.c_void_p, n,
                                                 ctypes.c_void_p, n, ctypes.c_float,
                                                 ctypes.c_void_p, n]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    c = np.empty((256, 1024), np.float32)

    from tracer import median_time

    def median(fn):
        fn()  # warm up
        return median_time(fn, reps)
    row = {"openblas": median(lambda: f(101, 111, 111, 256, 1024, 1024, 1.0, a.ctypes.data,
                                        1024, b.ctypes.data, 1024, 0.0, c.ctypes.data, 1024))}
    try:
        import torch
        torch.set_num_threads(1)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        row["torch"] = median(lambda: ta @ tb)
    except ImportError:
        pass
    return row


GELU_LOOPS = """
#include <stdint.h>
#include <string.h>
#include <math.h>
{% include "math.h.j2" %}
void gelu_libm(float *out, const float *g, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    out[i] = g[i] * ((erff(x[i] * 0.70710678f) + 1.0f) * 0.5f + x[i] * expf(x[i] * x[i] * -0.5f) * 0.39894228f);
}
void gelu_ca(float *out, const float *g, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    out[i] = g[i] * ((ca_erff(x[i] * 0.70710678f) + 1.0f) * 0.5f + x[i] * ca_expf(x[i] * x[i] * -0.5f) * 0.39894228f);
}
void gelu_fused(float *out, const float *g, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    out[i] = g[i] * ca_gelu_grad_f(x[i]);
}
"""
GELU_NAMES = {"libm": "libm erff+expf", "ca": "ca_erff+ca_expf",
              "fused": "ca_gelu_grad (generated)"}


def gelu_loops(reps):
    """Medians of the three GELU-backward loops over 262,144 floats."""
    import numpy as np
    from codegen.c import _ENV
    from runtime import cbuild
    from tracer import median_time
    lib = cbuild.load(cbuild.build(_ENV.from_string(GELU_LOOPS).render())[0])
    x = np.random.default_rng(0).standard_normal(512 * 512).astype(np.float32) * 3
    g = np.random.default_rng(1).standard_normal(x.size).astype(np.float32)
    out = np.empty_like(x)     # (not g itself: repeated in place, g would turn subnormal)
    row = {}
    for name in GELU_NAMES:
        f = getattr(lib, f"gelu_{name}")
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        call = lambda: f(out.ctypes.data, g.ctypes.data, x.ctypes.data, x.size)  # noqa: E731
        call()
        row[GELU_NAMES[name]] = median_time(call, reps)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    print(f"1 thread; medians of {args.reps}")
    print(f"{'case':<12}{'whole, C call':>15}{'whole, Python call':>20}{'C function':>12}"
          f"{'rest, C call':>14}")
    for case in ("small_mlp", "chain", "transformer"):
        native, python, inner = c_function_share(case, args.reps if case != "transformer"
                                                 else max(3, args.reps // 10))
        print(f"{case:<12}{_fmt(native):>15}{_fmt(python):>20}{_fmt(inner):>12}"
              f"{_fmt(native - inner):>14}")
    row = sgemm(max(10, args.reps // 5))
    print("\none sgemm 256x1024x1024: " + ", ".join(f"{k} {_fmt(v)}" for k, v in row.items()))
    row = gelu_loops(max(10, args.reps // 5))
    print("GELU backward loop, 262,144 floats: " +
          ", ".join(f"{k} {_fmt(v)}" for k, v in row.items()))

if __name__ == "__main__":
    main()
