"""Where the generated C of the transformer's backward spends its time, per kind of
backward node, at 1 thread; and torch's profiler on the same model, per op.

The C is built a second time with a clock read at each node's comment in the
source (``/* LinearBackward */``: each step's time runs to the next comment), in a
private cache directory, so the timing code never reaches a normal build.

    python benchmarks/c_steps.py [--reps N]
"""
from __future__ import annotations

import argparse
import os
import re
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

_CLOCK = """#include <time.h>
extern double ca_step_seconds[4096]; extern double ca_step_last; extern int ca_step_now;
static inline double ca_clock(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9; }
static inline void ca_step(int id) { double n = ca_clock();
  if (ca_step_now >= 0) ca_step_seconds[ca_step_now] += n - ca_step_last;
  ca_step_now = id; ca_step_last = ca_clock(); }
"""
_END = 4095   # the step after the last node: the time to return


def _timed(sources, names):
    """``sources`` with a ca_step(k) call before each node comment (names[k])."""
    out = []
    for n, source in enumerate(sources):
        lines = []
        for line in source.split("\n"):
            m = re.match(r"^  /\* (\w+) \*/$", line)
            if m:
                names.append(m.group(1))
                lines.append(f"  ca_step({len(names) - 1});")
            elif line == "  return 0;":
                lines.append(f"  ca_step({_END});")
            lines.append(line)
        defs = ("double ca_step_seconds[4096]; double ca_step_last; int ca_step_now = -1;\n"
                if n == 0 else "")
        out.append("#define _POSIX_C_SOURCE 199309L\n" + "\n".join(lines).replace(
            "#include <string.h>\n", "#include <string.h>\n" + defs + _CLOCK, 1))
    return out


def c_steps(reps):
    """{node kind: (count, seconds per backward)}, total seconds per backward."""
    import c_breakdown
    from compiled_autograd.runtime import cbuild
    names, libs = [], []
    build, load = cbuild.build, cbuild.load
    cbuild.build = lambda sources, *a, **k: build(_timed(sources, names), *a, **k)
    cbuild.load = lambda path: libs.append(load(path)) or libs[-1]
    try:
        seconds, _ = c_breakdown.clocked_backwards("transformer", reps, libs,
                                                   "ca_step_seconds", 4096)
    finally:
        cbuild.build, cbuild.load = build, load
    return c_breakdown.tally(names, seconds, reps), \
        sum(seconds[k] for k in range(len(names))) / reps


def torch_ops(reps):
    """{op: self seconds per backward} from torch's profiler, or None without torch."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    import backward
    torch.set_num_threads(1)
    loss, params = backward._torch_setup("transformer")
    for _ in range(3):
        loss().backward()
        for p in params:
            p.grad = None
    losses = [loss() for _ in range(reps)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for one in losses:
            one.backward()
            for p in params:
                p.grad = None
    return {e.key: e.self_cpu_time_total * 1e-6 / reps for e in prof.key_averages()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    kinds, total = c_steps(args.reps)
    print(f"generated C of the transformer's backward, 1 thread, mean of {args.reps}: "
          f"{total * 1e3:.2f} ms in {sum(n for n, _ in kinds.values())} steps")
    print(f"{'node':<22}{'steps':>6}{'ms':>9}")
    for name, (n, s) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<22}{n:>6}{s * 1e3:>9.3f}")
    ops = torch_ops(args.reps)
    if ops is not None:
        print(f"\ntorch 2.13's backward, 1 thread, profiler self time per backward "
              f"(mean of {args.reps}): {sum(ops.values()) * 1e3:.2f} ms")
        print(f"{'op':<42}{'ms':>9}")
        for name, s in sorted(ops.items(), key=lambda kv: -kv[1])[:10]:
            print(f"{name[:40]:<42}{s * 1e3:>9.3f}")


if __name__ == "__main__":
    main()
