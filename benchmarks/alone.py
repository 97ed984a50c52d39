"""Each library alone: a step runner in a process of its own, the runners taking
turns by blocks of steps. How step.py and backward.py measure ca and torch side by
side without one process's history changing the other's numbers (in one process,
torch's allocations kept glibc from giving back the memory that ca's steps then
faulted in again; each interpreter's caches are its own too).

A runner is made by a factory named ``"module:function"`` (a module of this
folder), called with JSON-able arguments in the child; it returns ``(step, info)``:
``step()`` runs one step and returns a JSON-able value (seconds, ...), ``info`` is
sent back once. ``Alone(factory, *args)`` starts the child and, called with ``n``,
has it run ``n`` steps in a row: ``[(what step gave, the minor page faults of that
step)] * n``. ``rounds`` makes them take turns; after each turn it times a fixed
workload for a moment, the machine's pace (``PACE``), whose times show how steady
the machine was (``pace_summary``, ``pace_line``).

    python benchmarks/alone.py --serve SPEC      (the child; not run by hand)
"""
from __future__ import annotations

import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _make(factory, args):
    module, function = factory.split(":")
    return getattr(importlib.import_module(module), function)(*args)


class Alone:
    """A runner in a process of its own (see the module's docstring); ``env``: more
    environment variables for that process; ``python`` and ``folder``: another
    interpreter and another checkout's ``benchmarks/`` (against.py's baseline)."""

    def __init__(self, factory, *args, env=None, python=None, folder=None):
        script = os.path.join(folder, "alone.py") if folder else os.path.abspath(__file__)
        self.proc = subprocess.Popen([python or sys.executable, script, "--serve",
                                      json.dumps([factory, args])], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     env=None if env is None else {**os.environ, **env})
        self.info = self._read()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("STEP "):
                return json.loads(line[5:])
        sys.exit(f"step server failed: {self.proc.wait()}")

    def __call__(self, n):
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def serve(spec):
    """The child of ``Alone``: makes the runner, then runs the steps asked for."""
    factory, args = json.loads(spec)
    step, info = _make(factory, args)
    print("STEP " + json.dumps(info), flush=True)
    for line in sys.stdin:
        print("STEP " + json.dumps(block(step, int(line))), flush=True)


def block(step, n):
    """``n`` steps in a row: [(what ``step`` gives, the minor page faults of it)]."""
    out = []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        got = step()
        out.append([got, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before])
    return out


def rounds(runners, reps):
    """{name: [(what its runner gives, faults)] * about ``reps``}: the runners take
    turns, each running a block of steps in a row, as in a training loop
    (10, or 4 when ``reps`` < 50; the first step of each block, after the others'
    turns, is not kept), after 5 warm-up steps each. After each runner's turn,
    the machine's pace takes a short one (``PACE_STEPS`` kept), in a process of
    its own: its times are under ``PACE``, ``len(runners) * PACE_STEPS`` a round."""
    size = 10 if reps >= 50 else 4
    pace = Alone(PACE_RUNNER, env=PACE_ENV)
    try:
        pace(5)
        for r in runners.values():
            r(5)
        got = {m: [] for m in [*runners, PACE]}
        for _ in range(-(-reps // size)):
            for m, r in runners.items():
                got[m] += r(size + 1)[1:]
                got[PACE] += pace(PACE_STEPS + 1)[1:]
    finally:
        pace.close()
    return got


# ---------------------------------------------------------------- the machine's pace

PACE = "machine pace"
PACE_RUNNER = "alone:pace_runner"
PACE_STEPS = 2      # kept steps of the pace after each runner's turn
# one BLAS thread whatever the runners' (and the caller's) count, so that the pace is
# the same workload in every script and section, and leaves no BLAS thread spinning
# into the next runner's turn
PACE_ENV = dict(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def pace_runner():
    """A fixed workload, the same in every run: four 128 x 128 float64 GEMMs (one
    BLAS thread, ``PACE_ENV``), a 4 MB copy and 2,000 turns of a Python loop (BLAS,
    memory and the interpreter, what a step is made of), run for a moment after
    each runner's turn. On a quiet machine its times barely move over a run; a
    spell in which a neighbour takes the cores or the memory shows as rounds in
    which it is slow. It samples the machine between the runners' turns, not
    during them: a spell shorter than a turn can pass unseen."""
    import numpy as np
    rng = np.random.default_rng(0)
    a, b = rng.random((128, 128)), rng.random((128, 128))
    source = rng.random(1 << 19)
    target = np.empty_like(source)

    def step():
        start = time.perf_counter()
        for _ in range(4):
            np.matmul(a, b)
        np.copyto(target, source)
        total = 0
        for i in range(2000):
            total += i
        return time.perf_counter() - start
    return step, None


def pace_summary(got):
    """What ``rounds`` measured of the machine's pace (``got``: what ``rounds``
    gave): {"median": seconds, "slowest tenth": the 90th percentile / the median,
    "slowest round": the slowest round's median / the median}."""
    pace = [t for t, _ in got[PACE]]
    times = sorted(pace)
    median = statistics.median(times)
    per_round = (len(got) - 1) * PACE_STEPS
    by_round = [statistics.median(pace[i:i + per_round]) for i in range(0, len(pace), per_round)]
    return {"median": median, "slowest tenth": times[int(0.9 * (len(times) - 1))] / median,
            "slowest round": max(by_round) / median}


def pace_line(summary):
    """One line for a report: the machine's pace during a measurement."""
    return (f"machine pace (alone.pace_runner, after each turn): median "
            f"{summary['median'] * 1e6:.0f}us, slowest tenth {summary['slowest tenth']:.2f}x, "
            f"slowest round {summary['slowest round']:.2f}x")


def torch_threads(torch):
    """torch at the thread count the benchmark asked for (``CA_BENCH_THREADS``; its
    default otherwise): a runner factory calls it in its child."""
    torch.set_num_threads(int(os.environ.get("CA_BENCH_THREADS", "0")) or
                          torch.get_num_threads())


if __name__ == "__main__":
    if sys.argv[1:2] != ["--serve"] or len(sys.argv) != 3:
        sys.exit("usage: alone.py --serve SPEC (a child of alone.Alone)")
    serve(sys.argv[2])
