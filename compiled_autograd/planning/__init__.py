"""Memory planning: which forward values to keep and which to recompute, for a budget.

``plan_checkpoints(fn, *args, budget=...)`` (also ``ca.memory.plan_checkpoints``)
profiles one forward and backward of ``fn`` (``profile``), predicts the peak of any
plan from that profile (``simulate``), chooses the cheapest plan that fits
(``solve``) and returns a ``MemoryPlan`` (``plan``): ``with plan:`` runs a forward
under it, its recomputations are prim nodes of the backward graph.
"""
from __future__ import annotations

import numbers

from compiled_autograd.planning.plan import MemoryPlan, Recomputed
from compiled_autograd.planning.profile import measure_plan, profile_for_planning
from compiled_autograd.planning.solve import FORMULATIONS, solve

__all__ = ["plan_checkpoints", "MemoryPlan", "Recomputed", "FORMULATIONS"]

VERIFY_ROUNDS = 4   # plans measured on the backend before giving up


def _budget_bytes(budget, baseline) -> int:
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError("plan_checkpoints: budget must be a float in (0, 1] (a fraction of "
                        "the peak without checkpointing) or an int (bytes), got "
                        f"{type(budget).__name__}")
    if isinstance(budget, numbers.Integral):
        if budget <= 0:
            raise ValueError(f"plan_checkpoints: a budget in bytes must be positive, got {budget}")
        return int(budget)
    if not 0 < budget <= 1:
        raise ValueError("plan_checkpoints: a float budget is a fraction of the peak without "
                         f"checkpointing and must be in (0, 1], got {budget}")
    return int(budget * baseline)


def plan_checkpoints(fn, *args, budget, backend="python", formulation="knapsack", **kwargs):
    """Plan which values of ``fn(*args, **kwargs)``'s forward to recompute in the
    backward so that the peak of forward plus backward fits ``budget`` -- a float in
    (0, 1], a fraction of the peak without checkpointing as ``ca.memory.profile()``
    measures it around forward and backward on ``backend`` (a compiled backend's
    name or compiler, or None: the eager engine), or an int, bytes -- at
    the least recompute cost. ``fn`` returns a scalar loss; it is run five times
    or more (three to profile, two to measure the plan on ``backend``; leaves'
    ``.grad`` and the random generator are left as they were). ``formulation``: "knapsack" or
    "mincut" (see ``compiled_autograd.planning.solve``)."""
    if not callable(fn):
        raise TypeError(f"plan_checkpoints: fn must be callable, got {type(fn).__name__}")
    if formulation not in FORMULATIONS:
        raise ValueError(f"plan_checkpoints: formulation must be one of {FORMULATIONS}, "
                         f"got {formulation!r}")
    _budget_bytes(budget, 1)   # (its type and range, before any work)
    profile = profile_for_planning(fn, args, kwargs, backend)
    budget_bytes = _budget_bytes(budget, profile.baseline_peak)
    base = profile.baseline_peak
    candidates = sum(1 for v in profile.values if v.nbytes)
    # The simulation predicts the "python" backend's schedule to the byte; the
    # eager engine and the C backend's arena hold memory their own way. So the
    # plan is run once and measured on ``backend``: over the budget, it is
    # planned again for a budget smaller by the excess.
    target, seconds, measured = budget_bytes, 0.0, None
    for _ in range(VERIFY_ROUNDS):
        chosen, spent, smallest, _ = solve(profile, target, formulation)
        seconds += spent
        if chosen is None:
            break
        plan = MemoryPlan(profile, chosen, budget_bytes, budget, formulation, seconds,
                          candidates)
        plan.measured_peak_bytes = measured = measure_plan(plan, fn, args, kwargs, backend)
        if measured <= budget_bytes:
            return plan
        target -= measured - budget_bytes
    if measured is not None:
        smallest = f"{measured:,} bytes ({measured / base:.2f}) measured on {backend!r}"
    else:
        smallest = f"{smallest:,} bytes ({smallest / base:.2f})"
    raise ValueError(
        f"plan_checkpoints: no plan fits a budget of {budget_bytes:,} bytes "
        f"({budget_bytes / base:.2f} of the peak without checkpointing, {base:,} bytes): "
        f"the smallest peak the planner reaches is {smallest}. Use a budget of at least that, "
        "or make the forward smaller (a smaller batch).")
