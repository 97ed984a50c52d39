"""Where a forward's time goes: one case's forward (``models.py``) in ca and in torch,
and ca's kernel time per prim (each prim's numpy kernel timed around its call), at
1 thread. Medians over ``--reps`` forwards; the kernels' times are the sums of one
forward, their median over the forwards.

Then the products (linear and matmul) of one forward, each call in the forward and
the same call alone, run again on the same arrays ``--reps`` times in a row
(its inputs and its output's memory warm in the caches): their multiply-adds per
second, and what the forward's memory costs them.

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
    products(ca_loss, P, args.reps)


def _flops(name, args, params):
    """Floating-point operations of one linear or matmul call (a block-triangular
    product: its blocks')."""
    from compiled_autograd.runtime.prims_reduce import tri_blocks
    if name == "linear":
        x, w = args[0], args[1]
        return 2 * (x.size // x.shape[-1]) * w.shape[0] * w.shape[1]
    a, b = args
    batch = max(a.size // (a.shape[-2] * a.shape[-1] or 1),
                b.size // (b.shape[-2] * b.shape[-1] or 1))
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    tri = params.get("tri")
    if tri is None:
        return 2 * batch * M * N * K
    return 2 * batch * sum((r1 - r0) * (c1 - c0) * (k1 - k0)
                           for r0, r1, c0, c1, k0, k1 in tri_blocks(tri, M, N, K))


def products(loss_of, P, reps):
    """Each linear and matmul call of a forward: its time there, and alone."""
    from compiled_autograd.runtime.prims import PRIMS
    seen = []
    kernels = {n: PRIMS[n].kernel for n in ("linear", "matmul")}

    def recorder(name):
        def run(*a, **kw):
            start = time.perf_counter()
            out = kernels[name](*a, **kw)
            seen.append((name, a, kw, time.perf_counter() - start))
            return out
        return run
    in_forward = {}
    try:
        for _ in range(reps):
            seen.clear()
            for n in kernels:
                PRIMS[n].kernel = recorder(n)
            loss_of(P)
            for n in kernels:
                PRIMS[n].kernel = kernels[n]
            for i, (name, a, kw, t) in enumerate(seen):
                in_forward.setdefault(i, []).append(t)
    finally:
        for n, k in kernels.items():
            PRIMS[n].kernel = k
    rows = {}
    for i, (name, a, kw, _) in enumerate(seen):
        alone = median_seconds(lambda: kernels[name](*a, **kw), reps)
        shape = (name, tuple(a[0].shape), tuple(a[1].shape), kw.get("tri"))
        r = rows.setdefault(shape, [0, 0.0, 0.0, _flops(name, a, kw)])
        r[0] += 1
        r[1] += statistics.median(in_forward[i])
        r[2] += alone
    print("products: each call in the forward and alone (the same arrays, warm)")
    print(f"{'prim':<8}{'a':>18}{'b':>16}{'tri':>10}{'calls':>6}{'forward':>11}{'GFLOPS':>8}"
          f"{'alone':>11}{'GFLOPS':>8}{'ratio':>7}")
    tot = [0.0, 0.0]
    for (name, a, b, tri), (n, fwd, alone, flops) in rows.items():
        tot[0] += fwd
        tot[1] += alone
        print(f"{name:<8}{str(a):>18}{str(b):>16}{str(tri or ''):>10}{n:>6}{fwd * 1e3:>8.2f} ms"
              f"{n * flops / fwd / 1e9:>8.1f}{alone * 1e3:>8.2f} ms{n * flops / alone / 1e9:>8.1f}"
              f"{fwd / alone:>7.2f}")
    print(f"{'all':<8}{'':>18}{'':>16}{'':>10}{'':>6}{tot[0] * 1e3:>8.2f} ms{'':>8}"
          f"{tot[1] * 1e3:>8.2f} ms{'':>8}{tot[0] / tot[1]:>7.2f}")


if __name__ == "__main__":
    main()
