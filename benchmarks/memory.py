"""What checkpointing and offloading save: peak bytes (ca's accounting and the
tracemalloc witness) over forward+backward, and backward time, side by side for
the bundled transformer and an MLP. One run, one table per model.

    python benchmarks/memory.py [--reps N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import compiled_autograd as ca
from compiled_autograd.examples import build

MODES = [("no checkpointing", "none", False), ("per-layer checkpoint", "layer", False),
         ("sqrt(n) segments", "sqrt", False), ("selective (keep linear)", "selective", False),
         ("disk offload", "none", True)]

MODELS = {
    "transformer": dict(layers=4, d_model=128, heads=4, seq=64, batch=8),
    "mlp": dict(layers=16, width=256, batch=256, activation="gelu"),
}


def measure(name, sizes, checkpoint, offload, reps):
    ex = build(name, checkpoint=checkpoint, offload=offload, **sizes)
    with ca.memory.profile() as prof:
        ex.loss().backward()
    ex.zero_grad()
    times = []
    for _ in range(reps):
        loss = ex.loss()
        start = time.perf_counter()
        loss.backward()
        times.append(time.perf_counter() - start)
        ex.zero_grad()
    return prof, statistics.median(times)


def accounting_overhead(name, sizes, reps):
    """Median forward+backward time: plain, with ca's accounting alone, and with
    the tracemalloc witness as well (interleaved, so machine noise hits all three)."""
    ex = build(name, **sizes)
    times = {"plain": [], "accounting": [], "accounting+tracemalloc": []}
    contexts = {"plain": None, "accounting": dict(tracemalloc_witness=False),
                "accounting+tracemalloc": dict(tracemalloc_witness=True)}
    for _ in range(reps):
        for label, kwargs in contexts.items():
            start = time.perf_counter()
            if kwargs is None:
                ex.loss().backward()
            else:
                with ca.memory.profile(**kwargs):
                    ex.loss().backward()
            times[label].append(time.perf_counter() - start)
            ex.zero_grad()
    return {label: statistics.median(ts) for label, ts in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    for name, sizes in MODELS.items():
        print(f"{name} {sizes}  (median of {args.reps} backward passes)")
        print(f"{'mode':<26} {'peak (accounting)':>18} {'peak (tracemalloc)':>19} "
              f"{'vs none':>8} {'backward':>10}")
        base = None
        for label, checkpoint, offload in MODES:
            prof, t = measure(name, sizes, checkpoint, offload, args.reps)
            base = base or prof.peak_bytes
            print(f"{label:<26} {prof.peak_bytes / 2**20:>15.2f} MB "
                  f"{prof.tracemalloc_peak_bytes / 2**20:>16.2f} MB "
                  f"{prof.peak_bytes / base:>8.2f} {t * 1e3:>8.1f}ms")
        t = accounting_overhead(name, sizes, args.reps)
        print(f"forward+backward: {t['plain'] * 1e3:.1f} ms plain, "
              f"{t['accounting'] * 1e3:.1f} ms with the accounting "
              f"(x{t['accounting'] / t['plain']:.2f}), "
              f"{t['accounting+tracemalloc'] * 1e3:.1f} ms adding the tracemalloc witness "
              f"(x{t['accounting+tracemalloc'] / t['plain']:.2f})\n")


if __name__ == "__main__":
    main()
