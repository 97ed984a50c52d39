"""Where the C backend's time goes, at 1 thread: the generated C function alone
against the whole compiled backward (the rest: the cache lookup and the call),
with the call in C (codegen/c_call.c, the default) and in Python
(``CA_C_CALL=0``), on the small MLP, the 200-op chain and the transformer, and one
256x1024x1024 sgemm in the OpenBLAS the generated code links (numpy's) against torch,
and GELU's backward loop over one transformer layer's 512x512 activations three
ways: libm's scalar erff/expf, the backend's vectorisable ca_erff/ca_expf, and the
one helper the backend generates for the gelu_backward prim (ca_gelu_grad_f: one
exp shared by erf's tail and the density), built with the backend's own flags.
Last, the transformer's generated C by kind of statement -- the BLAS calls
against the generated loops (elementwise, reductions over rows or columns,
row-wise softmax / layer_norm) -- at 1 thread and at the default thread count
(each in a fresh process): the C built once more with a clock read before each
statement, in a private cache directory. And the large MLP's "c" backward with its
minor page faults (``getrusage``), with compiled autograd's caching allocator
(runtime/pool.c) and without it (``CA_POOL=0``: glibc's malloc as it is), each in
a fresh process.

    python benchmarks/c_breakdown.py [--reps N]
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

if "--kinds-worker" not in sys.argv:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))


def _fmt(seconds):
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


CALLBACK_LOOP = """
typedef int (*ca_callback)(int site, void **results, int *done);
int ca_callback_loop(ca_callback cb, int n) {
  for (int i = 0; i < n; i++) {
    int done = 0;
    if (cb(0, 0, &done) || done != 1) return 1;
  }
  return 0;
}
"""


def callback_transition(n=20000):
    """Seconds of one C->Python->C round trip of a ctypes callback like the
    Python call path's, outside the Python function it runs (the median of 5
    loops of ``n`` callbacks from C, less the time measured inside them)."""
    import ctypes

    from compiled_autograd.codegen.c_run import CALLBACK
    from compiled_autograd.runtime import cbuild
    loop = cbuild.load(cbuild.build(CALLBACK_LOOP)[0]).ca_callback_loop
    loop.argtypes, loop.restype = [CALLBACK, ctypes.c_int], ctypes.c_int
    inside = [0.0]

    def body(index, results, done):
        done[0] = 1
        return 0

    def timed(*a):        # (as c_function_share's timed callback)
        start = time.perf_counter()
        try:
            return body(*a)
        finally:
            inside[0] += time.perf_counter() - start
    callback = CALLBACK(timed)
    rounds = []
    for _ in range(5):
        inside[0] = 0.0
        start = time.perf_counter()
        assert loop(callback, n) == 0
        rounds.append((time.perf_counter() - start - inside[0]) / n)
    return statistics.median(rounds)


def c_function_share(case, reps):
    """(median whole compiled backward with the call in C, the same with the call
    in Python, median of the generated function alone). The function is timed on
    the Python call path, where it is a ctypes call that can be wrapped; in a
    program with callbacks, less the time inside them (their Python: the hooks
    and the glue) and less their C->Python transitions (``callback_transition``,
    times the number of callbacks)."""
    import backward
    import compiled_autograd as ca
    from compiled_autograd.codegen.c_run import CALLBACK, C_CALL, CBackward
    make_loss, params = backward._ca_setup(case)
    inner = []
    original = CBackward.__call__
    transition = callback_transition()

    def timed_call(self, *args):
        fn, callback = self.fn, self._callback
        in_callbacks = [0.0, 0]
        on_callback = self._on_callback

        def timed_callback(*a):
            in_callbacks[1] += 1
            start = time.perf_counter()
            try:
                return on_callback(*a)
            finally:
                in_callbacks[0] += time.perf_counter() - start

        def timed_fn(*a):
            start = time.perf_counter()
            rc = fn(*a)    # (its last argument: the timed callback)
            inner.append(time.perf_counter() - start - in_callbacks[0]
                         - in_callbacks[1] * transition)
            return rc
        self.fn = timed_fn
        self._callback = CALLBACK(timed_callback)
        try:
            return original(self, *args)
        finally:
            self.fn, self._callback = fn, callback

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
    from compiled_autograd.runtime.cbuild import blas
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
{% include "ca_math.h" %}
void gelu_libm(float *out, const float *g, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    out[i] = g[i] * ((erff(x[i] * 0.70710678f) + 1.0f) * 0.5f
                     + x[i] * expf(x[i] * x[i] * -0.5f) * 0.39894228f);
}
void gelu_ca(float *out, const float *g, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    out[i] = g[i] * ((ca_erff(x[i] * 0.70710678f) + 1.0f) * 0.5f
                     + x[i] * ca_expf(x[i] * x[i] * -0.5f) * 0.39894228f);
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
    from compiled_autograd.codegen.c import _ENV
    from compiled_autograd.runtime import cbuild
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


_CLOCK = """#define _POSIX_C_SOURCE 199309L
#include <time.h>
extern double ca_stmt_seconds[8192]; extern double ca_stmt_last; extern int ca_stmt_now;
static inline void ca_stmt(int id) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  double n = t.tv_sec + t.tv_nsec * 1e-9;
  if (ca_stmt_now >= 0) ca_stmt_seconds[ca_stmt_now] += n - ca_stmt_last;
  ca_stmt_now = id; clock_gettime(CLOCK_MONOTONIC, &t);
  ca_stmt_last = t.tv_sec + t.tv_nsec * 1e-9; }
"""
_END = 8191


def statement_kind(text):
    """What a generated C statement is, from its text."""
    if "gemm(" in text:
        return "GEMM (BLAS)"
    if "cb(" in text:
        return "callback"
    if "*xr" in text:
        return "loops: softmax / layer_norm rows"
    if "int64_t j =" in text:
        return "loops: gather / index"
    if "acc =" in text:
        return "loops: reduction over rows"
    if "for (int64_t k = 0" in text:
        return "loops: reduction over columns"
    return "loops: elementwise / copy"


def statement_kinds(case, reps):
    """{kind: [statements, seconds per backward]}, and the whole backward's median."""
    from compiled_autograd.codegen import c as c_emitter
    from compiled_autograd.runtime import cbuild
    kinds = []
    emit, build, load = c_emitter.Emitter.emit, cbuild.build, cbuild.load

    def timed_emit(self, text, source="", sets=()):
        kinds.append(statement_kind(text))
        return emit(self, f"ca_stmt({len(kinds) - 1});\n{text}", source, sets)

    def timed_build(sources, *a, **k):
        sources = [_CLOCK + ("double ca_stmt_seconds[8192]; double ca_stmt_last; "
                             "int ca_stmt_now = -1;\n" if i == 0 else "")
                   + src.replace("  return 0;\n}", f"  ca_stmt({_END});\n  return 0;\n}}")
                   for i, src in enumerate(sources)]
        return build(sources, *a, **k)
    libs = []
    c_emitter.Emitter.emit, cbuild.build = timed_emit, timed_build
    cbuild.load = lambda path: libs.append(load(path)) or libs[-1]
    try:
        seconds, whole = clocked_backwards(case, reps, libs, "ca_stmt_seconds", 8192)
    finally:
        c_emitter.Emitter.emit, cbuild.build, cbuild.load = emit, build, load
    return tally(kinds, seconds, reps), statistics.median(whole)


def clocked_backwards(case, reps, libs, symbol, size):
    """``case``'s "c" backward, ``reps`` + 3 times in a fresh C cache (the caller's
    patched build adds clocks to the C; ``libs`` gets each library loaded): the C
    array ``symbol`` (``size`` doubles) zeroed after the miss and two warm-ups, and
    the timed backwards' seconds."""
    import backward
    import compiled_autograd as ca
    from compiled_autograd.compiled.api import backward_on
    make_loss, params = backward._ca_setup(case)
    whole = []
    try:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["CA_CACHE_DIR"] = cache
            ca.reset_compiled_autograd()
            for i in range(reps + 3):
                if i == 3:    # after the miss and two warm-up calls
                    seconds = (ctypes.c_double * size).in_dll(libs[-1], symbol)
                    ctypes.memset(seconds, 0, ctypes.sizeof(seconds))
                loss = make_loss()
                start = time.perf_counter()
                backward_on(loss, "c")
                if i >= 3:
                    whole.append(time.perf_counter() - start)
                for p in params:
                    p.grad = None
    finally:
        ca.reset_compiled_autograd()
    return seconds, whole


def tally(names, seconds, reps):
    """{name: [how many, seconds per backward]} of clocked statements or steps."""
    out = collections.defaultdict(lambda: [0, 0.0])
    for k, name in enumerate(names):
        out[name][0] += 1
        out[name][1] += seconds[k] / reps
    return dict(out)


def print_statement_kinds(reps):
    rows = {}
    for threads in ("1", "default"):
        env = dict(os.environ)
        if threads == "1":
            env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        else:
            for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
                env.pop(name, None)
        done = subprocess.run([sys.executable, __file__, "--kinds-worker", "--reps", str(reps)],
                              env=env, capture_output=True, text=True, check=True)
        rows[threads] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\ntransformer's generated C by statement kind (clock per statement), mean of "
          f"{reps}; whole backward median (instrumented): " +
          ", ".join(f"{t} thread(s) {_fmt(r['whole'])}" for t, r in rows.items()))
    print(f"{'kind':<34}{'stmts':>6}" + "".join(f"{t + ' thr':>14}" for t in rows))
    kinds = sorted(rows["1"]["kinds"], key=lambda k: -rows["1"]["kinds"][k][1])
    for kind in kinds:
        print(f"{kind:<34}{rows['1']['kinds'][kind][0]:>6}" + "".join(
            f"{_fmt(r['kinds'].get(kind, [0, 0.0])[1]):>14}" for r in rows.values()))
    print(f"{'all statements':<34}{'':>6}" + "".join(
        f"{_fmt(sum(v[1] for v in r['kinds'].values())):>14}" for r in rows.values()))


def faults(case, reps):
    """(median seconds, median minor page faults) of the case's "c" backward, each
    after a fresh forward, every .grad None (as backward.py times it)."""
    import resource

    import backward
    import compiled_autograd as ca
    make_loss, params = backward._ca_setup(case)
    times, counts = [], []
    for i in range(reps + 3):
        loss = make_loss()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        with ca.compiled_backward(backend="c"):
            loss.backward()
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for q in params:
            q.grad = None
        del loss
        if i >= 3:
            times.append(elapsed)
            counts.append(after - before)
    return statistics.median(times), statistics.median(counts)


# Without the pool, glibc returns freed blocks over its (adaptive) mmap threshold
# to the kernel, and the next call's fresh arrays fault their pages in again.
POOL_OFF = {"CA_POOL": "0"}


def print_faults(reps):
    rows = {}
    for name, extra in (("caching allocator", {}), ("CA_POOL=0 (malloc)", POOL_OFF)):
        done = subprocess.run([sys.executable, __file__, "--faults-worker", "--reps", str(reps)],
                              env=dict(os.environ, **extra), capture_output=True, text=True,
                              check=True)
        rows[name] = json.loads(done.stdout.strip().splitlines()[-1])
    print("\nlarge MLP backward on \"c\", 1 thread, median of %d: time and minor page "
          "faults per backward" % reps)
    for name, (seconds, count) in rows.items():
        print(f"{name:<22}{_fmt(seconds):>10}{count:>10.0f} faults")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--kinds-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--faults-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kinds_worker:
        kinds, whole = statement_kinds("transformer", args.reps)
        print(json.dumps({"kinds": kinds, "whole": whole}))
        return
    if args.faults_worker:
        print(json.dumps(faults("large_mlp", args.reps)))
        return
    print(f"1 thread; medians of {args.reps}")
    print(f"{'case':<12}{'whole, C call':>15}{'whole, Python call':>20}{'C function':>12}"
          f"{'rest, C call':>14}")
    for case in ("small_mlp", "chain", "transformer", "custom_fn_python"):
        native, python, inner = c_function_share(case, args.reps if case != "transformer"
                                                 else max(3, args.reps // 10))
        print(f"{case:<12}{_fmt(native):>15}{_fmt(python):>20}{_fmt(inner):>12}"
              f"{_fmt(native - inner):>14}")
    row = sgemm(max(10, args.reps // 5))
    print("\none sgemm 256x1024x1024: " + ", ".join(f"{k} {_fmt(v)}" for k, v in row.items()))
    row = gelu_loops(max(10, args.reps // 5))
    print("GELU backward loop, 262,144 floats: " +
          ", ".join(f"{k} {_fmt(v)}" for k, v in row.items()))
    print_statement_kinds(max(5, args.reps // 5))
    print_faults(max(5, args.reps // 10))

if __name__ == "__main__":
    main()
