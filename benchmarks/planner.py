"""The memory planner against the exact answer (docs/memory.md, "The lowest peak").

For each model: its decisions (the values a plan keeps or recomputes); the least
lower bound of any plan's peak (``planning.exact.bound_front``: a DP over every
plan of a bound that no plan's simulated peak goes below); the exact lowest
predicted peak -- every plan simulated where there are at most ``EXACT_MAX``
decisions, else the simulated peak of the bound's lowest plan when it equals the
bound ("-" when it does not: the lowest is then only known to lie between the
bound and the best peak found); the lowest peak the planner finds
(``planning.solve.lowest``), the greedy order's prefixes alone (what the knapsack
searched before) and recomputing every linear output. Then, at budgets from the
exact lowest peak (or the planner's, where it is not known) to the peak without a
plan, the recompute cost of the knapsack's plan against the cheapest plan that
fits: every plan simulated, or the bound's DP for that budget (``bound_front``
with the budget, for plans cheaper than the knapsack's): exact when it finds none
(the knapsack's plan is the cheapest) or its plan's simulated peak fits; else its
cost is only a lower bound of the cheapest (the ratio marked "<="). Where that
DP gives up (it may hold up to ``BUDGET_STATES`` states at one decision), its
relaxations are tried, finest first (``RELAXATIONS``; "relaxed DP at" lists those
budgets): a relaxed DP that finds no plan cheaper than the knapsack's proves it
the cheapest, else its least cost is a lower bound of the cheapest's; "DP gave
up at" lists the budgets where every one of them gave up too. Where the whole front is out of reach, the bound's least value is
bracketed by bisection (``lowest_bound``: the DP for a budget, asking only
whether any plan's bound fits): "bound" is then its proven lower end, and
"/bound" the planner's lowest over it, at most the planner's distance from the
exact lowest -- unless the DP for a budget one byte below the lowest plan found
(the planner's, or one of the bisection's, simulated) finds no plan whose bound
fits: that plan's peak is then the exact lowest (and the bound's least value).
Predictions
only (the "python" backend's schedule, the measured peak to the byte:
tests/test_memory_plan.py); nothing here is timed but the searches.

    OPENBLAS_NUM_THREADS=1 python benchmarks/planner.py
"""
from __future__ import annotations

import math
import os
import platform
import time

import numpy as np

from compiled_autograd.examples import build
from compiled_autograd.planning.profile import profile_for_planning
from compiled_autograd.planning.simulate import simulate
from compiled_autograd.planning.exact import bound_front, lowest_bound
from compiled_autograd.planning.solve import _Planner, every_plan, lowest, solve

EXACT_MAX = 12    # decisions: 2 ** 12 subsets at most
BUDGETS = 8       # budgets per model, from the exact lowest peak to 1.0
DP_STATES = 30_000   # the bound's DP gives up past this many states at one decision
BUDGET_STATES = 120_000   # (the DP for one budget's cheapest plan: past this many)
# where that DP gives up: its relaxations, finest first (relax_steps, and
# relax_bytes as the budget's share), each a lower bound of the cheapest's cost
RELAXATIONS = ((4, 1000), (4, 50), (8, 50))

MODELS = [
    ("mlp", dict(layers=3, width=256, batch=256, activation="gelu")),
    ("mlp", dict(layers=4, width=256, batch=256, activation="gelu")),
    ("mlp", dict(layers=5, width=256, batch=256, activation="gelu")),
    ("mlp", dict(layers=6, width=256, batch=256, activation="gelu")),
    ("mlp", dict(layers=5, width=32, batch=64, activation="gelu")),
    ("mlp", dict(layers=4, width=16, batch=256, activation="tanh")),
    ("mlp", dict(layers=6, width=64, batch=256, activation="tanh")),
    # past the enumeration: the bound's DP
    ("mlp", dict(layers=12, width=64, batch=512, activation="tanh")),
    ("transformer", dict(layers=1, d_model=128, heads=4, seq=64, batch=8)),
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
    head = (f"{'model':<56}{'decisions':>10}{'bound':>7}{'exact':>7}{'planner':>8}"
            f"{'/exact':>7}{'/bound':>7}{'prefixes':>9}{'linears':>8}{'search s':>9}{'DP s':>7}"
            f"{'DP states':>10}")
    print("lowest predicted peak, as a fraction of the peak without a plan")
    print(head)
    costs, gave_up = [], []
    for name, sizes in MODELS:
        ex = build(name, **sizes)
        profile = profile_for_planning(ex.loss, (), {}, "python")
        base = profile.baseline_peak
        decisions = len(_Planner(profile, -1).decisions())
        plans = every_plan(profile, EXACT_MAX)
        front = bound_front(profile, state_limit=DP_STATES)
        start = time.perf_counter()
        found, _ = lowest(profile)
        seconds = time.perf_counter() - start
        linears = simulate(profile, frozenset(v.index for v in profile.values
                                              if v.prim == "linear")).peak
        label = f"{name} " + " ".join(f"{k}={v}" for k, v in sizes.items())
        bound = exact = None
        if front.complete:
            bound, plan, _ = front.lowest()
            if simulate(profile, plan).peak == bound:
                exact = bound
        else:
            seen = []
            bound, _ = lowest_bound(profile, found.peak, state_limit=DP_STATES, plans=seen)
            # exact where no plan's bound is below the lowest plan's simulated
            # peak: that is then the bound's least value too
            low = min([found.peak] + [simulate(profile, p).peak for _, p in seen[:4]])
            none = bound_front(profile, state_limit=DP_STATES, budget=low - 1,
                               feasible_only=True)
            if none.complete and not none.points:
                bound = exact = low
        if plans is not None:
            exact = min(s.peak for s in plans.values())
        def f(x, width):
            return f"{'-':>{width}}" if x is None else f"{x / base:>{width}.3f}"
        ratio = f"{'-':>7}" if exact is None else f"{found.peak / exact:>7.3f}"
        states = f"{front.states:>10,}" + ("" if front.complete else "+")
        over = f"{'-':>7}" if not bound else f"{found.peak / bound:>7.3f}"
        print(f"{label:<56}{decisions:>10}{f(bound, 7)}{f(exact, 7)}{f(found.peak, 8)}{ratio}{over}"
              f"{_prefixes_lowest(profile) / base:>9.3f}{linears / base:>8.3f}{seconds:>9.2f}"
              f"{front.seconds:>7.2f}{states}", flush=True)
        if not front.complete:
            gave_up.append((label, front))
        worst = {True: (0.0, None), False: (0.0, None)}   # exact, and "<=" (bounded)
        unknown, relaxed = [], []
        low = exact if exact is not None else found.peak
        for fraction in np.linspace(low / base, 1.0, BUDGETS):
            budget = math.ceil(fraction * base)
            chosen, _, _, _ = solve(profile, budget)
            if chosen is None:
                worst[True] = (float("inf"), fraction)
                continue
            if plans is not None:
                cheapest, is_exact = min(s.cost for s in plans.values() if s.peak <= budget), True
            else:
                for steps, part in ((1, 0),) + RELAXATIONS:
                    cheaper = bound_front(profile, state_limit=BUDGET_STATES, budget=budget,
                                          cost_limit=chosen.cost * (1 - 1e-9),
                                          relax_steps=steps,
                                          relax_bytes=part and budget // part)
                    if cheaper.complete:
                        break
                if not cheaper.complete:
                    unknown.append(fraction)
                    continue
                if steps > 1:
                    relaxed.append(fraction)
                if not cheaper.points:
                    cheapest, is_exact = chosen.cost, True
                else:
                    cost, plan = cheaper.points[0][1], cheaper.points[0][2]
                    s = simulate(profile, plan) if plan is not None else None
                    is_exact = s is not None and s.peak <= budget
                    cheapest = s.cost if is_exact else cost
            ratio = (chosen.cost + 1e-12) / (cheapest + 1e-12)
            if ratio >= worst[is_exact][0]:
                worst[is_exact] = (ratio, fraction)
        costs.append((label, "every plan" if plans is not None else "DP budget", worst,
                      unknown, relaxed))
    print()
    print(f"recompute cost of the knapsack's plan / the cheapest plan that fits, worst of "
          f"{BUDGETS} budgets from the exact lowest peak to 1.0: where the cheapest is "
          "known, and where only a lower bound of its cost is (<=)")
    print(f"{'model':<56}{'cheapest by':>12}{'worst':>8}{'at budget':>11}"
          f"{'worst <=':>10}{'at budget':>11}  {'relaxed DP at':<14}DP gave up at")
    for label, by, worst, unknown, relaxed in costs:
        cells = ""
        for is_exact in (True, False):
            ratio, fraction = worst[is_exact]
            shown = "-" if fraction is None else f"{'' if is_exact else '<='}{ratio:.3f}"
            at = "-" if fraction is None else f"{fraction:.3f}"
            cells += f"{shown:>{8 if is_exact else 10}}{at:>11}"
        gave = " ".join(f"{x:.3f}" for x in unknown) or "-"
        relax = " ".join(f"{x:.3f}" for x in relaxed) or "-"
        print(f"{label:<56}{by:>12}{cells}  {relax:<14}{gave}")
    for label, front in gave_up:
        print(f"\n{label}: the bound's whole front gave up at decision {front.decided} of "
              f"{front.decisions}, {front.states:,} states at one decision (the limit "
              f"{DP_STATES:,}), after {front.seconds:.1f} s; the DP for one budget's "
              f"cheapest plan gives up past {BUDGET_STATES:,}")


if __name__ == "__main__":
    main()
