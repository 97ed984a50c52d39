"""Where a cache hit's time goes on the small graphs of backward.py: the whole hit
(``compiled.lookup``, as backward.py times it), hashing its key, and the
garbage-collector passes the hit sets off (counted with ``gc.callbacks``), each a
median over fresh forwards, at 1 thread.

    python benchmarks/hit_breakdown.py [--reps N]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import backward  # noqa: E402  (the same cases)


def breakdown(case, reps):
    import compiled_autograd as ca
    from compiled_autograd.compiled import api as compiled
    from compiled_autograd.autograd import engine
    make_loss, _ = backward._ca_setup(case)
    options = ca.compiled_backward(backend="python")
    with options:
        make_loss().backward()                     # fills the cache
    in_hit, passes, hit_times, hash_times = [False], [], [], []
    started = [0.0]

    def on_gc(phase, info):
        if not in_hit[0]:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            passes.append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    try:
        for _ in range(reps):
            loss = make_loss()
            in_hit[0] = True
            start = time.perf_counter()
            roots = engine.make_root_grads([loss], None, False)
            task, collected, _ = compiled.lookup(roots, None, True, options)
            hit_times.append(time.perf_counter() - start)
            in_hit[0] = False
            key = collected.freeze()
            start = time.perf_counter()
            hash(key)
            hash_times.append(time.perf_counter() - start)
            nodes, items = len(task.nodes), len(key)
            del roots, loss, task, collected, key
    finally:
        gc.callbacks.remove(on_gc)
    return dict(nodes=nodes, key_items=items, hit=statistics.median(hit_times),
                hash=statistics.median(hash_times), passes=len(passes) / reps,
                pass_time=statistics.median(passes) if passes else 0.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    args = parser.parse_args()
    print(f"medians of {args.reps} hits, each after a fresh forward")
    print(f"{'case':<11}{'nodes':>7}{'key items':>11}{'whole hit':>11}{'hash(key)':>11}"
          f"{'gc passes/hit':>15}{'gc pass':>10}")
    for case in ("small_mlp", "chain"):
        r = breakdown(case, args.reps)
        print(f"{case:<11}{r['nodes']:>7}{r['key_items']:>11}{r['hit'] * 1e6:>9.0f}us"
              f"{r['hash'] * 1e6:>9.1f}us{r['passes']:>15.2f}{r['pass_time'] * 1e6:>8.0f}us")


if __name__ == "__main__":
    main()
