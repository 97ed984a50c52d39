"""Backward time, side by side: ca's eager engine, compiled autograd with the "eager"
(interpreter), "python" (generated code) and "c" (generated C) backends, and torch's
eager autograd,
on the small MLP (8 x 64, batch 32), a 200-op elementwise chain (16 elements), the
large MLP (8 x 1024, batch 256), the transformer (4 layers, d_model 128), and an
MLP of custom Functions (8 x 64, batch 32: a custom tanh saving its output, written
once for ca and torch) whose backward runs as Python (``custom_fn_python``: a
call_backward node) or is traced into the graph (``custom_fn_inlined``:
``inline_backward = True``);
medians, at 1 thread and at the default thread count (each in a fresh process,
since BLAS threads are fixed at start-up). Each mode's backwards run in a process
of its own, as a user runs one library, the modes taking turns by blocks of
backwards in a row (``alone.py``, as step.py: in one process, one library's
allocations change how many pages the other's backwards fault in); the capture,
the cache hit alone and the GEMM floor are measured in a process where torch is
never imported. Compiled times are whole cache hits
(collecting the autograd graph's compiled args, looking up, running the code);
capture+codegen and the cache hit alone (walking the graph for the compiled args
and looking the key up) are reported too, and the C build time of the transformer's backward: cold (a fresh cache
directory) and cached (a second process that finds the library).

The GEMM floor of the large MLP and the transformer: the BLAS calls of the
compiled C program (``CProgram.gemms``: shapes, transposes, leading dimensions,
dtype, batch), made alone in the same order by a small generated C function
through the same BLAS symbol and library the backward links, with the same
threads (the BLAS's jobs on the OpenMP pool), measured in turns with the "c"
backward (three rounds, so that both see the same machine: the table gives the
medians and the median of the rounds' ratios), and torch's beside them. (A batch
of small products runs one after another here, where the backward may spread it
over threads.)

    python benchmarks/backward.py [--reps N]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CASES = ("small_mlp", "chain", "large_mlp", "transformer", "custom_fn_python",
         "custom_fn_inlined")
FLOOR_CASES = ("large_mlp", "transformer")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (the cases, written once)
from alone import PACE, Alone, pace_line, pace_summary, rounds, torch_threads  # noqa: E402


def _functional(lib, case):
    """(make_loss, parameters) of a case of models.py with its own arrays: the chain
    and the custom-Function MLPs, written once for ca and torch."""
    arrays, inputs = models.arrays(case)
    P = models.wrap(lib, arrays)
    loss = models.model(lib, case, inputs)
    return (lambda: loss(P)), list(P.values())


def _torch_setup(case):
    """The case in torch: the MLPs and the transformer on the bundled example's
    weights and inputs (ca's are the example itself, ``_ca_setup``)."""
    import torch
    from compiled_autograd.examples import build
    if case == "chain" or case.startswith("custom_fn"):
        return _functional(torch, case)
    name = "mlp" if "mlp" in case else "transformer"
    ex = build(name, **(models.SIZES[case] if name == "mlp" else {}))
    named = {n: p.detach().numpy() for n, p in ex.model.named_parameters()}
    if name == "mlp":
        P = {}
        for i in range(models.SIZES[case]["layers"]):
            P[f"w{i}"] = torch.tensor(named[f"net.{2 * i}.weight"], requires_grad=True)
            P[f"b{i}"] = torch.tensor(named[f"net.{2 * i}.bias"], requires_grad=True)
        inputs = {"x": ex.inputs["x"].numpy(), "t": ex.inputs["target"].numpy()}
    else:
        P = {n: torch.tensor(a, requires_grad=True) for n, a in named.items()}
        inputs = {"tokens": ex.inputs["tokens"].numpy(),
                  "targets": ex.inputs["targets"].numpy(), "sizes": ex.sizes}
    loss = models.model(torch, case, inputs)
    return (lambda: loss(P)), list(P.values())


def _ca_setup(case):
    import compiled_autograd as ca
    from compiled_autograd.examples import build
    if case == "chain" or case.startswith("custom_fn"):
        return _functional(ca, case)
    ex = build("mlp" if "mlp" in case else "transformer",
               **(models.SIZES[case] if "mlp" in case else {}))
    return ex.loss, ex.parameters()


def _timed_backward(make_loss, params, run):
    """Seconds of ``run(loss)`` on a fresh forward's loss (not timed); the
    gradients dropped after it."""
    loss = make_loss()
    start = time.perf_counter()
    run(loss)
    elapsed = time.perf_counter() - start
    for p in params:
        p.grad = None
    return elapsed


def _median_backward(make_loss, params, reps, run):
    times = [_timed_backward(make_loss, params, run) for _ in range(reps + 3)]
    return statistics.median(times[3:])


MODES = ("eager", "graph:eager", "graph:python", "graph:c", "torch")


def backward_runner(mode, case):
    """(step(): the seconds of one backward, its forward not timed, None): a runner
    of ``alone.py``. ``mode``: ca's eager engine, a compiled backend, or torch."""
    if mode == "torch":
        import torch
        torch_threads(torch)
        make_loss, params = _torch_setup(case)
        run = lambda loss: loss.backward()  # noqa: E731
    else:
        from compiled_autograd.compiled.api import backward_on
        make_loss, params = _ca_setup(case)
        backend = None if mode == "eager" else mode.split(":")[1]
        run = lambda loss: backward_on(loss, backend)  # noqa: E731

    return (lambda: _timed_backward(make_loss, params, run)), None


def measure(reps):
    """Every case at this process's thread count; returns {case: {mode: seconds}}.
    The backward of each mode runs in a process of its own, the modes taking turns
    (``alone.py``); the rest (capture, cache hit, GEMM floor) runs here, where
    torch is never imported."""
    import compiled_autograd as ca
    modes = MODES if importlib.util.find_spec("torch") is not None else MODES[:-1]
    out = {}
    for case in CASES:
        n = max(3, reps // 10) if case in ("large_mlp", "transformer") else reps
        runners = {m: Alone("backward:backward_runner", m, case) for m in modes}
        got = rounds(runners, n)
        for r in runners.values():
            r.close()
        row = {m: statistics.median(t for t, _ in got[m]) for m in modes}
        row[PACE] = pace_summary(got)
        make_loss, params = _ca_setup(case)
        ca.reset_compiled_autograd()
        loss = make_loss()
        start = time.perf_counter()
        with ca.compiled_backward(backend="python"):
            loss.backward()
        row["first (capture+codegen+run)"] = time.perf_counter() - start
        row["capture+codegen"] = ca.compiled_autograd_stats()["compile_seconds"]
        row["cache hit alone"] = _cache_hit_time(make_loss, n)
        if case in FLOOR_CASES:
            row.update(_beside_floor(case, n, make_loss, params))
        out[case] = row
    return out


FLOOR_C = """{% include "prelude.c.j2" %}
void ca_gemm_floor(void **p) {
{% for g in gemms %}
  for (int64_t i = 0; i < {{ g.batch }}; i++)
    {{ g.fn }}(CblasRowMajor, {{ g.ta }}, {{ g.tb }}, {{ g.M }}, {{ g.N }}, {{ g.K }}, 1.0{{ g.f }},
        ({{ g.T }} *)p[{{ 3 * loop.index0 }}] + i * {{ g.sizes[0] }}, {{ g.lda }},
        ({{ g.T }} *)p[{{ 3 * loop.index0 + 1 }}] + i * {{ g.sizes[1] }}, {{ g.ldb }},
        {{ g.beta }}{{ g.f }}, ({{ g.T }} *)p[{{ 3 * loop.index0 + 2 }}] + i * {{ g.sizes[2] }},
        {{ g.ldc }});
{% endfor %}
}
"""


def _beside_floor(case, n, make_loss, params, rounds=3):
    """The GEMM floor and the "c" backward measured in turns (``rounds`` rounds of
    ``n`` each, so that both see the same machine): the medians, and the median of
    the rounds' ratios."""
    from compiled_autograd.compiled.api import backward_on
    floor_once, calls = gemm_floor(case)
    floors, cs = [], []
    for _ in range(rounds):
        floors.append(floor_once(n))
        cs.append(_median_backward(make_loss, params, n, lambda loss: backward_on(loss, "c")))
    return {"gemm floor": statistics.median(floors), "gemm calls": calls,
            "c beside floor": statistics.median(cs),
            "c/floor": statistics.median(c / f for c, f in zip(cs, floors))}


def gemm_floor(case):
    """(a function: median seconds of ``reps`` runs of the case's C backward's GEMM
    calls alone, how many calls)."""
    import ctypes

    import numpy as np

    import compiled_autograd as ca
    from compiled_autograd.codegen.c import generate
    from compiled_autograd.codegen.c_text import ENV
    from compiled_autograd.runtime import cbuild, cthreads
    make_loss, _ = _ca_setup(case)
    gemms = generate(ca.trace_backward(make_loss()).graph).gemms
    rng = np.random.default_rng(0)
    calls, arrays = [], []
    for g in gemms:
        rows_a, cols_a = (g.M, g.K) if g.ta == "CblasNoTrans" else (g.K, g.M)
        rows_b, cols_b = (g.K, g.N) if g.tb == "CblasNoTrans" else (g.N, g.K)
        sizes = [(rows_a - 1) * g.lda + cols_a, (rows_b - 1) * g.ldb + cols_b,
                 (g.M - 1) * g.ldc + g.N]
        arrays += [rng.standard_normal(g.batch * n).astype(g.dtype) for n in sizes]
        single = np.dtype(g.dtype) == np.float32
        calls.append(dict(g._asdict(), sizes=sizes, fn="ca_sgemm" if single else "ca_dgemm",
                          f="f" if single else "", T="float" if single else "double"))
    source = ENV.from_string(FLOOR_C).render(gemms=calls, blas=cbuild.blas(),
                                             data_offset=cbuild.array_data_offset())
    fn = cbuild.load(cbuild.build(source)[0]).ca_gemm_floor
    cthreads.share_blas_threads()       # the backward's BLAS threads
    pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])

    def once(reps, _arrays=arrays):     # (the arrays live as long as their pointers)
        times = []
        for i in range(reps + 2):
            start = time.perf_counter()
            fn(pointers)
            if i >= 2:
                times.append(time.perf_counter() - start)
        return statistics.median(times)
    return once, sum(g.batch for g in gemms)


def _cache_hit_time(make_loss, reps):
    """The code a cache hit runs before the compiled function: root gradients,
    collecting the compiled args (walking the graph), the lookup
    (``compiled.lookup``)."""
    import compiled_autograd as ca
    from compiled_autograd.compiled import api as compiled
    from compiled_autograd.autograd import engine
    options = ca.compiled_backward(backend="python")
    with options:
        make_loss().backward()      # fills the cache
    times = []
    for _ in range(reps):
        loss = make_loss()
        start = time.perf_counter()
        roots = engine.make_root_grads([loss], None, False)
        compiled.lookup(roots, None, True, options)
        times.append(time.perf_counter() - start)
        # The roots hold the graph: free it here, not in the next timed hit.
        del roots, loss
    assert ca.compiled_autograd_stats()["cache_hits"] >= reps
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--worker", choices=["1", "default"], help=argparse.SUPPRESS)
    parser.add_argument("--build-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_worker:
        _build_worker()
        return
    if args.worker:
        print(json.dumps(measure(args.reps)))
        return
    results = {}
    for threads in ("1", "default"):
        env = dict(os.environ)
        if threads == "1":
            env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                       CA_BENCH_THREADS="1")
        proc = subprocess.run([sys.executable, __file__, "--reps", str(args.reps),
                               "--worker", threads], env=env, capture_output=True, text=True,
                              check=True)
        results[threads] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg())
          + f"; medians of about {args.reps} (large MLP and transformer: "
          f"{max(3, args.reps // 10)}); each mode's backwards in a process of its own, "
          "the modes taking turns by blocks of backwards")
    modes = ["eager", "graph:eager", "graph:python", "graph:c", "torch"]
    for threads, res in results.items():
        print(f"\nthreads: {threads}")
        print(f"{'case':<12}" + "".join(f"{m:>14}" for m in modes) +
              f"{'python/eager':>14}{'python/torch':>14}{'c/torch':>10}")
        for case, row in res.items():
            cells = "".join(f"{_fmt(row.get(m)):>14}" for m in modes)
            ratio = row["graph:python"] / row["eager"]
            vs_torch = (f"{row['graph:python'] / row['torch']:>14.2f}"
                        f"{row['graph:c'] / row['torch']:>10.2f}" if "torch" in row
                        else f"{'-':>14}{'-':>10}")
            print(f"{case:<12}{cells}{ratio:>14.2f}{vs_torch}")
        print(f"{'case':<12}{'capture+codegen':>18}{'first backward':>16}"
              f"{'cache hit alone':>17}{'hit/eager':>11}")
        for case, row in res.items():
            print(f"{case:<12}{_fmt(row['capture+codegen']):>18}"
                  f"{_fmt(row['first (capture+codegen+run)']):>16}"
                  f"{_fmt(row['cache hit alone']):>17}"
                  f"{row['cache hit alone'] / row['eager']:>11.3f}")
        for case, row in res.items():
            print(f"{case:<18}{pace_line(row[PACE])}")
    print("\nGEMM floor: the C backward's BLAS calls alone (same library, symbols, threads),"
          " measured in turns with the \"c\" backward (3 rounds; c/floor: the median ratio)")
    print(f"{'threads':<9}{'case':<13}{'calls':>6}{'floor':>11}{'graph:c':>11}{'c/floor':>9}"
          f"{'torch':>11}{'torch/floor':>13}")
    for threads, res in results.items():
        for case in FLOOR_CASES:
            row = res[case]
            torch_cells = (f"{_fmt(row['torch']):>11}{row['torch'] / row['gemm floor']:>13.2f}"
                           if "torch" in row else f"{'-':>11}{'-':>13}")
            print(f"{threads:<9}{case:<13}{row['gemm calls']:>6}{_fmt(row['gemm floor']):>11}"
                  f"{_fmt(row['c beside floor']):>11}{row['c/floor']:>9.2f}"
                  + torch_cells)
    cold, cached = _build_times()
    print(f"\nC backend, transformer backward: generate {_fmt(cold['generate'])}, "
          f"build {_fmt(cold['build'])} (cold, compiled={cold['compiled']}), "
          f"second process {_fmt(cached['build'])} (compiled={cached['compiled']}); "
          f"{cold['arena']}")


def _build_times():
    """C build of the transformer's backward: cold, then cached in a new process."""
    import tempfile
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CA_CACHE_DIR=cache)
        rows = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, __file__, "--build-worker"], env=env,
                                  capture_output=True, text=True, check=True)
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        return rows


def _build_worker():
    import compiled_autograd as ca
    from compiled_autograd.codegen.c_run import C_CALL, CBackward
    from compiled_autograd.examples import build
    graph = ca.trace_backward(build("transformer").loss()).graph
    C_CALL.module()     # built once per machine, not per backward: not timed here
    start = time.perf_counter()
    fn = CBackward(graph, build=False)
    generated = time.perf_counter() - start
    fn.build()
    print(json.dumps({"generate": generated, "build": fn.build_seconds,
                      "compiled": fn.built_now, "arena": fn.memory_plan.summary()}))


def _fmt(seconds):
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f}ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f}us"


if __name__ == "__main__":
    main()
