"""The libraries' own cost per training step, without their kernels: the
benchmark transformer's graph (4 layers, 108 autograd nodes, 54 parameters) at
tiny sizes (d_model 8, 4 heads, seq 4, batch 1, vocab 10), where each kernel takes
a microsecond or two, so a step is almost all framework: the forward's dispatch,
Tensors and nodes, and the backward's engine (torch) or key walk, lookup and call
(ca "c"). Each library in a process of its own (alone.py), 1 thread, the two
taking turns by blocks of steps.

Twice: with the caches warm (steps back to back), and "cold": a 32 MB buffer
written before the forward and again before the backward (untimed), as the real
transformer's kernels leave the caches -- its activations, weights and GEMM
buffers pass through them between two ops, so the Python of each op finds its
objects and code evicted. The difference is what the framework's memory
traffic costs a real step.

    python benchmarks/step_overhead.py [--reps N]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import alone  # noqa: E402
import models  # noqa: E402

TINY = dict(layers=4, d_model=8, heads=4, seq=4, batch=1, vocab=10)
FLUSH_BYTES = 32 << 20


def runner(lib, cold):
    """(step, info): one step gives [forward seconds, backward seconds]."""
    import numpy as np
    params, inputs = models.arrays("transformer", **TINY)
    if lib == "torch":
        import torch
        torch.set_num_threads(1)
        L, backward = torch, (lambda loss: loss.backward())
    else:
        import compiled_autograd as L
        from compiled_autograd.compiled.api import backward_on
        backward = (lambda loss: backward_on(loss, "c"))
    P = models.wrap(L, params)
    loss_fn = models.model(L, "transformer", inputs)
    buffer = np.zeros(FLUSH_BYTES // 8) if cold else None

    def flush():
        if buffer is not None:
            np.add(buffer, 1.0, out=buffer)

    def step():
        flush()
        start = time.perf_counter()
        loss = loss_fn(P)
        forward = time.perf_counter() - start
        flush()
        start = time.perf_counter()
        backward(loss)
        seconds = [forward, time.perf_counter() - start]
        del loss
        for p in P.values():
            p.grad = None
        return seconds
    return step, models.count_nodes(loss_fn(P))    # (torch's count has its views' nodes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, 1 thread; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg())
          + f"; the transformer at {TINY}; medians of {args.reps} steps")
    print(f"{'caches':<8}{'library':<10}{'nodes':>6}{'forward':>10}{'backward':>10}"
          f"{'step':>10}")
    runners = {(cold, lib): alone.Alone("step_overhead:runner", lib, cold)
               for cold in (False, True) for lib in ("torch", "ca c")}
    try:
        got = alone.rounds(runners, args.reps)     # (all four take turns)
    finally:
        for r in runners.values():
            r.close()
    rows = {}
    for (cold, lib) in runners:
        steps = got[(cold, lib)]
        fwd = statistics.median(s[0] for s, _ in steps)
        bwd = statistics.median(s[1] for s, _ in steps)
        step = statistics.median(s[0] + s[1] for s, _ in steps)
        nodes = runners[(cold, lib)].info
        rows[(cold, lib)] = step
        print(f"{'cold' if cold else 'warm':<8}{lib:<10}{nodes:>6}{fwd * 1e6:>8.0f}us"
              f"{bwd * 1e6:>8.0f}us{step * 1e6:>8.0f}us")
    for lib in ("torch", "ca c"):
        print(f"{lib}: cold step - warm step = "
              f"{(rows[(True, lib)] - rows[(False, lib)]) * 1e6:.0f} us")
    print(alone.pace_line(alone.pace_summary(got)))


if __name__ == "__main__":
    main()
