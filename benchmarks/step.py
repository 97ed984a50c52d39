"""The training step, forward plus backward, side by side: ca's eager engine, compiled
autograd on "python" and "c", and torch's eager autograd, each mode in a process
of its own, as a user runs one library (in one process, torch's allocations
changed how many pages ca's steps faulted in), the modes taking turns: each runs
a block of 10 steps in a row (4 for the large MLP and the transformer), as in a
training loop, then the next, so that all see the same machine; the first step
of each block is not kept. At 1 thread and at the default thread count (BLAS
threads are fixed at start-up).

Each model is written once for both libraries (``lib`` is ``compiled_autograd`` or
``torch``): the small MLP (8 x 64, batch 32), a 200-op elementwise chain (16
elements), the large MLP (8 x 1024, batch 256), the transformer (4 layers,
d_model 128) and an MLP of custom Functions (8 x 64, batch 32) whose backward runs
as Python (a ``call_backward`` node). A step is ``forward; backward``; the
gradients are dropped between steps (``p.grad = None``, untimed).

- "reused": the parameters are made once (a training loop);
- "fresh": new leaf tensors every step, from the same arrays (a numpy user who
  keeps the weights as arrays and wraps them each step); wrapping is not timed.
  Both kinds' processes take turns in the same rounds, so that fresh against
  reused is measured on one machine.

At 1 thread ten more processes run only eager steps, five of them after a
compiled backward, taking turns: the forward in a process that never used
compiled autograd beside the forward after its first use (each kind's median
process: processes differ by more than the forward does).

With an optimizer (``--optimizer-cases``, default the small MLP and the
transformer; SGD with momentum and Adam): the step is ``forward; backward; update``
-- torch with its ``foreach`` optimizer (``step(); zero_grad()``), ca's eager
engine and "c" with ``step()``, and "c" and "python" with the update inside the
compiled backward (``ca.optim.in_backward``), taking turns the same way.

Each mode's minor page faults per step are reported too, with one more process
beside them: "c no pool", the "c" mode with compiled autograd's caching allocator
off (``CA_POOL=0``, runtime/pool.c): what the pool saves, in faults and time.

After each mode's turn a fixed workload runs for a moment (``alone.pace_runner``,
about 1.5 ms): its median, and its slowest tenth and round against its median,
mark a disturbed spell. It samples the machine between turns, not during them: a
spell shorter than a turn (up to a quarter of a second for the transformer) can
pass unseen.

The forward is reported alone too, with its cost per op (forward time / autograd
nodes, AccumulateGrad excluded), and the compiled "c" backward alone with reused
and fresh parameters. For the large MLP the step is set beside its floor: the
"c" backward's GEMM calls alone (``backward.gemm_floor``) plus the forward's
matmuls alone (numpy, the same shapes), measured in turns with the "c" step.

    python benchmarks/step.py [--reps N] [--cases a,b] [--optimizer-cases a,b]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = ("small_mlp", "chain", "large_mlp", "transformer", "custom_fn_python")
MODES = ("torch", "eager", "python", "c")
OPT_CASES = ("small_mlp", "transformer")
OPTIMIZERS = (("SGD", dict(lr=1e-3, momentum=0.9)), ("Adam", dict(lr=1e-4)))
OPT_MODES = ("torch", "eager+step", "c+step", "c inside", "python inside")

# the caching allocator off (runtime/pool.c): what the "c no pool" process runs
# with, beside "c" as it is
NO_POOL = "c no pool"
POOL_OFF = {"CA_POOL": "0"}

import models  # noqa: E402
from alone import PACE, Alone, pace_line, pace_summary, rounds, torch_threads  # noqa: E402
from models import SIZES, count_nodes, model, wrap  # noqa: E402

RUNNER = "step:case_runner"    # (alone.py makes each mode's runner by this name)


# ---------------------------------------------------------------- measuring

def case_runner(mode, case, fresh, after_use=False):
    """(step(): (forward seconds, backward seconds), number of forward nodes);
    ``after_use``: this process runs one compiled backward first."""
    if after_use:
        import compiled_autograd as ca
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        with ca.compiled_backward(backend="c"):
            (x * x).sum().backward()
    if mode == "torch":
        import torch as lib
        torch_threads(lib)
        backward = lambda loss: loss.backward()  # noqa: E731
    else:
        import compiled_autograd as lib
        from compiled_autograd.compiled.api import backward_on
        backend = None if mode == "eager" else mode
        backward = lambda loss: backward_on(loss, backend)  # noqa: E731
    arrays, inputs = models.arrays(case)
    loss_of = model(lib, case, inputs)
    P = wrap(lib, arrays)
    nodes = count_nodes(loss_of(P))

    def step():
        nonlocal P
        if fresh:
            P = wrap(lib, arrays)
        start = time.perf_counter()
        loss = loss_of(P)
        mid = time.perf_counter()
        backward(loss)
        end = time.perf_counter()
        for p in P.values():
            p.grad = None
        return mid - start, end - mid
    return step, nodes


def measure_case(case, reps, modes):
    """Medians of forward, backward and step per parameter kind and mode, each in a
    process of its own (``alone.Alone``), all taking turns (``alone.rounds``):
    reused and fresh parameters in the same rounds, so that their ratio sees one
    machine."""
    runners = {f"{kind}:{m}": Alone(RUNNER, m, case, kind == "fresh")
               for kind in ("reused", "fresh") for m in modes}
    if "c" in modes:   # the caching allocator off
        runners[f"reused:{NO_POOL}"] = Alone(RUNNER, "c", case, False, env=POOL_OFF)
    try:
        got = rounds(runners, reps)
    finally:
        for r in runners.values():
            r.close()
    out = {PACE: pace_summary(got)}
    for name, runner in runners.items():
        times = [(f, b, faults) for (f, b), faults in got[name]]
        out[name] = {"forward": statistics.median(t[0] for t in times),
                     "backward": statistics.median(t[1] for t in times),
                     "step": statistics.median(t[0] + t[1] for t in times),
                     "nodes": runner.info,
                     "faults": statistics.median(t[2] for t in times)}
    if case == "large_mlp" and "c" in modes and "torch" in modes:
        out["floor"] = _step_floor(case, reps, case_runner("c", case, False)[0])
    return out


def measure_after_use(case, reps, processes=5):
    """The eager forward's median in processes that never used compiled autograd
    and in ones that ran a compiled backward first, ``processes`` of each, all
    taking turns: {"never used": seconds, "after use": seconds, PACE: the machine's
    pace in these rounds}, each kind's median process."""
    runners = {(kind, i): Alone(RUNNER, "eager", case, False, kind == "after use")
               for i in range(processes) for kind in ("never used", "after use")}
    try:
        got = rounds(runners, reps)
    finally:
        for r in runners.values():
            r.close()
    forward = {key: statistics.median(f for (f, _), _ in got[key]) for key in runners}
    out = {kind: statistics.median(forward[(kind, i)] for i in range(processes))
           for kind in ("never used", "after use")}
    out[PACE] = pace_summary(got)
    return out


def optimizer_runner(mode, case, name, options):
    """(step(): one training step with the update (seconds), None)."""
    if mode == "torch":
        import torch as lib
        torch_threads(lib)
        backward = lambda loss: loss.backward()  # noqa: E731
        make = lambda params: getattr(lib.optim, name)(params, foreach=True,  # noqa: E731
                                                          **options)
    else:
        import compiled_autograd as lib
        from compiled_autograd.compiled.api import backward_on
        backend = mode.split("+")[0].split()[0]
        backward = lambda loss: backward_on(loss, None if backend == "eager" else backend)  # noqa: E731
        make = lambda params: getattr(lib.optim, name)(params, **options)  # noqa: E731
    arrays, inputs = models.arrays(case)
    loss_of = model(lib, case, inputs)
    P = wrap(lib, arrays)
    opt = make(list(P.values()))
    if mode.endswith("inside"):
        opt = lib.optim.in_backward(opt)

    def step():
        start = time.perf_counter()
        backward(loss_of(P))
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - start
    return step, None


def measure_optimizers(case, reps, modes):
    """Medians of a step with each optimizer per mode, the modes taking turns."""
    out = {}
    for name, options in OPTIMIZERS:
        runners = {m: Alone("step:optimizer_runner", m, case, name, options) for m in modes}
        got = rounds(runners, reps)
        for r in runners.values():
            r.close()
        out[name] = {m: statistics.median(t for t, _ in got[m]) for m in modes}
        out[name][PACE] = pace_summary(got)
    return out


def _step_floor(case, reps, step, rounds=3):
    """The large MLP's step floor: its "c" backward's GEMMs alone plus its forward's
    matmuls alone (numpy, as the forward makes them), measured in turns with the
    "c" step (``rounds`` rounds, so that both see the same machine, as
    backward.py's floor): the medians, and the median of the rounds' ratios."""
    import numpy as np
    from backward import gemm_floor
    backward_once, _ = gemm_floor(case)
    arrays, inputs = models.arrays(case)
    x = inputs["x"]
    ws = [arrays[f"w{i}"] for i in range(SIZES[case]["layers"])]

    def forward_once(n):
        times = []
        for _ in range(n + 2):
            start = time.perf_counter()
            for w in ws:
                np.matmul(x, w.T)        # (the GEMM of the linear prim, its bias aside)
            times.append(time.perf_counter() - start)
        return statistics.median(times[2:])
    n = max(5, reps)
    backs, fores, steps = [], [], []
    for _ in range(rounds):
        backs.append(backward_once(n))
        fores.append(forward_once(n))
        steps.append(statistics.median(sum(step()) for _ in range(n)))
    return {"backward gemms": statistics.median(backs), "forward gemms": statistics.median(fores),
            "c step": statistics.median(steps),
            "ratio": statistics.median(s / (b + f) for s, b, f in zip(steps, backs, fores))}


def worker(reps, cases, after_use=False, opt_cases=()):
    # (torch is imported in its own runners' processes only, not here: the large
    # MLP's floor runs in this one)
    modes = MODES if importlib.util.find_spec("torch") is not None else MODES[1:]
    if opt_cases:
        opt_modes = OPT_MODES if "torch" in modes else OPT_MODES[1:]
        return {case: measure_optimizers(
            case, max(5, reps // 10) if case in ("large_mlp", "transformer") else reps,
            opt_modes) for case in opt_cases}
    results = {}
    for case in cases:
        n = max(5, reps // 10) if case in ("large_mlp", "transformer") else reps
        results[case] = measure_case(case, n, modes)
        if after_use:
            results[case]["eager forward"] = measure_after_use(case, n)
    return results


def _fmt(seconds):
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f}ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f}us"


def report_optimizers(results, threads):
    print(f"\nthreads: {threads}")
    print("training step with an optimizer (forward + backward + update), medians")
    print(f"{'case':<13}{'optimizer':<11}" + "".join(f"{m:>15}" for m in OPT_MODES)
          + f"{'c+step/torch':>14}{'c inside/torch':>16}{'inside/c+step':>15}")
    for case, rows in results.items():
        for name, row in rows.items():
            t = row.get("torch")
            cells = "".join(f"{_fmt(row.get(m)):>15}" for m in OPT_MODES)
            ratios = (f"{row['c+step'] / t:>14.2f}{row['c inside'] / t:>16.2f}" if t
                      else f"{'-':>14}{'-':>16}")
            print(f"{case:<13}{name:<11}{cells}{ratios}"
                  f"{row['c inside'] / row['c+step']:>15.2f}")
    for case, rows in results.items():
        for name, row in rows.items():
            print(f"{case} with {name}: {pace_line(row[PACE])}")


def report(results, threads):
    print(f"\nthreads: {threads}")
    for kind in ("reused", "fresh"):
        print(f"parameters {kind}: step (forward + backward), medians")
        head = (f"{'case':<17}" + "".join(f"{m + ' step':>13}" for m in MODES)
                + f"{'eager/torch':>12}{'c/torch':>9}")
        print(head)
        for case, row in results.items():
            cells = "".join(f"{_fmt(row.get(f'{kind}:{m}', {}).get('step')):>13}"
                            for m in MODES)
            t = row.get(f"{kind}:torch")
            ratios = (f"{row[f'{kind}:eager']['step'] / t['step']:>12.2f}"
                      f"{row[f'{kind}:c']['step'] / t['step']:>9.2f}" if t else
                      f"{'-':>12}{'-':>9}")
            print(f"{case:<17}{cells}{ratios}")
    print("forward alone (reused parameters), per op = forward / autograd nodes")
    print(f"{'case':<17}{'nodes':>6}{'torch fwd':>11}{'us/op':>7}{'ca fwd':>10}{'us/op':>7}"
          f"{'ratio':>7}{'ca fwd, c':>11}{'ratio':>7}")
    for case, row in results.items():
        t, e, c = row.get("reused:torch"), row["reused:eager"], row["reused:c"]
        n = e["nodes"]
        tcells = (f"{_fmt(t['forward']):>11}{t['forward'] / t['nodes'] * 1e6:>7.2f}" if t
                  else f"{'-':>11}{'-':>7}")
        print(f"{case:<17}{n:>6}{tcells}{_fmt(e['forward']):>10}{e['forward'] / n * 1e6:>7.2f}"
              f"{e['forward'] / t['forward'] if t else float('nan'):>7.2f}"
              f"{_fmt(c['forward']):>11}{c['forward'] / t['forward'] if t else float('nan'):>7.2f}")
    print("compiled \"c\" backward alone: reused vs fresh parameters")
    print(f"{'case':<17}{'reused':>10}{'fresh':>10}{'fresh/reused':>14}{'torch reused':>14}"
          f"{'torch fresh':>13}")
    for case, row in results.items():
        r, f = row["reused:c"]["backward"], row["fresh:c"]["backward"]
        t = row.get("reused:torch")
        tc = (f"{_fmt(t['backward']):>14}{_fmt(row['fresh:torch']['backward']):>13}" if t
              else f"{'-':>14}{'-':>13}")
        print(f"{case:<17}{_fmt(r):>10}{_fmt(f):>10}{f / r:>14.2f}{tc}")
    print("minor page faults per step, each mode in its own process (reused parameters); "
          f"\"{NO_POOL}\": \"c\" with the caching allocator off (CA_POOL=0)")
    print(f"{'case':<17}" + "".join(f"{m:>11}" for m in MODES + (NO_POOL,))
          + f"{'c step':>11}{NO_POOL + ' step':>17}{'ratio':>7}")
    for case, row in results.items():
        c, k = row["reused:c"], row[f"reused:{NO_POOL}"]
        faults = [row.get(f"reused:{m}", {}).get("faults", "-") for m in MODES + (NO_POOL,)]
        print(f"{case:<17}" + "".join(f"{f:>11}" for f in faults) + f"{_fmt(c['step']):>11}"
              + f"{_fmt(k['step']):>17}{k['step'] / c['step']:>7.2f}")
    if any("eager forward" in row for row in results.values()):
        print("eager steps only: the forward in processes that never used compiled "
              "autograd, and in ones that ran a compiled backward first (5 of each, "
              "taking turns; each kind's median process)")
        print(f"{'case':<17}{'never used':>12}{'after use':>12}{'ratio':>7}")
        for case, row in results.items():
            a, b = row["eager forward"]["never used"], row["eager forward"]["after use"]
            print(f"{case:<17}{_fmt(a):>12}{_fmt(b):>12}{b / a:>7.2f}")
    print("machine pace: a fixed workload (alone.pace_runner) run after each "
          "mode's turn; slow tenths or rounds mark a disturbed spell")
    print(f"{'case':<30}{'median':>9}{'slowest tenth':>15}{'slowest round':>15}")
    for case, row in results.items():
        paces = [(case, row[PACE])]
        if "eager forward" in row:
            paces.append((f"{case} (after use)", row["eager forward"][PACE]))
        for label, p in paces:
            print(f"{label:<30}{_fmt(p['median']):>9}{p['slowest tenth']:>14.2f}x"
                  f"{p['slowest round']:>14.2f}x")
    for case, row in results.items():
        if "floor" in row:
            fl = row["floor"]
            floor = fl["backward gemms"] + fl["forward gemms"]
            print(f"{case} floor, in turns with the \"c\" step (3 rounds): backward GEMMs "
                  f"{_fmt(fl['backward gemms'])} + forward GEMMs {_fmt(fl['forward gemms'])} = "
                  f"{_fmt(floor)}; \"c\" step {_fmt(fl['c step'])} ({fl['ratio']:.2f}x the "
                  "floor, the median of the rounds' ratios)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--threads", default="1,default")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--after-use", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--optimizer-cases", default=",".join(OPT_CASES),
                        help="cases measured with an optimizer (empty: none)")
    parser.add_argument("--optimizers-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    opt_cases = [c for c in args.optimizer_cases.split(",") if c]
    unknown = (set(cases) | set(opt_cases)) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; choose from {', '.join(CASES)}")
    if args.worker:
        print(json.dumps(worker(args.reps, cases, args.after_use,
                                opt_cases if args.optimizers_only else ())))
        return
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.machine()
    print(f"machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians of "
          f"{args.reps} steps (large MLP and transformer: {max(5, args.reps // 10)})")
    for threads in args.threads.split(","):
        env = dict(os.environ)
        if threads == "1":
            env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                       CA_BENCH_THREADS="1")
        def run(extra):
            proc = subprocess.run([sys.executable, __file__, "--worker", "--reps",
                                   str(args.reps), "--cases", ",".join(cases)] + extra,
                                  env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"worker failed ({threads} thread):\n{proc.stderr}")
            return json.loads(proc.stdout.strip().splitlines()[-1])
        if opt_cases:
            opt_run = run(["--optimizers-only", "--optimizer-cases", ",".join(opt_cases)])
        if not cases:
            report_optimizers(opt_run, threads)
            continue
        report(run(["--after-use"] if threads == "1" else []), threads)
        if opt_cases:
            report_optimizers(opt_run, threads)


if __name__ == "__main__":
    main()
