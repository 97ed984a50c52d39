"""The memory planner against the exact answer (docs/memory.md, "The lowest peak").

For each model: its decisions (the values a plan keeps or recomputes), the exact
lowest predicted peak (every plan simulated: each subset of the decisions, the
plans that need the same values once) where there are at most ``EXACT_MAX``
decisions, the lowest peak the planner finds (``planning.solve.lowest``: exact
up to 8 decisions, a search past them), the greedy order's prefixes alone (what
the knapsack searched before) and recomputing every linear output; then, at
budgets from the exact lowest peak to the peak without a plan, the recompute
cost of the knapsack's plan against the cheapest plan that fits. Predictions
only (the "python" backend's schedule, the measured peak to the byte:
tests/test_memory_plan.py); nothing here is timed but the search.

    OPENBLAS_NUM_THREADS=1 python benchmarks/planner.py
"""
from __future__ import annotations

import os
import platform
import time

import numpy as np

from compiled_autograd.examples import build
from compiled_autograd.planning.profile import profile_for_planning
from compiled_autograd.planning.simulate import simulate
from compiled_autograd.planning.solve import _Planner, every_plan, lowest, solve

EXACT_MAX = 12    # decisions: 2 ** 12 subsets at most
BUDGETS = 8       # budgets per model, from the exact lowest peak to 1.0

MODELS = [
    ("mlp", dict(layers=3, width=256, batch=256, activation="gelu")),
    ("mlp", dict(layers=4, width=256, batch=256, activation="gelu")),
    ("mlp", dict(layers=5, width=256, batch=256, activation="gelu")),
    ("mlp", dict(layers=6, width=256, batch=256, activation="gelu")),
    ("mlp", dict(layers=5, width=32, batch=64, activation="gelu")),
    ("mlp", dict(layers=4, width=16, batch=256, activation="tanh")),
    ("mlp", dict(layers=6, width=64, batch=256, activation="tanh")),
    # benchmarks/memory.py's models: too many decisions to simulate every plan
    ("mlp", dict(layers=16, width=256, batch=256, activation="gelu")),
    ("transformer", dict(layers=4, d_model=128, heads=4, seq=64, batch=8)),
]


def _machine() -> str:
    return (f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, OPENBLAS_NUM_THREADS="
            f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; load average "
            + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def _prefixes_lowest(profile) -> int:
    """The lowest peak of the greedy order's prefixes (every one of them)."""
    planner = _Planner(profile, -1)
    order = planner.greedy_order()
    return min(planner.sim(order[:k]).peak for k in range(len(order) + 1))


def main():
    print(_machine())
    print()
    head = (f"{'model':<56}{'decisions':>10}{'exact':>8}{'planner':>9}{'/exact':>8}"
            f"{'prefixes':>10}{'linears':>9}{'search s':>10}")
    print("lowest predicted peak, as a fraction of the peak without a plan")
    print(head)
    costs = []
    for name, sizes in MODELS:
        ex = build(name, **sizes)
        profile = profile_for_planning(ex.loss, (), {}, "python")
        base = profile.baseline_peak
        decisions = len(_Planner(profile, -1).decisions())
        plans = every_plan(profile, EXACT_MAX)
        start = time.perf_counter()
        found, _ = lowest(profile)
        seconds = time.perf_counter() - start
        linears = simulate(profile, frozenset(v.index for v in profile.values
                                              if v.prim == "linear")).peak
        label = f"{name} " + " ".join(f"{k}={v}" for k, v in sizes.items())
        if plans is not None:
            exact = min(s.peak for s in plans.values())
            shown = f"{exact / base:>8.3f}{found.peak / base:>9.3f}{found.peak / exact:>8.3f}"
        else:
            exact = None
            shown = f"{'-':>8}{found.peak / base:>9.3f}{'-':>8}"
        print(f"{label:<56}{decisions:>10}{shown}{_prefixes_lowest(profile) / base:>10.3f}"
              f"{linears / base:>9.3f}{seconds:>10.2f}", flush=True)
        if plans is None:
            continue
        worst = (0.0, None)
        for fraction in np.linspace(exact / base, 1.0, BUDGETS):
            budget = int(fraction * base)
            cheapest = min(s.cost for s in plans.values() if s.peak <= budget)
            chosen, _, _, _ = solve(profile, budget)
            if chosen is None:
                worst = (float("inf"), fraction)
                continue
            ratio = (chosen.cost + 1e-12) / (cheapest + 1e-12)
            if ratio >= worst[0]:
                worst = (ratio, fraction)
        costs.append((label, len(plans), worst))
    print()
    print(f"recompute cost of the knapsack's plan / the cheapest plan that fits, worst of "
          f"{BUDGETS} budgets from the exact lowest peak to 1.0")
    print(f"{'model':<56}{'plans':>7}{'worst':>8}{'at budget':>11}")
    for label, n, (ratio, fraction) in costs:
        at = "-" if fraction is None else f"{fraction:.3f}"
        print(f"{label:<56}{n:>7}{ratio:>8.3f}{at:>11}")


if __name__ == "__main__":
    main()
