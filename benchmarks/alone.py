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
step)] * n``. ``Here`` is the same runner in this process. ``rounds`` makes them
take turns.

    python benchmarks/alone.py --serve SPEC      (the child; not run by hand)
"""
from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys

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


class Here:
    """``Alone``'s runner in this process (where what is compared is this process's
    own history)."""

    def __init__(self, factory, *args):
        self.step, self.info = _make(factory, args)

    def __call__(self, n):
        return block(self.step, n)

    def close(self):
        pass


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
    turns, each running a block of steps in a row, as in a training loop (10, or 4
    when ``reps`` < 50; the first step of each block, after the others' turns, is
    not kept), after 5 warm-up steps each."""
    size = 10 if reps >= 50 else 4
    for r in runners.values():
        r(5)
    got = {m: [] for m in runners}
    for _ in range(-(-reps // size)):
        for m, r in runners.items():
            got[m] += r(size + 1)[1:]
    return got


def torch_threads(torch):
    """torch at the thread count the benchmark asked for (``CA_BENCH_THREADS``; its
    default otherwise): a runner factory calls it in its child."""
    torch.set_num_threads(int(os.environ.get("CA_BENCH_THREADS", "0")) or
                          torch.get_num_threads())


if __name__ == "__main__":
    if sys.argv[1:2] != ["--serve"] or len(sys.argv) != 3:
        sys.exit("usage: alone.py --serve SPEC (a child of alone.Alone)")
    serve(sys.argv[2])
