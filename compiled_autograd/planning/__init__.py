"""Memory planning: which forward values to keep and which to recompute, for a budget.

``plan_checkpoints(fn, *args, budget=...)`` (also ``ca.memory.plan_checkpoints``)
profiles one forward and backward of ``fn`` (``profile``), predicts the peak of any
plan from that profile (``simulate``), chooses the cheapest plan that fits
(``solve``) and returns a ``MemoryPlan`` (``plan``): ``with plan:`` runs a forward
under it, its recomputations are prim nodes of the backward graph.
"""
from __future__ import annotations

import numbers

from compiled_autograd.autograd.recipe import describe_backend
from compiled_autograd.planning.plan import MemoryPlan, Recomputed
from compiled_autograd.planning.profile import measure_plan, profile_for_planning
from compiled_autograd.planning.solve import FORMULATIONS, lowest, solve

__all__ = ["plan_checkpoints", "MemoryPlan", "Recomputed", "FORMULATIONS", "lowest"]

VERIFY_ROUNDS = 4   # plans measured on the backend before giving up


def _budget_bytes(budget, baseline) -> int:
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError("plan_checkpoints: budget must be a float in (0, 1] (a fraction of "
                        "the peak without a plan) or an int (bytes), got "
                        f"{type(budget).__name__}")
    if isinstance(budget, numbers.Integral):
        if budget <= 0:
            raise ValueError(f"plan_checkpoints: a budget in bytes must be positive, got {budget}")
        return int(budget)
    if not 0 < budget <= 1:
        raise ValueError("plan_checkpoints: a float budget is a fraction of the peak without "
                         f"a plan and must be in (0, 1], got {budget}")
    return int(budget * baseline)


def plan_checkpoints(fn, *args, budget, backend="python", formulation="knapsack", **kwargs):
    """Plan which values of ``fn(*args, **kwargs)``'s forward to recompute in the
    backward so that the peak of forward plus backward fits ``budget`` -- a float in
    (0, 1], a fraction of the peak without a plan (``fn`` as written, its own
    ``checkpoint()`` calls included) as ``ca.memory.profile()`` measures it around
    forward and backward on ``backend`` (a compiled backend's name or compiler, or
    None: the eager engine, a plain ``loss.backward()``), or an int, bytes -- at the
    least recompute cost. The plan's backward must run on ``backend``
    (``plan.backend``; another one is refused). ``fn`` returns a scalar loss; it is
    run five times or more (three to profile, two per plan measured on ``backend``;
    leaves' ``.grad`` and the random generator are left as they were).
    ``formulation``: "knapsack" or "mincut" (see ``compiled_autograd.planning.solve``).

    Every plan returned was measured on ``backend`` within the budget. When none
    fits, the error names the smallest peak measured: that of the lowest plan the
    planner finds (the same for every budget), or the peak without a plan if it is
    lower; asked for, that budget is met."""
    if not callable(fn):
        raise TypeError(f"plan_checkpoints: fn must be callable, got {type(fn).__name__}")
    if formulation not in FORMULATIONS:
        raise ValueError(f"plan_checkpoints: formulation must be one of {FORMULATIONS}, "
                         f"got {formulation!r}")
    _budget_bytes(budget, 1)   # (its type and range, before any work)
    profile = profile_for_planning(fn, args, kwargs, backend)
    base = profile.baseline_peak
    budget_bytes = _budget_bytes(budget, base)
    candidates = sum(1 for v in profile.values if v.nbytes)
    seconds, measured = 0.0, {}   # recompute set -> its peak measured on backend
    simulations = {}              # recompute set -> its Simulation (for every budget)

    def verified(simulation):
        plan = MemoryPlan(profile, simulation, budget_bytes, budget, formulation, seconds,
                          candidates, backend)
        peak = measured.get(simulation.recompute)
        if peak is None:
            peak = measured[simulation.recompute] = measure_plan(plan, fn, args, kwargs,
                                                                 backend)
        plan.measured_peak_bytes = peak
        return plan

    # The simulation predicts the "python" backend's schedule to the byte; the
    # eager engine, the C backend's arena and the user's own checkpoints hold
    # memory their own ways. So each plan is run and measured on ``backend``:
    # over the budget, it is planned again for a budget smaller by the excess
    # (and below that plan's prediction).
    target = budget_bytes
    for _ in range(VERIFY_ROUNDS):
        chosen, spent, _, _ = solve(profile, target, formulation, simulations)
        seconds += spent
        if chosen is None:
            break
        plan = verified(chosen)
        if plan.measured_peak_bytes <= budget_bytes:
            return plan
        target = min(target - (plan.measured_peak_bytes - budget_bytes), chosen.peak - 1)
    # Then the lowest plan the planner finds, which does not depend on the budget:
    # the smallest peak an error names is met when asked for.
    low, spent = lowest(profile, simulations)
    seconds += spent
    plan = verified(low)
    if plan.measured_peak_bytes <= budget_bytes:
        return plan
    smallest = min(plan.measured_peak_bytes, base)
    what = "" if smallest < base else ": no plan at all"
    raise ValueError(
        f"plan_checkpoints: no plan fits a budget of {budget_bytes:,} bytes "
        f"({budget_bytes / base:.2f} of the peak without a plan, {base:,} bytes, fn as "
        f"written on {describe_backend(backend)}): the smallest peak the planner reaches "
        f"is {smallest:,} bytes ({smallest / base:.2f}{what}), measured there. Use a budget "
        "of at least that, or make the forward smaller (a smaller batch).")
