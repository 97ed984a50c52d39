"""Choosing what to recompute: the least recompute cost whose predicted peak fits.

Two formulations, both judged by the same simulation (``simulate``):

- ``"knapsack"`` (the default): items are the values the backward needs; recomputing
  one frees its storage (unless another kept value holds it) but keeps its recipe's
  inputs, at the cost of its prim. Greedily take the item with the most bytes freed
  per unit of cost (gains are updated after each take: an input that became kept
  frees nothing more), which orders the values from cheapest-per-byte to dearest;
  the plan is the shortest prefix of that order whose simulated peak fits the
  budget (a bisection), then each recomputation is dropped again, dearest first,
  if the peak still fits without it (``prune``), and each of the dearest is
  swapped for cheaper ones if the plan then costs less (``refill``). A plan
  whose lower bound (``exact._Bound``) passes the budget does not fit, without
  a simulation.
- ``"mincut"``: PyTorch's partitioner. A flow network with an edge of capacity
  "bytes of v" from v_in to v_out for every value, infinite edges along the data
  flow, the backward's needs into the sink, and the source into every value that
  may not be recomputed; a minimum cut is the set of values to keep with the fewest
  bytes, everything past it recomputed. Which values may be recomputed is a
  threshold on cost per byte, chosen by bisection as the cheapest that fits.

The lowest peak (``lowest``; the knapsack's fallback when no prefix fits, and what
``plan_checkpoints`` measures last): up to ``EXACT_DECISIONS`` decisions (the
values a plan keeps or recomputes) every plan is simulated, so it is exact; past
them, the lowest plans of a lower bound's exact Pareto front
(``exact.bound_front``, where its DP stays within ``FRONT_STATES`` states): exact
when the lowest simulates to its bound; else the plans that a search of the
bound's least value finds (each step the bound's DP for one budget, asking only
whether any plan's bound fits: ``_Planner.bound_lowest``) and a descent from
the greedy prefixes, the prim families and recomputing everything, by flips and
swaps of recomputed and of kept values (``_Planner.lowest_plan``). When no prefix
fits a budget, the plans whose bound fits it (the DP for that budget) are
simulated first (``_Planner.repair``). Where the front is known, the
knapsack's plan is replaced by the cheapest of the front's plans that fits, if
cheaper; where it is too big, up to ``BUDGET_DECISIONS`` decisions, by the
cheapest that the bound's DP for the budget alone finds (``_budget_cheapest``).
``every_plan`` simulates every plan: the exact answer the tests and
``benchmarks/planner.py`` compare the planner with, up to 12 decisions; the
front's exact plans past them.
"""
from __future__ import annotations

import itertools
import math
import time

import networkx as nx

from compiled_autograd.planning.exact import KEEP, RECOMPUTE, _Bound, bound_front
from compiled_autograd.planning.simulate import needed_values, simulate


PREFIX_SAMPLES = 12   # prefixes of the greedy order simulated before the bisection
PRUNE_TRIALS = 12     # plans the pruning pass tries at least ...
PRUNE_NODES = 60_000  # ... and at most this many backward graph nodes simulated in all
PRUNE_GROUP = 8       # recomputations it first tries to drop at once
REFILL_TRIALS = 4     # dearest recomputations the knapsack's plan tries to swap for cheaper
REFILL_SIMULATIONS = 3   # ... each with at most this many plans simulated before pruning
FAMILY_KINDS = 5      # kinds of prim whose every subset is a family plan
ALL_PREFIXES = 40     # prefixes of the greedy order the lowest-peak search starts from
DESCENT_TRIALS = 400  # plans its descent tries, at most ...
DESCENT_NODES = 60_000   # ... and at most this many over the backward graph's nodes
DESCENT_STARTS = 4    # plans it starts a descent from
SWAP_DECISIONS = 40   # up to this many decisions, its moves include swaps
EXACT_DECISIONS = 8   # up to this many decisions, the lowest peak is found exhaustively
FRONT_STATES = 3_000  # past them, the bound's front (exact.bound_front) up to this many states
FRONT_TRIALS = 16     # ... and up to this many of its plans simulated per question
BUDGET_DECISIONS = 48  # else, up to this many decisions, the bound's DP for one budget
BUDGET_STATES = 4_000   # (cheaper plans only), up to this many states at one decision
BUDGET_ROUNDS = 2       # ... run at most this many times (lowered by a plan's excess)
LOWEST_ROUNDS = 4       # where the front is too big, steps of the search of the
LOWEST_TOLERANCE = 0.02   # bound's least value (bound_lowest): until proven this close


class _Planner:
    def __init__(self, profile, budget_bytes, simulations=None):
        self.profile = profile
        self.budget = budget_bytes
        self.values = profile.values
        # recompute set -> Simulation (a plan's prediction does not depend on the
        # budget: one dict may serve several planners of one profile)
        self.simulations = {} if simulations is None else simulations

    def sim(self, recompute):
        recompute = needed_values(self.profile, frozenset(recompute))[0]
        s = self.simulations.get(recompute)
        if s is None:
            s = self.simulations[recompute] = simulate(self.profile, recompute)
        return s

    def fits(self, recompute) -> bool:
        # The bound (exact._Bound) is never above a plan's simulated peak, and costs
        # far less than a simulation: a plan whose bound passes the budget does not
        # fit (most of what pruning and the bisection try). (A plan that recomputes
        # nothing has the measured peak without a plan: under the budget, it fits.)
        if self.budget < self.profile.baseline_peak:
            bound = self._bound()
            if self.budget < bound({i: RECOMPUTE if i in recompute else KEEP
                                    for i in bound.decisions})[0]:
                return False
        return self.sim(recompute).peak <= self.budget

    def front(self):
        """The lower bound's exact Pareto front (``exact.bound_front``), once per
        profile; None when it gave up (more than ``FRONT_STATES`` states)."""
        front = getattr(self.profile, "exact_front", False)
        if front is False:
            front = bound_front(self.profile, state_limit=FRONT_STATES)
            front = front if front.complete else None
            self.profile.exact_front = front
        return front

    def front_lowest(self):
        """(the lowest simulated of the front's lowest plans, whether it is the
        exact lowest: its peak is the least bound of any plan), or (None, False)."""
        front = self.front()
        if front is None:
            return None, False
        best = None
        for bound, _, plan in front.points[:FRONT_TRIALS]:
            if best is not None and bound >= best.peak:
                break
            s = self.sim(plan)
            if best is None or (s.peak, s.cost) < (best.peak, best.cost):
                best = s
        return best, best.peak <= front.points[0][0]

    def bound_lowest(self, found):
        """(the lowest of ``found`` and the plans that a search of the bound's
        least value finds, simulated (``FRONT_TRIALS`` a step), the proven lower
        end: every plan's peak is above it). Between the bound with every value
        open and ``found``'s peak, each step the DP for a budget (up to
        ``BUDGET_STATES`` states, else it looks lower) ``LOWEST_TOLERANCE`` below
        the best plan's peak, else halfway, until that plan is proven within it,
        at most ``LOWEST_ROUNDS`` steps. Once per profile (``bound_lowest``)."""
        cached = getattr(self.profile, "bound_lowest", None)
        if cached is None:
            bound = self._bound()
            lo, hi = bound({})[0] - 1, found.peak   # (no plan's bound is below the open one)
            best = found
            for _ in range(LOWEST_ROUNDS):
                if best.peak - lo <= LOWEST_TOLERANCE * best.peak or hi - lo < 2:
                    break
                mid = best.peak - int(best.peak * LOWEST_TOLERANCE)   # (none there: proven)
                if not lo < mid < hi:
                    mid = (lo + hi) // 2
                step = bound_front(self.profile, bound.decisions, BUDGET_STATES, budget=mid,
                                   feasible_only=True)
                if not step.complete:
                    hi = mid       # (too many states there: look lower, where fewer are)
                elif not step.points:
                    lo = mid       # no plan's bound fits: every plan's peak is above
                else:
                    plans = sorted(((p, q) for p, _, q in step.points), key=lambda x: x[0])
                    hi = plans[0][0]
                    for _, plan in plans[:FRONT_TRIALS]:
                        s = self.sim(plan)
                        if (s.peak, s.cost) < (best.peak, best.cost):
                            best = s
            cached = self.profile.bound_lowest = (best.recompute, lo)
        best = self.sim(cached[0])
        return (best if (best.peak, best.cost) < (found.peak, found.cost) else found), cached[1]

    def _bound(self):
        bound = getattr(self.profile, "peak_bound", None)
        if bound is None:
            bound = self.profile.peak_bound = _Bound(self.profile, self.decisions())
        return bound

    def front_cheapest(self, chosen):
        """The cheapest of the front's plans whose bound fits the budget, simulated
        in order of cost until one fits (up to ``FRONT_TRIALS``), if it is cheaper
        than ``chosen``; else ``chosen``. Where the whole front is too big, the
        bound's DP for this budget, for plans cheaper than ``chosen``
        (``_budget_cheapest``), up to ``BUDGET_DECISIONS`` decisions."""
        front = self.front()
        if front is None:
            if len(self.decisions()) > BUDGET_DECISIONS:
                return chosen
            return self._budget_cheapest(chosen)
        fitting = sorted((c, p, plan) for p, c, plan in front.points if p <= self.budget)
        for cost, _, plan in fitting[:FRONT_TRIALS]:
            if chosen is not None and cost >= chosen.cost:
                break
            s = self.sim(plan)
            if s.peak <= self.budget:
                return s if chosen is None or s.cost < chosen.cost else chosen
        return chosen

    def _budget_cheapest(self, chosen):
        """A plan cheaper than ``chosen`` from the bound's DP for this budget
        (``exact.bound_front`` with a budget and ``chosen``'s cost as a limit):
        its plans, cheapest first, are simulated until one fits (up to
        ``FRONT_TRIALS``). Exact when its first plan fits: no plan whose peak
        fits costs less, since its bound fits too. The DP gives up past
        ``BUDGET_STATES`` states at one decision (``chosen`` stays). When none
        fits (the bound leaves out a recomputation chain's values), the DP runs
        again for a budget lower by the least excess, up to ``BUDGET_ROUNDS``
        times in all."""
        target = self.budget
        for _ in range(BUDGET_ROUNDS):
            found = bound_front(self.profile, state_limit=BUDGET_STATES, budget=target,
                                cost_limit=None if chosen is None else chosen.cost)
            excess = None
            for _, _, plan in found.points[:FRONT_TRIALS]:
                s = self.sim(plan)
                if s.peak <= self.budget:
                    return s if chosen is None or s.cost < chosen.cost else chosen
                excess = s.peak - self.budget if excess is None else \
                    min(excess, s.peak - self.budget)
            if excess is None:
                return chosen
            target -= excess
        return chosen

    def best(self, plans):
        fitting = [s for s in plans if s.peak <= self.budget]
        return min(fitting, key=lambda s: (s.cost, s.peak)) if fitting else None

    # ------------------------------------------------------------ knapsack

    def greedy_order(self) -> list:
        """Values in the order the greedy knapsack recomputes them. An item is a
        kept storage: recomputing every kept value that holds it frees it. Each
        such value's recipe reads its inputs either kept as they are (which may
        keep new storages) or recomputed too, back to values already kept (a
        chain): whichever frees more bytes per unit of cost."""
        values = self.values
        recompute, order = set(), []
        while True:
            _, kept = needed_values(self.profile, frozenset(recompute))
            holders = {}
            for i in kept:
                holders.setdefault(values[i].storage, set()).add(i)
            best, best_ratio = None, 0.0
            for storage, members in holders.items():
                freed = self._bytes(storage) if storage is not None else 0
                if not freed:
                    continue
                for move in (self._chain(members, kept | recompute),
                             self._alone(members, kept, recompute, holders)):
                    if move is None:
                        continue
                    take, new_bytes = move
                    gain = freed - new_bytes
                    cost = sum(values[i].cost for i in take)
                    ratio = gain / max(cost, 1e-12)
                    if gain > 0 and ratio > best_ratio:
                        best, best_ratio = take, ratio
            if best is None:
                return order
            for i in sorted(best):
                recompute.add(i)
                order.append(i)

    def _inputs(self, i):
        return [a[1] for a in self.values[i].inputs
                if type(a) is tuple and a and a[0] == "value"]

    def _chain(self, members, available):
        """Recompute ``members`` and what they need back to ``available`` values."""
        take, stack = set(), list(members)
        while stack:
            i = stack.pop()
            if i in take or (i in available and i not in members):
                continue
            take.add(i)
            stack.extend(self._inputs(i))
        return take, 0

    def _alone(self, members, kept, recompute, holders):
        """Recompute ``members`` alone; the inputs they read become kept."""
        new = {self.values[j].storage for i in members for j in self._inputs(i)
               if j not in kept and j not in recompute and j not in members}
        new -= set(holders) | {None}
        return set(members), sum(self._bytes(s) for s in new)

    def _bytes(self, storage) -> int:
        v = self.values[storage]
        return v.nbytes if v.freed_at is not None else 0

    def knapsack(self):
        order = self.greedy_order()
        prefixes = [frozenset(order[:k]) for k in range(len(order) + 1)]
        # Peaks fall as the prefix grows, until recomputed values start to pile up
        # in the backward (each lives from its recomputation to its last use): the
        # shortest fitting prefix among evenly spaced ones, then a bisection
        # between it and the sample before.
        samples = _spread(list(range(len(prefixes))), PREFIX_SAMPLES)
        first = next((k for k in samples if self.fits(prefixes[k])), None)
        if first is None:
            # None of them fits: look between the lowest one's neighbours (the
            # smallest peak the planner reports is the least found there).
            low = min(samples, key=lambda k: self.sim(prefixes[k]).peak)
            at = samples.index(low)
            near = range(samples[max(at - 1, 0)], samples[min(at + 1, len(samples) - 1)] + 1)
            first = next((k for k in _spread(list(near), PREFIX_SAMPLES)
                          if self.fits(prefixes[k])), None)
            if first is None:
                start = self.repair(min((prefixes[k] for k in near),
                                        key=lambda p: self.sim(p).peak))
                return (None if start is None else self.prune(start.recompute)), prefixes
            samples = [k for k in near if k <= first]
        lo, hi = samples[max(samples.index(first) - 1, 0)], first
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fits(prefixes[mid]):
                hi = mid
            else:
                lo = mid + 1
        return self.refill(self.prune(self.sim(prefixes[hi]).recompute)), prefixes

    def prune(self, recompute, among=None):
        """Drop recomputations the budget does not need, dearest first: a group
        of them is dropped at once if the peak still fits without it, else it is
        split in halves and each tried (a greedy prefix carries many a cheap
        recomputation that frees nothing the peak needs: views, both halves of a
        pair). Plans whose bound passes the budget cost no simulation
        (``fits``); at most ``PRUNE_NODES`` backward graph nodes are simulated,
        at least ``PRUNE_TRIALS`` plans. ``among``: only these may be dropped."""
        chosen = set(recompute)
        dear = sorted(chosen if among is None else chosen & set(among),
                      key=lambda i: (-self.values[i].cost, i))
        most = max(PRUNE_TRIALS, PRUNE_NODES // max(len(self.profile.graph.nodes), 1))
        simulated = len(self.simulations)
        groups = [dear[k:k + PRUNE_GROUP] for k in range(0, len(dear), PRUNE_GROUP)]
        while groups and len(self.simulations) - simulated < most:
            group = groups.pop(0)
            trial = chosen - set(group)
            if self.fits(trial):
                chosen = trial
            elif len(group) > 1:
                half = len(group) // 2
                groups[:0] = [group[:half], group[half:]]
        return self.sim(chosen)

    def refill(self, chosen):
        """Keep one of the dearest recomputations (up to ``REFILL_TRIALS`` of
        them) and recompute cheaper values instead, cheapest first, until the
        plan fits again, then prune: a plan that costs less replaces ``chosen``,
        and the search goes on from it (the greedy order takes a dear value where
        several cheap ones would do: a GELU output where the LayerNorms' would)."""
        if chosen is None:
            return None
        tried, improved = set(), True
        while improved:
            improved = False
            dear = sorted((i for i in chosen.recompute if i not in tried),
                          key=lambda i: (-self.values[i].cost, i))[:REFILL_TRIALS]
            for r in dear:
                tried.add(r)
                better = self._swap_out(chosen, r)
                if better is not None:
                    chosen, improved = better, True
                    break
        return chosen

    def _swap_out(self, chosen, r):
        values = self.values
        plan = set(chosen.recompute) - {r}
        simulated = len(self.simulations)
        for k in sorted((k for k in self.decisions() if k not in plan and k != r),
                        key=lambda k: (values[k].cost, k)):
            if values[k].cost >= values[r].cost or \
                    len(self.simulations) - simulated >= REFILL_SIMULATIONS:
                return None
            plan.add(k)
            if self.fits(plan):   # (what was there before was pruned already)
                better = self.prune(plan, among=plan - chosen.recompute)
                return better if better.peak <= self.budget and \
                    better.cost < chosen.cost else None
        return None

    def repair(self, start):
        """No prefix fits: up to ``EXACT_DECISIONS`` decisions, the cheapest plan
        that fits among every plan; past them, the first of the plans whose bound
        fits the budget (the bound's DP for the budget) that fits when simulated
        (up to ``FRONT_TRIALS``), else the lowest plan found (``lowest_found``,
        from the lowest prefix too) if it fits; else None -- at once when no
        plan's bound fits (no plan does: ``lowest`` finds the smallest peak)."""
        if self.every(EXACT_DECISIONS):
            return self.best(self.simulations.values())
        low, exact = self.front_lowest()
        if exact:   # the lowest plan of all (no plan's peak is below its bound)
            return self.prune(low.recompute) if low.peak <= self.budget else None
        bound = self._bound()
        if self.budget < bound({})[0]:
            return None
        found = bound_front(self.profile, bound.decisions, BUDGET_STATES,
                            budget=self.budget, feasible_only=True)
        if found.complete and not found.points:
            return None
        for _, _, plan in sorted(found.points, key=lambda x: x[0])[:FRONT_TRIALS]:
            s = self.sim(plan)
            if s.peak <= self.budget:
                return s
        low = self.lowest_found(extra=(self.sim(start),))
        return low if low.peak <= self.budget else None

    def lowest_found(self, extra=()):
        """Where the front is too big or not exact: the lower of the descent's
        plan (``lowest_plan``, from ``extra`` too) and the bisection's
        (``bound_lowest``, from the lowest plan simulated by then)."""
        low = self.lowest_plan(extra=extra)
        seed = min(self.simulations.values(), key=lambda s: (s.peak, s.cost))
        found, _ = self.bound_lowest(seed)
        return min(found, low, key=lambda s: (s.peak, s.cost))

    def every(self, max_decisions) -> bool:
        """Simulate every plan (each subset of the decisions), if there are at most
        ``max_decisions`` decisions; whether it did."""
        decisions = self.decisions()
        if len(decisions) > max_decisions:
            return False
        for k in range(len(decisions) + 1):
            for subset in itertools.combinations(decisions, k):
                self.sim(subset)
        return True

    # ------------------------------------------------------------ the lowest peak

    def decisions(self) -> list:
        """The values a plan may recompute or keep, largest storage first: those
        the backward needs when everything is recomputed."""
        every = frozenset(v.index for v in self.values)
        recompute, kept = needed_values(self.profile, every)
        return sorted(recompute | kept, key=lambda i: (-self.values[i].nbytes, i))

    def families(self) -> list:
        """Plans that recompute every output of some kinds of prim (every linear
        output; every GELU and LayerNorm output; ...): the layered structure
        of a model, where a plan repeats per layer."""
        kinds = sorted({self.values[i].prim for i in self.decisions()})
        if len(kinds) <= FAMILY_KINDS:
            sets = [c for k in range(1, len(kinds) + 1)
                    for c in itertools.combinations(kinds, k)]
        else:   # one kind, or every kind but one
            sets = [(k,) for k in kinds] + [tuple(x for x in kinds if x != k) for k in kinds]
        return [self.sim({v.index for v in self.values if v.prim in chosen})
                for chosen in sets]

    def lowest_plan(self, extra=()):
        """The plan of the lowest predicted peak found (the cheapest among equal
        peaks), the same whatever the budget: the best of the greedy order's
        prefixes, the prim families and recomputing everything, each improved by
        a first-improvement descent (``_improve``) from the lowest few of them,
        for at most ``DESCENT_TRIALS`` plans tried."""
        order = self.greedy_order()
        ks = _spread(list(range(len(order) + 1)), ALL_PREFIXES)
        low = min(range(len(ks)), key=lambda at: self.sim(order[:ks[at]]).peak)
        ks += range(ks[max(low - 1, 0)], ks[min(low + 1, len(ks) - 1)] + 1)  # (around the lowest)
        starts = [self.sim(order[:k]) for k in ks]
        decisions = self.decisions()
        starts += self.families() + [self.sim(decisions)] + list(extra)
        swaps = len(decisions) <= SWAP_DECISIONS
        # A descent from each of the lowest few starts (their plans differ in
        # where along the layers they keep values); the best end wins.
        ranked = sorted({s.recompute: s for s in starts}.values(), key=lambda s: (s.peak, s.cost))
        # (a simulation costs about the size of the backward graph: a bigger graph
        # gets fewer trials, at least one flip of every decision)
        trials = max(len(decisions), DESCENT_NODES // max(len(self.profile.graph.nodes), 1))
        best, visited, self.trials = ranked[0], set(), min(trials, DESCENT_TRIALS)
        for current in ranked[:DESCENT_STARTS]:
            visited.add(current.recompute)
            while current is not None and self.trials > 0:
                if (current.peak, current.cost) < (best.peak, best.cost):
                    best = current
                current = self._improve(current, decisions, visited, swaps)
                if current is not None:
                    visited.add(current.recompute)
        return self.prune(best.recompute) if best.peak <= self.budget else best

    def _improve(self, current, decisions, visited, swaps):
        """A plan one move from ``current``: the first better one (a lower peak, or
        the same peak at a lower cost) one flip away (recompute a value, or keep
        it), or one flip or swap of what is kept away with everything else
        recomputed, else (``swaps``) one swap away (keep one recomputed value and
        recompute one kept value), else a swap to a plan of the same peak not
        visited yet (a plateau: a layered model's lowest plan is often two swaps
        away, through a plan no better); else None. Each plan tried counts
        against ``self.trials``."""
        key = (current.peak, current.cost)
        recompute = current.recompute
        moves = [recompute ^ {i} for i in decisions]
        # The same moves on what is kept, everything else recomputed (the plans
        # of segment checkpointing: move one kept value along the layers)
        every, kept = frozenset(decisions), current.kept & frozenset(decisions)
        moves += [every - (kept ^ {i}) for i in decisions]
        moves += [every - ((kept - {i}) | {j}) for i in sorted(kept) for j in decisions
                  if j not in kept]
        if swaps:
            inside = [i for i in decisions if i in recompute]
            outside = [i for i in decisions if i not in recompute]
            moves += [(recompute - {i}) | {j} for i in inside for j in outside]
        level = None
        for k, move in enumerate(moves):
            if self.trials <= 0:
                return None
            self.trials -= 1
            trial = self.sim(move)
            if (trial.peak, trial.cost) < key:
                return trial
            if k >= len(decisions) and level is None and trial.peak == current.peak and \
                    trial.recompute not in visited:
                level = trial
        return level

    # ------------------------------------------------------------ min-cut

    def min_cut(self, allowed) -> frozenset:
        """The values past a minimum cut when only ``allowed`` may be recomputed."""
        values = self.values
        g = nx.DiGraph()
        g.add_node("source")
        for v in values:
            nbytes = self._bytes(v.storage) if v.storage is not None else 0
            g.add_edge(("in", v.index), ("out", v.index), capacity=nbytes)
            if v.index not in allowed:
                g.add_edge("source", ("in", v.index), capacity=math.inf)
            for a in v.inputs:
                if type(a) is tuple and a and a[0] == "value":
                    g.add_edge(("out", a[1]), ("in", v.index), capacity=math.inf)
            if v.saved:
                g.add_edge(("out", v.index), "sink", capacity=math.inf)
        if "sink" not in g:
            return frozenset()
        _, (reachable, _) = nx.minimum_cut(g, "source", "sink")
        return frozenset(v.index for v in values
                         if ("in", v.index) not in reachable and v.index in allowed)

    def mincut(self):
        values = self.values
        per_byte = sorted({v.cost / max(self._bytes(v.storage) if v.storage is not None
                                        else 0, 1) for v in values})
        plans = [self.sim(self.min_cut({v.index for v in values
                                        if v.cost / max(self._bytes(v.storage) if v.storage
                                                        is not None else 0, 1) <= t}))
                 for t in _spread(per_byte, 24)]
        best = self.best(plans)
        return (None if best is None else self.prune(best.recompute)), plans


def _spread(xs, n):
    """Up to ``n`` of ``xs`` (sorted), evenly spaced, always the last."""
    if len(xs) <= n:
        return xs
    step = (len(xs) - 1) / (n - 1)
    return [xs[round(k * step)] for k in range(n)]


FORMULATIONS = ("knapsack", "mincut")


def every_plan(profile, max_decisions=EXACT_DECISIONS):
    """Every plan of ``profile`` simulated (recompute set -> Simulation): each
    subset of its decisions, those that need the same values counted once; None
    past ``max_decisions`` decisions (2 ** n subsets). The exact answer the
    planner is checked against (tests, benchmarks/planner.py)."""
    planner = _Planner(profile, -1)
    return planner.simulations if planner.every(max_decisions) else None


def lowest(profile, simulations=None):
    """(the simulation of the lowest plan, seconds), the same whatever the
    budget: exact (every plan simulated) up to ``EXACT_DECISIONS`` decisions, else
    the front's (exact where it simulates to its bound), else the lowest the
    searches find (``_Planner.lowest_found``). ``simulations``: plans
    of ``profile`` simulated before (a dict that ``solve`` filled)."""
    start = time.perf_counter()
    planner = _Planner(profile, -1, simulations)
    if planner.every(EXACT_DECISIONS):
        low = min(planner.simulations.values(), key=lambda s: (s.peak, s.cost))
    else:
        low, exact = planner.front_lowest()
        if not exact:
            found = planner.lowest_found()
            if low is None or (found.peak, found.cost) < (low.peak, low.cost):
                low = found
    return low, time.perf_counter() - start


def solve(profile, budget_bytes, formulation="knapsack", simulations=None):
    """(simulation of the chosen plan or None, seconds, smallest peak seen,
    the planner). ``simulations``: as for ``lowest``."""
    if formulation not in FORMULATIONS:
        raise ValueError(f"plan_checkpoints: formulation must be one of {FORMULATIONS}, "
                         f"got {formulation!r}")
    start = time.perf_counter()
    planner = _Planner(profile, budget_bytes, simulations)
    if formulation == "knapsack":
        chosen, _ = planner.knapsack()
        if len(planner.decisions()) > EXACT_DECISIONS:
            chosen = planner.front_cheapest(chosen)
    else:
        chosen, _ = planner.mincut()
    seconds = time.perf_counter() - start
    smallest = min(s.peak for s in planner.simulations.values())
    return chosen, seconds, smallest, planner
