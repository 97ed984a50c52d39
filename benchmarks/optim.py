"""Optimizer cost: ca.optim's step against torch.optim's foreach step on the same
model, one thread, side by side in one run; then a training step with the update
inside the backward (``ca.optim.in_backward``) against the same backward followed by
``step()``, on each backend: its time (medians of many repetitions) and its peak
memory (``ca.memory.profile``). Prints three tables.

    python benchmarks/optim.py [--reps N] [--backends eager,python,c]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")        # (before numpy and torch load)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import compiled_autograd as ca  # noqa: E402
from compiled_autograd.examples import build  # noqa: E402

try:
    import torch
    torch.set_num_threads(1)
except ImportError:
    torch = None

OPTIMIZERS = [("SGD", dict(lr=0.01, momentum=0.9)),
              ("SGD", dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)),
              ("Adam", dict(lr=1e-3)),
              ("Adam", dict(lr=1e-3, amsgrad=True, weight_decay=1e-4)),
              ("AdamW", dict(lr=1e-3)),
              ("RMSprop", dict(lr=1e-3, momentum=0.9, centered=True)),
              ("Adagrad", dict(lr=1e-2))]
MODELS = [("mlp 8x64", dict(layers=8, width=64, batch=32)),
          ("mlp 6x256", dict(layers=6, width=256, batch=32))]


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _paired_medians(fns, reps, warmup=5):
    """Median time of each of ``fns``, run in turn within every repetition, so that
    the machine's load (shared here) falls on all of them alike."""
    times = [[] for _ in fns]
    for i in range(warmup + reps):
        for fn, out in zip(fns, times):
            t = _timed(fn)
            if i >= warmup:
                out.append(t)
    return [statistics.median(t) for t in times]


def _label(name, kwargs):
    opts = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k != "lr")
    return f"{name}({opts})" if opts else name


def step_table(reps):
    rows = []
    for model_name, sizes in MODELS:
        ex = build("mlp", **sizes)
        params = ex.parameters()
        ex.loss().backward()                       # every parameter has a gradient
        for name, kwargs in OPTIMIZERS:
            opt = getattr(ca.optim, name)(params, **kwargs)
            theirs = None
            if torch is not None:
                tp = [torch.nn.Parameter(torch.from_numpy(p.detach().numpy().copy()))
                      for p in params]
                for t, p in zip(tp, params):
                    t.grad = torch.from_numpy(p.grad.numpy().copy())
                topt = getattr(torch.optim, name)(tp, foreach=True, **kwargs)
                ours, theirs = _paired_medians([opt.step, topt.step], reps)
            else:
                (ours,) = _paired_medians([opt.step], reps)
            rows.append((f"{model_name} ({len(params)})", _label(name, kwargs), ours, theirs))
    print(f"optimizer step, one thread (model (parameter tensors)), median of {reps}")
    print(f"{'model':<15} {'optimizer':<52} {'ca (us)':>9} {'torch foreach (us)':>19} "
          f"{'ca/torch':>9}")
    for model_name, label, ours, theirs in rows:
        ratio = f"{ours / theirs:9.2f}" if theirs else f"{'-':>9}"
        t = f"{theirs * 1e6:19.1f}" if theirs else f"{'-':>19}"
        print(f"{model_name:<15} {label:<52} {ours * 1e6:9.1f} {t} {ratio}")


def _train_step(backend, sizes, name, kwargs, wrapped):
    """A function running one training step; returns the time of backward + step
    (the forward is not timed)."""
    ex = build("mlp", **sizes)
    opt = getattr(ca.optim, name)(ex.parameters(), **kwargs)
    if wrapped:
        opt = ca.optim.in_backward(opt)
    ctx = (contextlib.nullcontext() if backend == "eager"
           else ca.compiled_backward(backend=backend))

    def step():
        loss = ex.loss()
        start = time.perf_counter()
        with ctx:
            loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        opt.zero_grad()
        return elapsed
    return step


def train_table(reps, backends):
    print(f"\ntraining step (the forward not timed): the update inside the backward "
          f"(in_backward) against backward + step(); median of {reps}")
    print(f"{'backend':<8} {'model':<10} {'optimizer':<20} {'backward+step (us)':>19} "
          f"{'in_backward (us)':>17} {'ratio':>7}")
    for backend, (model_name, sizes) in ((b, m) for b in backends for m in MODELS):
        for name, kwargs in (("SGD", dict(lr=0.01, momentum=0.9)), ("Adam", dict(lr=1e-3))):
            steps = [_train_step(backend, sizes, name, kwargs, w) for w in (False, True)]
            times = [[], []]
            for i in range(5 + reps):         # the two in turn (see _paired_medians)
                for step, out in zip(steps, times):
                    t = step()
                    if i >= 5:
                        out.append(t)
            times = [statistics.median(t) for t in times]
            print(f"{backend:<8} {model_name:<10} {_label(name, kwargs):<20} "
                  f"{times[0] * 1e6:19.1f} {times[1] * 1e6:17.1f} {times[1] / times[0]:7.2f}")


def _step_peak(backend, wrapped, batch):
    ex = build("mlp", layers=6, width=256, batch=batch)
    opt = ca.optim.SGD(ex.parameters(), lr=1e-3, momentum=0.9)
    if wrapped:
        opt = ca.optim.in_backward(opt)
    ctx = (contextlib.nullcontext() if backend == "eager"
           else ca.compiled_backward(backend=backend))

    def step():
        opt.zero_grad()
        loss = ex.loss()
        with ctx:
            loss.backward()
        opt.step()
    step()                      # (the state made, the backward compiled)
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        step()
    return prof.peak_bytes, sum(p.numel() * p.dtype.itemsize for p in ex.parameters())


def memory_table(backends):
    print("\npeak of a training step (forward + backward + step, ca.memory.profile), mlp "
          "6x256, SGD(momentum=0.9)")
    print(f"{'backend':<8} {'batch':>5} {'backward+step':>14} {'in_backward':>12} "
          f"{'drop':>10} {'grads - largest':>16}")
    for backend in backends:
        for batch in (8, 32):
            plain, grads = _step_peak(backend, False, batch)
            inside, _ = _step_peak(backend, True, batch)
            largest = (256 * 256 + 256) * 4
            print(f"{backend:<8} {batch:>5} {plain:>14,d} {inside:>12,d} {plain - inside:>10,d} "
                  f"{grads - largest:>16,d}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--backends", default="eager,python,c",
                        help="comma-separated backends of the second table")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.processor() or ''}"
          f" python {platform.python_version()}, numpy {np.__version__}"
          + (f", torch {torch.__version__}" if torch is not None else ", no torch"))
    step_table(args.reps)
    train_table(args.reps, args.backends.split(","))
    memory_table(args.backends.split(","))


if __name__ == "__main__":
    main()
