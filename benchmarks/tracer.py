"""Compiled autograd's fixed costs, for the bundled transformer: the capture (collect
compiled args, trace, passes, compile with the "eager" interpreter backend) and a
cache hit (walk the graph for the compiled args, look the key up) after a fresh
forward, each as a fraction of the eager backward; then capture time against depth (1 to 64 layers),
which must grow linearly. Medians; one run.

    python benchmarks/tracer.py [--reps N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import compiled_autograd as ca
from compiled_autograd.compiled import api as compiled
from compiled_autograd.ir import passes
from compiled_autograd.compiled import tracer
from compiled_autograd.examples import build
from compiled_autograd.compiled.interpreter import Interpreter
from compiled_autograd.ir.symbolic import ShapeEnv


def _roots(loss):
    from compiled_autograd.autograd import engine
    return engine.make_root_grads([loss], None, create_graph=False)


def collect_and_lookup(loss, options):
    """What a cache hit costs before the graph runs (``compiled.lookup``; the
    cache holds this graph: see ``warm``)."""
    return compiled.lookup(_roots(loss), None, True, options)


def warm(loss):
    """Compile ``loss``'s backward (backend "eager") into the cache; the options
    to look it up with."""
    options = ca.compiled_backward(backend="eager")
    compiled.lookup(_roots(loss), None, True, options)
    return options


def capture(loss):
    """Collect, trace, run the passes and build the interpreter."""
    roots = _roots(loss)
    task, collected, key = compiled._prepare(roots, None, True, record=True)
    with ShapeEnv():
        traced = tracer.trace(task, roots, collected, 0)
        passes.eliminate_dead_code(traced.graph)
        passes.place_reads(traced.graph, "progressive")
    Interpreter(traced.graph)
    return traced.graph


def hit_time(make_loss, options, reps):
    """Median cache hit after a fresh forward (untimed) of ``make_loss``."""
    times = []
    for _ in range(reps):
        loss = make_loss()
        start = time.perf_counter()
        collect_and_lookup(loss, options)
        times.append(time.perf_counter() - start)
        del loss
    return statistics.median(times)


def median_time(fn, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()

    ex = build("transformer")
    loss = ex.loss()
    graph = capture(loss)
    nodes = len(graph.nodes)

    def eager():
        l = ex.loss()
        start = time.perf_counter()
        l.backward()
        ex.zero_grad()
        return time.perf_counter() - start
    t_eager = statistics.median(eager() for _ in range(args.reps))
    t_capture = median_time(lambda: capture(loss), args.reps)
    options = warm(loss)
    t_hit = hit_time(ex.loss, options, args.reps)
    print(f"transformer {ex.sizes}")
    print(f"graph: {nodes} nodes; median of {args.reps}")
    print(f"{'':<30} {'time':>10} {'/ eager backward':>17}")
    print(f"{'eager backward':<30} {t_eager * 1e3:>8.2f}ms {1:>17.3f}")
    print(f"{'capture (trace+passes+compile)':<30} {t_capture * 1e3:>8.2f}ms "
          f"{t_capture / t_eager:>17.3f}")
    print(f"{'cache hit (collect+lookup)':<30} {t_hit * 1e3:>8.2f}ms {t_hit / t_eager:>17.3f}")
    print()
    print("capture time against depth (d_model 32, 2 heads, seq 16, batch 2)")
    print(f"{'layers':>6} {'nodes':>7} {'capture':>10} {'per layer':>10} {'cache hit':>10}")
    for layers in (1, 2, 4, 8, 16, 32, 64):
        exl = build("transformer", layers=layers, d_model=32, heads=2, seq=16, batch=2,
                    vocab=50)
        lossl = exl.loss()
        g = capture(lossl)
        reps = max(3, args.reps // 3)
        t = median_time(lambda: capture(lossl), reps)
        optionsl = warm(lossl)
        h = hit_time(exl.loss, optionsl, reps)
        print(f"{layers:>6} {len(g.nodes):>7} {t * 1e3:>8.2f}ms {t / layers * 1e3:>8.3f}ms "
              f"{h * 1e3:>8.2f}ms")


if __name__ == "__main__":
    main()
