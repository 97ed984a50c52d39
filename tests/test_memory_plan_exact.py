"""The lowest budgets, exactly (issue 29, item 13): a lower bound of every plan's
simulated peak (``planning.exact``), its exact Pareto front over every plan by a
DP, and the planner against it past the reach of enumerating every plan: within
2% of the lowest peak, within 10% of the cheapest plan at every budget tried."""
import math
import random

import numpy as np
import pytest

from compiled_autograd.examples import build
from compiled_autograd.planning.exact import (KEEP, RECOMPUTE, _Bound, bound_front,
                                              branch_and_bound, lowest_bound)
from compiled_autograd.planning.profile import profile_for_planning
from compiled_autograd.planning.simulate import simulate
from compiled_autograd.planning.solve import _Planner, every_plan, lowest, solve

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")

SMALL = [("mlp", dict(layers=4, width=32, batch=64, activation="gelu")),
         ("mlp", dict(layers=4, width=16, batch=256, activation="tanh")),
         ("transformer", dict(layers=1, d_model=16, heads=2, seq=8, batch=2))]


def _profile(name, sizes):
    return profile_for_planning(build(name, **sizes).loss, (), {}, "python")


@pytest.mark.parametrize("name,sizes", SMALL)
def test_the_bound_is_never_above_a_plans_simulated_peak(name, sizes):
    tight = 0
    for low, cost, s in _random_plans(_profile(name, sizes), 60, seed=0):
        assert low <= s.peak, (low, s.peak)
        assert cost <= s.cost + 1e-15
        tight += low == s.peak
    assert tight > 0    # (a bound of 0 would pass the rest)


def _random_plans(profile, n, seed):
    """(the bound's peak, its cost, the simulation) of ``n`` random plans, each
    recomputing a random share of the decisions."""
    decisions = _Planner(profile, -1).decisions()
    bound = _Bound(profile, decisions)
    rng = random.Random(seed)
    for _ in range(n):
        share = rng.random()
        choice = {i: RECOMPUTE if rng.random() < share else KEEP for i in decisions}
        low, cost, _ = bound(choice)
        yield low, cost, simulate(profile, frozenset(i for i, c in choice.items()
                                                     if c == RECOMPUTE))


def _every_plans_bound(profile):
    """(decisions, the bound, every plan simulated, each plan's (bound, cost))."""
    decisions = _Planner(profile, -1).decisions()
    bound = _Bound(profile, decisions)
    plans = every_plan(profile, max_decisions=12)
    points = [bound({i: RECOMPUTE if i in s.recompute else KEEP for i in decisions})[:2]
              for s in plans.values()]
    return decisions, bound, plans, points


@pytest.mark.parametrize("name,sizes", SMALL[:2])
def test_the_front_is_the_bounds_pareto_front_over_every_plan(name, sizes):
    # The DP against the bound of every plan, enumerated.
    profile = _profile(name, sizes)
    decisions, bound, plans, points = _every_plans_bound(profile)
    front = bound_front(profile)
    assert front.complete
    assert front.lowest()[0] == min(p for p, _ in points)
    for peak, cost, plan in front.points:
        # each point is reached by its plan, and no plan beats it on both
        p, c, _ = bound({i: RECOMPUTE if i in plan else KEEP for i in decisions})
        assert (p, c) == (peak, pytest.approx(cost, abs=1e-15))
        assert not any(q < peak and k < cost - 1e-15 for q, k in points)
    base = profile.baseline_peak
    for fraction in np.linspace(front.lowest()[0] / base, 1.0, 5):
        budget = math.ceil(fraction * base)
        cheapest = min(k for q, k in points if q <= budget)
        assert front.cheapest(budget)[0] == pytest.approx(cheapest, abs=1e-15)


@pytest.mark.parametrize("name,sizes", SMALL[:2])
def test_the_exact_methods_agree_with_every_plan_simulated(name, sizes):
    profile = _profile(name, sizes)
    plans = every_plan(profile, max_decisions=12)
    exact = min(plans.values(), key=lambda s: (s.peak, s.cost))
    bb = branch_and_bound(profile)
    assert bb.proven and (bb.best.peak, bb.best.cost) == (exact.peak, exact.cost)
    peak, plan, _ = bound_front(profile).lowest()
    assert peak <= exact.peak and simulate(profile, plan).peak == exact.peak
    base = profile.baseline_peak
    for fraction in np.linspace(exact.peak / base, 1.0, 4):
        budget = math.ceil(fraction * base)
        cheapest = min(s.cost for s in plans.values() if s.peak <= budget)
        got = branch_and_bound(profile, budget=budget)
        assert got.proven and got.best.peak <= budget
        assert got.best.cost == pytest.approx(cheapest, abs=1e-15)


# Past the reach of enumerating every plan (24 and 32 decisions: 2 ** 24 plans),
# where the bound's lowest plan simulates to the bound: its peak is the exact lowest.
BEYOND = [dict(layers=12, width=64, batch=512, activation="tanh"),
          dict(layers=16, width=32, batch=128, activation="gelu")]


@pytest.mark.parametrize("sizes", BEYOND)
def test_the_planner_reaches_the_exact_lowest_and_the_cheapest_plans(sizes):
    # Item 13: on the 12-layer tanh MLP the planner stopped at 0.500 of the peak
    # without a plan, where the lowest plan reaches 0.456.
    profile = _profile("mlp", sizes)
    assert len(_Planner(profile, -1).decisions()) > 20
    front = bound_front(profile)
    assert front.complete
    bound, plan, _ = front.lowest()
    exact = simulate(profile, plan)
    assert exact.peak == bound          # exact: no plan's peak is below its bound
    found, _ = lowest(profile)
    assert found.peak <= 1.02 * exact.peak, found.peak / exact.peak
    _, _, smallest, _ = solve(profile, 0)   # what an error names, before measuring
    assert smallest <= 1.02 * exact.peak
    base = profile.baseline_peak
    for fraction in np.linspace(exact.peak / base, 1.0, 6):
        budget = math.ceil(fraction * base)
        cost, plan = front.cheapest(budget)
        cheapest = simulate(profile, plan)
        assert cheapest.peak <= budget and cheapest.cost == pytest.approx(cost, abs=1e-15)
        chosen, _, _, _ = solve(profile, budget)
        assert chosen is not None and chosen.peak <= budget
        assert chosen.cost <= 1.10 * cheapest.cost + 1e-12, (fraction, chosen.cost / cheapest.cost)


def test_below_the_lowest_bound_no_plan_is_said_to_fit():
    profile = _profile("mlp", BEYOND[0])
    front = bound_front(profile)
    chosen, _, smallest, _ = solve(profile, front.lowest()[0] - 1)
    assert chosen is None and smallest >= front.lowest()[0]


# ---------------------------------------------------------------- one budget at a time

@pytest.mark.parametrize("name,sizes", SMALL[:2])
def test_the_dp_for_one_budget_finds_the_bounds_cheapest_plan_that_fits(name, sizes):
    # bound_front with a budget drops states over it and does not tell apart live
    # bytes that stay within it whatever the undecided values add: against the
    # bound of every plan, enumerated.
    profile = _profile(name, sizes)
    decisions, bound, plans, points = _every_plans_bound(profile)
    least = min(p for p, _ in points)
    base = profile.baseline_peak
    for fraction in np.linspace(least / base, 1.0, 6):
        budget = math.ceil(fraction * base)
        cheapest = min(k for q, k in points if q <= budget)
        found = bound_front(profile, budget=budget)
        assert found.complete and found.points
        peak, cost, plan = found.points[0]
        assert peak <= budget and cost == pytest.approx(cheapest, abs=1e-15)
        assert bound({i: RECOMPUTE if i in plan else KEEP for i in decisions})[0] == peak
        # nothing cheaper than the cheapest; only whether a plan fits
        assert not bound_front(profile, budget=budget, cost_limit=cheapest * (1 - 1e-9)).points
        assert bound_front(profile, budget=budget, feasible_only=True).points
    assert not bound_front(profile, budget=least - 1).points
    assert not bound_front(profile, budget=least - 1, feasible_only=True).points
    lo, hi = lowest_bound(profile, max(s.peak for s in plans.values()))
    assert lo < least <= hi and hi - lo <= 1e-3 * hi



@pytest.mark.parametrize("name,sizes", [SMALL[0], SMALL[2]])
def test_the_relaxed_dp_bounds_the_cheapest_plan_below(name, sizes):
    # bound_front's relaxation (relax_steps, relax_bytes), for where the exact DP
    # is out of reach: against the exact DP for the same budget, its least cost
    # is never above the cheapest plan's that fits, a plan it names has a bound at
    # least its peak, and it finds no point only where no plan fits. The coarsest
    # relaxation tried must be weaker somewhere (else the test could not fail).
    profile = _profile(name, sizes)
    decisions = _Planner(profile, -1).decisions()
    bound = _Bound(profile, decisions)
    base = profile.baseline_peak
    lo, _ = lowest_bound(profile, base)
    weaker = 0
    for fraction in np.linspace(lo / base, 1.0, 5):
        budget = math.ceil(fraction * base)
        exact = bound_front(profile, budget=budget)
        assert exact.complete
        for steps, quantum in ((2, 0), (4, budget // 50), (10 ** 6, budget // 5)):
            relaxed = bound_front(profile, budget=budget, relax_steps=steps,
                                  relax_bytes=quantum)
            assert relaxed.complete
            if not relaxed.points:
                assert not exact.points
                continue
            cost = relaxed.points[0][1]
            if exact.points:
                assert cost <= exact.points[0][1] + 1e-15
                weaker += cost < exact.points[0][1] - 1e-15
            for peak, cost, plan in relaxed.points:
                assert peak <= budget
                if plan is not None:
                    low, plan_cost, _ = bound({i: RECOMPUTE if i in plan else KEEP
                                               for i in decisions})
                    assert peak <= low and cost == pytest.approx(plan_cost, abs=1e-15)
    assert weaker > 0


@pytest.mark.parametrize("name,sizes", [SMALL[0], SMALL[2]])
def test_the_relaxed_dp_loses_no_point_of_the_exact_front(name, sizes):
    # Where a relaxation errs the wrong way (a merged kind counting more bytes than
    # one of its plans, a merged state costing more) it loses a plan. Each point
    # of the exact front is the cheapest plan whose bound is at most its peak, to
    # the byte: with that peak as the budget the relaxed DP must find a cost no
    # higher (and some plan at all), and without a budget its front a point no
    # higher and no dearer. (The test above, against the exact DP's least cost at
    # five budgets, missed three such errors put in on purpose: an input's
    # recomputed reach taken from its reader's kept reach, and a dropped state's
    # live bytes merged by the most, or not merged at all, with relax_bytes.)
    profile = _profile(name, sizes)
    front = bound_front(profile).points
    top = front[-1][0]
    weaker = 0
    for steps, part in ((3, 0), (10 ** 6, 0), (10 ** 6, 20)):
        relaxed = bound_front(profile, relax_steps=steps, relax_bytes=part and top // part)
        assert relaxed.complete
        for peak, cost, _ in front:
            assert any(p <= peak and c <= cost + 1e-15 for p, c, _ in relaxed.points), \
                (steps, part, peak, cost)
        if steps == 3:   # (the budgets: the coarse relaxations only, for time)
            continue
        for peak, cost, _ in front:
            at = bound_front(profile, budget=peak, relax_steps=steps,
                             relax_bytes=part and peak // part)
            assert at.complete and at.points and at.points[0][1] <= cost + 1e-15
            weaker += at.points[0][1] < cost - 1e-15
        assert bound_front(profile, budget=front[0][0], relax_steps=steps,
                           relax_bytes=part and front[0][0] // part, feasible_only=True).points
    assert weaker > 0


TRANSFORMER = dict(layers=1, d_model=16, heads=2, seq=8, batch=2)


def test_on_a_transformer_the_planner_finds_plans_within_ten_percent_of_the_cheapest():
    # Item 13 on the 1-layer transformer: the whole front needs ~14,000 DP states
    # (more than the planner computes), and the knapsack's plan cost up to 1.41x
    # the cheapest that fits (1.40x at 0.867 on the one of benchmarks/planner.py).
    # The planner now runs the bound's DP for its budget, for cheaper plans only.
    profile = _profile("transformer", TRANSFORMER)
    front = bound_front(profile)
    assert front.complete
    low, _ = lowest(profile)
    base = profile.baseline_peak
    checked = 0
    for k, fraction in enumerate(np.linspace(low.peak / base, 1.0, 6)[1:-1]):
        budget = math.ceil(fraction * base)
        cost, plan = front.cheapest(budget)
        if k == 1:   # the DP for this budget alone finds the same cost as the whole front
            assert bound_front(profile, budget=budget).points[0][1] == \
                pytest.approx(cost, abs=1e-15)
        cheapest = simulate(profile, plan)
        if cheapest.peak > budget:    # (then its cost is only a lower bound)
            continue
        checked += 1
        chosen, _, _, _ = solve(profile, budget)
        assert chosen is not None and chosen.peak <= budget
        assert chosen.cost <= 1.10 * cheapest.cost + 1e-12, (fraction, chosen.cost / cheapest.cost)
    assert checked >= 3


def test_on_a_two_layer_transformer_no_plan_costs_a_tenth_less_than_the_planners():
    # Past the DP for one budget in the planner (69 decisions), the knapsack's
    # plan is pruned of every recomputation the budget does not need and its
    # dearest ones swapped for cheaper ones: at 0.94 it cost 1.86x the cheapest
    # (a GELU output and views recomputed where three LayerNorm outputs would do).
    # The proof: the bound's DP for that budget finds no plan whose bound fits
    # and that costs less than the planner's plan / 1.10.
    profile = _profile("transformer", dict(layers=2, d_model=32, heads=2, seq=16, batch=4,
                                           vocab=50))
    assert len(_Planner(profile, -1).decisions()) > 48
    base = profile.baseline_peak
    for fraction in (0.81, 0.87, 0.94):
        budget = math.ceil(fraction * base)
        chosen, _, _, _ = solve(profile, budget)
        assert chosen is not None and chosen.peak <= budget
        cheaper = bound_front(profile, state_limit=10_000, budget=budget,
                              cost_limit=chosen.cost / 1.10)
        assert cheaper.complete
        assert not cheaper.points, (fraction, chosen.cost / cheaper.points[0][1])


def test_the_plan_graphs_kept_nodes_are_the_planners_own():
    """meta "kept" of a plan's graph is the index of a value the plan keeps
    (``simulate.plan_graph``; ``exact._Bound`` counts the steps without one). The
    profile's traced backward reads its kept arrays (the leaves) too, and the graph
    copies those reads: their meta must not say "kept" (it did, as a tuple, and
    the bound dropped those steps)."""
    profile = _profile(*SMALL[0])
    graph = simulate(profile, frozenset()).graph
    kept = [n.meta["kept"] for n in graph.nodes if "kept" in n.meta]
    assert kept and all(type(k) is int and profile.values[k] for k in kept)
    reads = [n for n in graph.nodes if "kept_version" in n.meta]
    assert reads, "the traced reads of the kept arrays are in the plan's graph"
    assert not any("kept" in n.meta for n in reads)


# ---------------------------------------------------------------- the transformers

# The models of benchmarks/planner.py, and a 2-layer one between them.
BENCH_TRANSFORMER = dict(layers=1, d_model=128, heads=4, seq=64, batch=8)
TWO_LAYERS = dict(layers=2, d_model=128, heads=4, seq=64, batch=8)


def test_on_a_deeper_transformer_the_bound_stays_below_every_plans_peak_and_is_reached():
    # The bound counts a recomputed value (saved or not) until its last
    # recomputed reader is emitted, and a recomputed view's base as long as the
    # view: on random plans of a 2-layer transformer it is still never above the
    # simulated peak, and it is reached by most (the recomputed attention
    # projections' views keep their base alive: left out, the bound of the
    # 4-layer transformer's lowest plan was 0.298 of the peak without a plan,
    # where it simulates to 0.347).
    profile = _profile("transformer", TWO_LAYERS)
    tight = 0
    for low, _, s in _random_plans(profile, 40, seed=1):
        assert low <= s.peak, (low, s.peak)
        tight += low == s.peak
    assert tight >= 30
    decisions = _Planner(profile, -1).decisions()
    bound = _Bound(profile, decisions)
    # recomputing everything: its bound is its simulated peak (before: 0.870 of
    # the peak without a plan, where it simulates to 1.0)
    every = {i: RECOMPUTE for i in decisions}
    assert bound(every)[0] == simulate(profile, frozenset(decisions)).peak
    assert bound({})[0] <= min(bound(c)[0] for c in ({i: KEEP for i in decisions}, every))


def test_on_a_two_layer_transformer_the_lowest_peak_is_proven_within_two_percent():
    # Item 13: the planner stopped at 0.444 of the peak without a plan, and the
    # bound proved no plan below 0.414 (7.3%). Now the planner reaches 0.430 (its
    # bisection of the bound's least value, asking the DP one budget at a time,
    # finds the plan) and no plan's bound is below it: it is the exact lowest.
    profile = _profile("transformer", TWO_LAYERS)
    found, _ = lowest(profile)
    lo, hi = lowest_bound(profile, found.peak, state_limit=30_000)
    assert found.peak <= 1.02 * lo, (found.peak / lo)
    none = bound_front(profile, state_limit=30_000, budget=found.peak - 1, feasible_only=True)
    assert none.complete and not none.points


def test_on_the_benchmarks_transformer_the_planner_is_the_cheapest_at_the_lowest_peak():
    # Item 13: at the lowest budget (0.563 of the peak without a plan) the
    # cheapest plan whose bound fits did not fit when simulated (the bound left
    # out a recomputed view's base): the knapsack's plan was only known to cost
    # at most 1.269x a lower bound of the cheapest. Now that plan fits: it is the
    # cheapest plan that fits, and the knapsack's is within 10% of it.
    profile = _profile("transformer", BENCH_TRANSFORMER)
    low, _ = lowest(profile)
    found = bound_front(profile, budget=low.peak)
    assert found.complete and found.points
    _, cost, plan = found.points[0]
    cheapest = simulate(profile, plan)
    assert cheapest.peak <= low.peak and cheapest.cost == pytest.approx(cost, abs=1e-15)
    chosen, _, _, _ = solve(profile, low.peak)
    assert chosen is not None and chosen.peak <= low.peak
    assert chosen.cost <= 1.10 * cheapest.cost + 1e-12, chosen.cost / cheapest.cost
