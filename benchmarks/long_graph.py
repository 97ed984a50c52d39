"""Long graphs (issue 29, item 5): a differentiable simulation, ``steps`` of
``h = (h * 0.999 + 0.001).tanh()`` on a vector of 64, differentiated with respect
to h's start. For each length, on each backend: the capture (``trace_backward``:
collect, trace, passes), the code generation (Python source, or C source and
then its build by the C compiler, shown apart), a cache hit (the compiled
backward of a fresh forward of the same graph) and eager's backward; per graph
node in microseconds too, which must stay flat as the graph grows (linear
time). Medians of ``--reps`` runs.

    python benchmarks/long_graph.py [--steps 250,500,1000,2000,4000] [--reps 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compiled_autograd as ca  # noqa: E402
from compiled_autograd.codegen import c as c_codegen  # noqa: E402
from compiled_autograd.codegen import python as py_codegen  # noqa: E402
from compiled_autograd.runtime import cbuild  # noqa: E402


def simulate(steps):
    x = ca.tensor(np.linspace(-1, 1, 64), requires_grad=True)
    h = x
    for _ in range(steps):
        h = (h * 0.999 + 0.001).tanh()
    return x, h.sum()


def _median(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(steps, backend, reps):
    _, loss = simulate(steps)
    g = ca.trace_backward(loss)
    nodes = len(g.graph.nodes)
    capture = _median(lambda: ca.trace_backward(loss), reps)
    build = None
    if backend == "python":
        codegen = _median(lambda: py_codegen.compile_graph(g.graph), reps)
    else:
        codegen = _median(lambda: c_codegen.generate(g.graph), reps)
        prog = c_codegen.generate(g.graph)
        t0 = time.perf_counter()
        cbuild.build(prog.sources)
        build = time.perf_counter() - t0
    ca.reset_compiled_autograd()
    hits = []
    with ca.compiled_backward(backend=backend):
        for _ in range(reps + 1):
            _, loss = simulate(steps)
            t0 = time.perf_counter()
            loss.backward()
            hits.append(time.perf_counter() - t0)
    stats = ca.compiled_autograd_stats()
    assert stats["compiles"] == 1, stats
    hit = statistics.median(hits[1:])

    def eager():
        _, loss = simulate(steps)
        return loss
    eager_times = []
    for _ in range(reps):
        loss = eager()
        t0 = time.perf_counter()
        loss.backward()
        eager_times.append(time.perf_counter() - t0)
    return nodes, capture, codegen, build, hit, statistics.median(eager_times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="250,500,1000,2000,4000")
    parser.add_argument("--backends", default="python,c")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("CA_CACHE_DIR", tempfile.mkdtemp(prefix="ca-long-graph-"))
    if "c" in args.backends.split(","):
        from compiled_autograd.codegen.c_run import C_CALL
        C_CALL.module()        # (built once per cache: not in the first row's hit)
    print(f"recursion limit {sys.getrecursionlimit()}; times in ms, then us per graph node")
    print(f"{'backend':8} {'steps':>6} {'nodes':>6} {'capture':>9} {'codegen':>9} "
          f"{'C build':>9} {'hit':>8} {'eager':>8} | {'capture':>8} {'codegen':>8} "
          f"{'hit':>6}")
    for backend in args.backends.split(","):
        for steps in map(int, args.steps.split(",")):
            nodes, capture, codegen, build, hit, eager = measure(steps, backend, args.reps)
            per = 1e6 / nodes
            build_text = "-" if build is None else f"{build * 1e3:9.1f}"
            print(f"{backend:8} {steps:6d} {nodes:6d} {capture * 1e3:9.1f} {codegen * 1e3:9.1f} "
                  f"{build_text:>9} {hit * 1e3:8.2f} {eager * 1e3:8.2f} | "
                  f"{capture * per:8.1f} {codegen * per:8.1f} {hit * per:6.2f}", flush=True)


if __name__ == "__main__":
    main()
