"""This checkout's training step against another checkout's, side by side: the
"c" step of each (and torch's, beside them) in processes of their own, taking
turns by blocks of steps (``alone.rounds``), at 1 thread. What a change gained,
measured in one run where two separate runs of step.py differ by more than it.

The baseline is another checkout (``git worktree add DIR REV``) and a Python that
imports compiled_autograd from it (a virtual environment with that checkout
installed in development mode): its own ``benchmarks/step.py`` runs its steps.

    python benchmarks/against.py --python VENV/bin/python --checkout DIR
        [--cases transformer] [--reps 60]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alone import PACE, Alone, pace_line, pace_summary, rounds  # noqa: E402

ONE_THREAD = dict(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                  CA_BENCH_THREADS="1")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the baseline's interpreter")
    parser.add_argument("--checkout", required=True, help="the baseline's checkout")
    parser.add_argument("--cases", default="transformer")
    parser.add_argument("--reps", type=int, default=60)
    args = parser.parse_args()
    folder = os.path.join(os.path.abspath(args.checkout), "benchmarks")
    if not os.path.exists(os.path.join(folder, "step.py")):
        parser.error(f"no benchmarks/step.py in {args.checkout}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, 1 thread; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians of {args.reps} steps; "
          f"baseline {args.checkout}")
    print(f"{'case':<18}{'mode':<12}{'forward':>10}{'backward':>10}{'step':>10}"
          f"{'/torch':>8}{'/baseline':>10}")
    for case in args.cases.split(","):
        runners = {"baseline c": Alone("step:case_runner", "c", case, False, env=ONE_THREAD,
                                       python=args.python, folder=folder),
                   "c": Alone("step:case_runner", "c", case, False, env=ONE_THREAD),
                   "torch": Alone("step:case_runner", "torch", case, False, env=ONE_THREAD)}
        got = rounds(runners, args.reps)
        for r in runners.values():
            r.close()
        med = {m: (statistics.median(f for (f, _), _ in got[m]),
                   statistics.median(b for (_, b), _ in got[m]),
                   statistics.median(f + b for (f, b), _ in got[m])) for m in runners}
        for m, (f, b, s) in med.items():
            base = f"{s / med['baseline c'][2]:.3f}" if m != "torch" else "-"
            print(f"{case:<18}{m:<12}{f * 1e3:>8.2f}ms{b * 1e3:>8.2f}ms{s * 1e3:>8.2f}ms"
                  f"{s / med['torch'][2]:>8.3f}{base:>10}")
        print(f"{case:<18}{pace_line(pace_summary(got))}")


if __name__ == "__main__":
    main()
