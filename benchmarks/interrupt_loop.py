"""Random Ctrl-C during compiled backwards (issue 29, item 3).

SIGALRM, at a random moment within about one backward's time, raises
KeyboardInterrupt (the default SIGINT handler) while ``loss.backward()`` runs
under ``compiled_backward``: in the walk, the compiled code, a checkpoint's
recomputation, the engine's cleanup, a finalizer. After each, whether it landed or
not, the thread must be clean: grad mode on, no graph task running, reentrant
depth 0, the next forward records a graph, and the next backward gives eager's
gradients. Prints one row per backend; exits 1 on any failure.

    python benchmarks/interrupt_loop.py --seconds 12            # the issue's run
    python benchmarks/interrupt_loop.py --seconds 2 --backends python

(tests/test_interrupts.py runs it for a few seconds per backend; stderr must hold
no "Exception ignored" line.)
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compiled_autograd as ca  # noqa: E402
from compiled_autograd.autograd import engine, reentrant, saved_hooks  # noqa: E402
from compiled_autograd.examples import build  # noqa: E402


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _model(k):
    # alternate: plain, checkpointed per layer (recomputation inside the backward)
    return build("mlp", layers=4, width=96, batch=64,
                 checkpoint=("none", "layer")[k % 2])


def _clean(where):
    problems = []
    if not ca.is_grad_enabled():
        problems.append("grad mode off")
    if engine.current_graph_task() is not None:
        problems.append("a stale graph task on the running stack")
    if saved_hooks.current_hooks() is not None:
        problems.append("saved-tensor hooks left installed")
    if reentrant.depth() != 0:
        problems.append(f"reentrant depth {reentrant.depth()}")
    x = ca.randn(3, requires_grad=True)
    if (x * 2).grad_fn is None:
        problems.append("a forward records no graph")
    return [f"{where}: {p}" for p in problems]


def run(backend, seconds, seed=0):
    rng = random.Random(seed)
    reference = {}
    for k in range(2):
        ex = _model(k)
        ex.loss().backward()
        reference[k] = [p.grad.numpy().copy() for p in ex.parameters()]
    # about one backward's time: the window the alarm falls in
    times = []
    with ca.compiled_backward(backend=backend):
        for k in range(8):
            loss = _model(k).loss()
            t0 = time.perf_counter()
            loss.backward()
            times.append(time.perf_counter() - t0)
    times = times[2:]
    window = sorted(times)[len(times) // 2] * 1.5
    old = signal.signal(signal.SIGALRM, _interrupt)
    runs = landed = 0
    failures = []
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end and len(failures) < 5:
            k = runs
            runs += 1
            try:
                ex = _model(k)
                loss = ex.loss()
                with ca.compiled_backward(backend=backend):
                    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0, window))
                    try:
                        t0 = time.perf_counter()
                        loss.backward()
                        # not interrupted: the window follows the machine's load
                        times = times[-19:] + [time.perf_counter() - t0]
                        window = sorted(times)[len(times) // 2] * 1.5
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                landed += 1
            failures += _clean(f"run {runs}")
            if runs % 10 == 0:          # still right, through the same cache
                ex = _model(k)
                with ca.compiled_backward(backend=backend):
                    ex.loss().backward()
                for g, r in zip((p.grad.numpy() for p in ex.parameters()), reference[k % 2]):
                    if not np.allclose(g, r, rtol=1e-4, atol=1e-5):
                        failures.append(f"run {runs}: wrong gradients after interrupts")
                        break
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return runs, landed, failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="per backend")
    parser.add_argument("--backends", default="python,c")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"{'backend':8} {'seconds':>8} {'backwards':>10} {'interrupted':>12} {'failures':>9}")
    bad = []
    for backend in args.backends.split(","):
        runs, landed, failures = run(backend, args.seconds, args.seed)
        print(f"{backend:8} {args.seconds:8.1f} {runs:10d} {landed:12d} {len(failures):9d}",
              flush=True)
        bad += [f"{backend}: {f}" for f in failures]
    for line in bad:
        print("FAIL", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
