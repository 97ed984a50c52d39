"""Where a forward's time goes: one case's forward (``models.py``) in ca and in torch,
and ca's kernel time per prim (each prim's numpy kernel timed around its call), at
1 thread. Medians over ``--reps`` forwards; the kernels' times are the sums of one
forward, their median over the forwards.

    python benchmarks/forward_kernels.py [--case transformer] [--reps 15]
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
import models  # noqa: E402


def median_seconds(fn, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="transformer")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    import torch

    import compiled_autograd as ca
    from compiled_autograd.runtime.prims import PRIMS
    torch.set_num_threads(1)
    arrays, inputs = models.arrays(args.case)
    ca_loss, torch_loss = models.model(ca, args.case, inputs), models.model(torch, args.case, inputs)
    P, TP = models.wrap(ca, arrays), models.wrap(torch, arrays)
    ca_loss(P), torch_loss(TP)
    t_ca = median_seconds(lambda: ca_loss(P), args.reps)
    t_torch = median_seconds(lambda: torch_loss(TP), args.reps)
    spent, calls, kernels = {}, {}, {}
    for name, prim in PRIMS.items():
        kernels[name] = kernel = prim.kernel

        def timed(*a, _kernel=kernel, _name=name, **kw):
            start = time.perf_counter()
            try:
                return _kernel(*a, **kw)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - start
                calls[_name] = calls.get(_name, 0) + 1
        prim.kernel = timed
    per_forward = []
    try:
        for _ in range(args.reps):
            spent.clear()
            calls.clear()
            ca_loss(P)
            per_forward.append((dict(spent), dict(calls)))
    finally:
        for name, kernel in kernels.items():
            PRIMS[name].kernel = kernel
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, 1 thread; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.case}, medians of "
          f"{args.reps} forwards")
    print(f"forward: ca {t_ca * 1e3:.2f} ms, torch {t_torch * 1e3:.2f} ms ({t_ca / t_torch:.2f}x)")
    names = per_forward[0][0]
    rows = sorted(((statistics.median(s[n] for s, _ in per_forward), n, per_forward[0][1][n])
                   for n in names), reverse=True)
    total = statistics.median(sum(s.values()) for s, _ in per_forward)
    print(f"{'prim':<22}{'calls':>6}{'kernel time':>13}{'share':>8}")
    for seconds, name, n in rows[:10]:
        print(f"{name:<22}{n:>6}{seconds * 1e3:>10.2f} ms{seconds / t_ca:>8.0%}")
    print(f"{'all kernels':<22}{'':>6}{total * 1e3:>10.2f} ms{total / t_ca:>8.0%}")


if __name__ == "__main__":
    main()
