"""The lowest peak and the cheapest plan for a budget, exactly: a branch and bound.

A plan keeps or recomputes each *decision* (a value the backward needs when
everything is recomputed). ``simulate`` predicts a plan's peak; enumerating every
plan (``solve.every_plan``) is exact but costs 2 ** n simulations. The branch and
bound here decides the values from the last made in the forward to the first --
so when a value is decided, every value that could read it is decided already,
and whether the backward needs it is known (a value nothing needs is not branched
on) -- and cuts a branch when a *lower bound* of the peak of every plan below it
is above the best peak found (or the budget), or the recompute cost already
decided is no less than the best plan's. Each complete plan is simulated: the
answer is a simulated plan, and no plan was cut that could beat it.

The lower bound (``_Bound``) counts, at each step of the backward that every plan
has (the nodes of the recorded graph that are neither a kept read nor a
recomputation: the gradients, hooks, ...) and at each step of the forward, only
bytes that every plan below the branch must hold there:

- what lives outside the backward graph when it starts, less every storage that
  the backward may release early (``freed_with_graph``);
- the backward's own live bytes at that step in the plan that keeps everything
  (its nodes' values are the same in every plan: their inputs are gradients and
  saved values, whichever way a saved value is made);
- a saved value decided kept: its storage (once per storage, if the forward freed
  it: else it is in the first item already) from the backward's start to its last
  reader; and in the forward from when the recording run freed it;
- a value decided recomputed (saved or not): its own bytes (none for a view
  prim) from where the first of the recomputed values that need it is emitted
  (its own first reader, or earlier: a recomputed value's inputs are emitted
  with it) to the latest of its own last reader (if saved), the emission of
  each recomputed value that reads it, and -- a recomputed view of it keeping
  its storage -- the end of each recomputed view of it;
- a saved value not decided yet: the smaller of keeping and recomputing, from
  the first reader it is swapped in for to its last.

Recomputation's other costs (a chain's values live together while it runs, at
steps that only some plans have; a kept value read only by recomputation past
that recomputation's emission, through a view) are not counted: the bound is
lower, never higher, than the simulated peak (``tests/test_memory_plan_exact.py``
checks it on random plans).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from compiled_autograd.autograd.recipe import saved_with_output
from compiled_autograd.planning.simulate import needed_values, simulate
from compiled_autograd.runtime.prims import PRIMS

NODE_LIMIT = 200_000   # branch-and-bound nodes before giving up (the answer is then None)

KEEP, RECOMPUTE, OPEN = 0, 1, 2


@dataclass
class Result:
    best: object          # the Simulation of the plan found, or None
    proven: bool          # the search finished: no plan is better (within the limits)
    nodes: int            # branch-and-bound nodes visited
    simulated: int        # complete plans simulated
    seconds: float


class _Bound:
    """The lower bound of the peak (and of the recompute cost) of every plan that
    agrees with a partial assignment (see the module's docstring)."""

    def __init__(self, profile, decisions):
        self.profile = profile
        values = self.values = profile.values
        self.decisions = sorted(decisions, reverse=True)   # last made first
        keep_all = simulate(profile, frozenset())
        nodes = keep_all.graph.nodes
        position = {node: k for k, node in enumerate(nodes)}
        first, last = {}, {}
        for node in nodes:
            index = node.meta.get("kept")
            if index is not None:
                first[index] = position[node]
        for node, dead in keep_all.schedule.dies_after.items():
            for d in dead:
                index = d.meta.get("kept")
                if index is not None:
                    last[index] = max(last.get(index, -1), position[node])
        steps = keep_all.schedule.steps
        assert [s.index for s in steps] == list(range(len(nodes)))
        # the steps every plan has, and the count of them before each position
        fixed = [k for k, node in enumerate(nodes) if "kept" not in node.meta]
        self.fixed_before = np.searchsorted(np.array(fixed), np.arange(len(nodes) + 1))
        held = sum(values[s].nbytes for s in {v.storage for v in values}
                   if s is not None and values[s].freed_with_graph)
        self.backward_base = np.array([profile.backward_start - held + steps[k].peak_bytes
                                       for k in fixed], dtype=np.int64)
        self.forward_live = np.array(profile.forward_live, dtype=np.int64)
        self.first = {i: self.fixed_before[first[i]] for i in first}
        self.last = {i: self.fixed_before[last[i] + 1] - 1 for i in last}
        self.saved = {i for i in self.decisions if values[i].saved and i in first}
        self.inputs = {i: [a[1] for a in values[i].inputs
                           if type(a) is tuple and a and a[0] == "value"]
                       for i in self.decisions}
        # a kept value whose output is recomputed with a recomputed input
        # (``saved_with_output``) is counted as not decided
        self.tied = {i for i in self.decisions if saved_with_output(PRIMS[values[i].prim])}
        # bytes a recomputation allocates (a view prim none, as memory_schedule
        # counts it, even where the forward's call had to copy)
        self.made = {i: 0 if PRIMS[values[i].prim].view else values[i].nbytes
                     for i in self.decisions}
        # a view prim's base (its first array input, when a value): a recomputed
        # base's storage lives as long as any recomputed view of it
        self.view_base = {}
        for i in self.decisions:
            if PRIMS[values[i].prim].view:
                a = next((a for a in values[i].inputs if type(a) is tuple and a
                          and a[0] in ("value", "kept")), None)
                if a is not None and a[0] == "value":
                    self.view_base[i] = a[1]

    def end_of(self, i, reach, end_so_far) -> int:
        """The last backward step (of those every plan has) a recomputed value ``i``
        is alive at, at least: its own last reader if saved, and what its
        recomputed readers, decided before it, left in ``end_so_far``."""
        return max(end_so_far, self.last[i] if i in self.saved else -1)

    def reader_end(self, i, j, reach_i, end_i) -> int:
        """What a recomputed reader ``i`` (emitted before step ``reach_i``, alive
        to ``end_i``) makes its input ``j`` live to, if ``j`` is recomputed: up to
        ``i``'s emission, and as long as ``i`` if ``i`` is a view of ``j``."""
        return max(reach_i - 1, end_i if self.view_base.get(i) == j else -1)

    def kept_bytes(self, i) -> int:
        s = self.values[i].storage
        return self.values[s].nbytes if s is not None and \
            self.values[s].freed_at is not None else 0

    def live(self, choice):
        """(the bound's live bytes at each backward step every plan has, at each
        forward step, the cost bound, the values that may be needed)."""
        values = self.values
        needed, maybe, reach = set(), set(), {}
        for i in self.decisions:       # readers before what they read
            c = choice.get(i, OPEN)
            if i in self.saved:
                needed.add(i)
                reach[i] = min(reach.get(i, self.first[i]), self.first[i])
            if i in needed and c == RECOMPUTE:
                for j in self.inputs[i]:
                    needed.add(j)
                    if i in reach:
                        reach[j] = min(reach.get(j, reach[i]), reach[i])
            elif (i in needed or i in maybe) and (c != KEEP or i in self.tied):
                maybe.update(self.inputs[i])   # (needed if it is recomputed)
        n = len(self.backward_base)
        delta = np.zeros(n + 1, dtype=np.int64)
        storages, cost = {}, 0.0
        for i in needed:
            c = choice.get(i, OPEN)
            if c == KEEP and i not in self.tied:
                s = values[i].storage
                kb = self.kept_bytes(i)
                if kb and i in self.saved:
                    storages[s] = max(storages.get(s, -1), self.last[i])
                elif kb:   # read by a recomputation emitted before step reach[i]
                    storages[s] = max(storages.get(s, -1), reach[i] - 1)
            elif c == RECOMPUTE:
                cost += values[i].cost
        counted = set(storages)
        for s, end in storages.items():
            delta[0] += values[s].nbytes
            delta[end + 1] -= values[s].nbytes
        # a recomputed value lives from its emission to its last reader's
        # emission (or the last reader of a recomputed view of it), at least
        ends = {}
        for i in self.decisions:     # readers before what they read
            if i not in needed or choice.get(i, OPEN) != RECOMPUTE:
                continue
            e = ends[i] = self.end_of(i, reach[i], ends.get(i, -1))
            for j in self.inputs[i]:
                ends[j] = max(ends.get(j, -1), self.reader_end(i, j, reach[i], e))
        for i in needed:
            c = choice.get(i, OPEN)
            if i not in self.saved and c != RECOMPUTE:
                continue
            if c == KEEP and i not in self.tied:
                continue
            own = self.made[i]
            if c != RECOMPUTE:   # open (or tied): the smaller of keeping and recomputing
                own = min(own, 0 if values[i].storage in counted else self.kept_bytes(i))
            if own:
                lo, hi = reach[i], ends[i] if c == RECOMPUTE else self.last[i]
                if lo <= hi:
                    delta[lo] += own
                    delta[hi + 1] -= own
        extra = np.zeros(len(self.forward_live) + 1, dtype=np.int64)
        for s in storages:
            extra[values[s].freed_at] += values[s].nbytes
        backward = self.backward_base + np.cumsum(delta[:n])
        forward = self.forward_live + np.cumsum(extra[:len(self.forward_live)])
        return backward, forward, cost, needed | maybe

    def __call__(self, choice) -> tuple:
        """(lower bound of the peak, of the cost, the values that may be needed) of
        the plans that agree with ``choice`` (value -> KEEP, RECOMPUTE; the others
        open), decided from the last value made in the forward."""
        backward, forward, cost, needed = self.live(choice)
        peak = max(int(backward.max()) if len(backward) else 0,
                   int(forward.max()) if len(forward) else 0)
        return peak, cost, needed


def branch_and_bound(profile, budget=None, incumbent=None, simulations=None,
                     node_limit=NODE_LIMIT, decisions=None) -> Result:
    """With ``budget`` None: the plan of the lowest simulated peak (the cheapest
    among equal peaks). With a budget in bytes: the cheapest plan whose simulated
    peak fits it (None if none does). ``incumbent``: a Simulation to beat (a
    planner's plan: the search then only has to prove it or find better).
    ``simulations``: a dict recompute set -> Simulation, shared with the planner.
    Gives up after ``node_limit`` nodes (``proven`` False)."""
    start = time.perf_counter()
    sims = {} if simulations is None else simulations
    if decisions is None:
        every = frozenset(v.index for v in profile.values)
        recompute, kept = needed_values(profile, every)
        decisions = recompute | kept
    bound = _Bound(profile, decisions)
    order = bound.decisions
    best = incumbent
    if best is not None and budget is not None and best.peak > budget:
        best = None
    count = {"nodes": 0, "simulated": 0}

    def better(peak, cost) -> bool:
        if budget is not None and peak > budget:
            return False
        if best is None:
            return True
        key = (cost, peak) if budget is not None else (peak, cost)
        return key < ((best.cost, best.peak) if budget is not None else (best.peak, best.cost))

    def sim(choice):
        recompute = needed_values(profile, frozenset(i for i, c in choice.items()
                                                     if c == RECOMPUTE))[0]
        s = sims.get(recompute)
        if s is None:
            s = sims[recompute] = simulate(profile, recompute)
            count["simulated"] += 1
        return s

    def promising(low, cost) -> bool:
        if budget is not None:
            return low <= budget and (best is None or cost < best.cost)
        return best is None or (low, cost) < (best.peak, best.cost)

    # an explicit stack (depth, choice): no recursion limit on big graphs
    stack = [(0, {})]
    proven = True
    while stack:
        depth, choice = stack.pop()
        count["nodes"] += 1
        if count["nodes"] > node_limit:
            proven = False
            break
        low, cost, needed = bound(choice)
        if not promising(low, cost):
            continue
        while depth < len(order) and order[depth] not in needed:
            depth += 1          # nothing needs it: keeping and recomputing are one plan
        if depth == len(order):
            s = sim(choice)
            if better(s.peak, s.cost):
                best = s
            continue
        i = order[depth]
        # the incumbent's choice first (searched first: pushed last)
        first = RECOMPUTE if best is not None and i in best.recompute else KEEP
        for c in (1 - first, first):
            stack.append((depth + 1, {**choice, i: c}))
    return Result(best, proven, count["nodes"], count["simulated"],
                  time.perf_counter() - start)


# ---------------------------------------------------------------- the DP

class _Bucket:
    """The states of one kind at one level, none dominated by another: a state
    is dropped when another has, on every stretch of steps, no more live bytes,
    and no higher cost. With a ``quantum`` (bytes) live bytes are compared in its
    units, rounded down, and a dropped state is merged into the one that drops
    it (or that it drops): live bytes the least of the two at every step, the
    lesser cost -- no longer one plan's (the plan None), but no more than either
    plan's, so that costs and peaks stay lower bounds."""

    def __init__(self, width):
        self.keys = np.empty((8, width), dtype=np.int64)
        self.costs = np.empty(8)
        self.alive = np.zeros(8, dtype=bool)
        self.rest = []
        self.n = 0

    def offer(self, key, cost, P, plan, quantum=0):
        n, keys, alive = self.n, self.keys[:self.n], self.alive[:self.n]
        if quantum:
            key = key // quantum
        if n:
            over = alive & (self.costs[:n] <= cost) & (keys <= key).all(1)
            if over.any():
                if quantum:
                    k = int(np.argmax(over))
                    self.rest[k] = (np.minimum(self.rest[k][0], P), None)
                return
            under = alive & (cost <= self.costs[:n]) & (key <= keys).all(1)
            if quantum and under.any():
                for k in np.flatnonzero(under):
                    P = np.minimum(P, self.rest[k][0])
                plan = None
            alive &= ~under
        if n == len(self.costs):
            self.keys = np.concatenate([self.keys, np.empty_like(self.keys)])
            self.costs = np.concatenate([self.costs, np.empty_like(self.costs)])
            self.alive = np.concatenate([self.alive, np.zeros_like(self.alive)])
        self.keys[n], self.costs[n], self.alive[n] = key, cost, True
        self.rest.append((P, plan))
        self.n += 1

    def states(self):
        return [(None, self.costs[k], self.rest[k][0], self.rest[k][1])
                for k in range(self.n) if self.alive[k]]


STATE_LIMIT = 200_000   # DP states kept at one level before giving up


@dataclass
class Front:
    """The lower bound's Pareto front over every plan: (peak, cost, recompute set)
    triples, none with both a higher peak and a higher cost than another, such
    that every plan's simulated peak is at least the bound of its plan."""
    points: list          # (peak bound, cost bound, recompute frozenset), by peak
                          # (for one budget: every plan kept, by cost)
    states: int           # most DP states at one level
    seconds: float
    decided: int = 0      # decisions taken (all of them, unless it gave up)
    decisions: int = 0

    @property
    def complete(self) -> bool:
        return self.decided == self.decisions

    def lowest(self):
        """(the least peak bound of any plan, a plan that reaches it, its cost)."""
        peak, cost, plan = self.points[0]
        return peak, plan, cost

    def cheapest(self, budget):
        """(the least cost bound of a plan whose bound fits ``budget``, the plan), or
        None: no plan's simulated peak fits either."""
        fitting = [(c, p, plan) for p, c, plan in self.points if p <= budget]
        if not fitting:
            return None
        cost, _, plan = min(fitting, key=lambda x: (x[0], x[1]))
        return cost, plan


def _future_bytes(b, order, n, t) -> list:
    """For each decision depth d: at each step (backward, then forward), the most
    bytes the values decided after ``order[d]`` may still add there (an upper
    bound: a value's larger interval, over every step it could reach)."""
    values, total = b.values, n + t
    out = [None] * len(order)
    acc = np.zeros(total, dtype=np.int64)
    # the latest a value may be emitted before, and live to, if recomputed
    latest, end = {}, {}
    for i in order:            # readers before what they read
        latest[i] = max(latest.get(i, 0), b.first[i] if i in b.saved else 0)
        end[i] = b.end_of(i, latest[i], end.get(i, -1))
        for j in b.inputs[i]:
            latest[j] = max(latest.get(j, 0), latest[i])
            end[j] = max(end.get(j, -1), b.reader_end(i, j, latest[i], end[i]))
    for d in range(len(order) - 1, -1, -1):
        out[d] = acc.copy()
        j = order[d]
        kb = b.kept_bytes(j)
        hi = min(end[j], n - 1) + 1
        acc[:hi] += max(b.made[j], kb)
        if j not in b.saved and kb:
            acc[hi:n] += kb
        elif j in b.saved and b.last[j] + 1 > hi:
            acc[hi:b.last[j] + 1] += kb
        if kb:
            acc[n + values[values[j].storage].freed_at:] += kb
    return out


def bound_front(profile, decisions=None, state_limit=STATE_LIMIT, budget=None,
                feasible_only=False, cost_limit=None, relax_steps=1,
                relax_bytes=0) -> Front:
    """The exact Pareto front of ``_Bound`` over every complete plan, by dynamic
    programming over the decisions from the last value made in the forward to the
    first. The bound of a plan is a max over steps of a sum of intervals, one per
    value, whose ends depend on the value's own choice and on those of the values
    that read it (decided before it): a DP state is what the undecided values
    still depend on (the reach of the recomputation that needs them, the kept
    storages whose owner is undecided) and the live bytes so far at every step;
    among states of one kind, one whose live bytes are no lower on every stretch
    of steps the future cannot tell apart, at no lower cost, is dropped. Gives up
    (``complete`` False, no points) when a level holds more than ``state_limit``
    states.

    With ``budget`` (bytes): only the plans whose bound fits it. A state whose
    live bytes pass it is dropped, and on a stretch where even the most the
    undecided values may add (``_future_bytes``) keeps it within the budget, its
    live bytes are not told apart (raised to that level in the comparison), so
    far fewer states remain. ``points`` is then every plan that survived, by
    cost (each fits the bound; the cheapest's cost is the least of any plan
    that fits the budget). ``feasible_only``: costs are ignored too (the
    question is only whether any plan's bound fits: ``points`` empty if none).
    ``cost_limit``: only plans that cost less (a plan to beat: a state that costs
    as much already is dropped).

    A relaxation, for where the exact DP holds too many states (its points are
    then lower bounds: with ``budget``, the least cost is a lower bound of the
    cheapest plan that fits, and no points means no plan fits):
    ``relax_steps``: states whose pending values would live over steps that
    agree once divided by it are one kind, whose future counts, at each step its
    states differ on, the fewer bytes (a point's cost is then a plan's, its peak
    a lower bound of that plan's bound); ``relax_bytes``: a state is merged into
    one of its kind whose live bytes, in units of it, are no higher on every
    stretch, at no higher cost (``_Bucket``: its plan then None)."""
    start = time.perf_counter()
    if decisions is None:
        every = frozenset(v.index for v in profile.values)
        recompute, kept = needed_values(profile, every)
        decisions = recompute | kept
    b = _Bound(profile, decisions)
    values = b.values
    n, t = len(b.backward_base), len(b.forward_live)
    base = np.concatenate([b.backward_base, b.forward_live]).astype(np.int64)
    order = b.decisions
    saved, first, last, tied = b.saved, b.first, b.last, b.tied
    kb = {i: b.kept_bytes(i) for i in order}

    def finalize(P, s, end):
        P = P.copy()
        P[:end + 1] += values[s].nbytes
        P[n + values[s].freed_at:] += values[s].nbytes
        return P

    future = _future_bytes(b, order, n, t) if budget is not None else None
    if budget is not None and int(base.max()) > budget:
        return Front([], 1, time.perf_counter() - start, len(order), len(order))
    # (frontier: value -> (reach if kept, reach if recomputed, end), groups: storage
    # -> last step) -> [(key, cost, P, plan)]; the two reaches differ only where
    # ``relax_steps`` merged kinds (each then the one that counts fewer bytes)
    level = {((), ()): [(None, 0.0, base.copy(), frozenset())]}
    most = 1
    for d, i in enumerate(order):
        rest = order[d + 1:]
        rest_points = {0, n}
        for j in rest:
            if j in saved:
                rest_points.add(first[j])
                rest_points.add(last[j] + 1)
            if kb.get(j):
                rest_points.add(n + values[values[j].storage].freed_at)
        # the moves (a kind of state, a choice for i), the kinds they lead to, those filled
        moves, kinds, filled = [], {}, []
        for (frontier_items, group_items), states in level.items():
            frontier, groups = dict(frontier_items), dict(group_items)
            needed = i in saved or i in frontier
            keep_reach, rec_reach, end_i = frontier.pop(i, (n, n, -1))
            bound_first = first[i] if i in saved else n
            keep_reach, rec_reach = min(keep_reach, bound_first), min(rec_reach, bound_first)
            options = (KEEP, RECOMPUTE) if needed else (KEEP,)
            for c in options:
                f2, g2 = dict(frontier), dict(groups)
                add = []          # (lo, hi, bytes) on the backward steps
                extra = 0.0
                if c == RECOMPUTE:
                    extra = values[i].cost
                    e = b.end_of(i, rec_reach, end_i)
                    if b.made[i]:
                        add.append((rec_reach, e, b.made[i]))
                    for j in b.inputs[i]:
                        k_j, r_j, e_j = f2.get(j, (keep_reach, rec_reach, -1))
                        f2[j] = (min(k_j, keep_reach), min(r_j, rec_reach),
                                 max(e_j, b.reader_end(i, j, keep_reach, e)))
                elif needed and i not in tied:
                    if kb[i]:   # (not saved: read by a recomputation emitted before reach)
                        s = values[i].storage
                        g2[s] = max(g2.get(s, -1), last[i] if i in saved else keep_reach - 1)
                elif i in saved:      # tied, kept: counted as not decided
                    s = values[i].storage
                    own = min(b.made[i], 0 if s in g2 else kb[i])
                    if own:
                        add.append((rec_reach, last[i], own))
                done = [(s, e) for s, e in g2.items() if s >= i]   # owners decided: final
                open_ = {s: e for s, e in g2.items() if s < i}
                kind = (tuple(sorted((j, k_j // relax_steps, r_j // relax_steps,
                                      e_j // relax_steps)
                                     for j, (k_j, r_j, e_j) in f2.items())),
                        tuple(sorted((s, e // relax_steps) for s, e in open_.items())))
                points = {p for entry in f2.values() for p in (entry[0], entry[1], entry[2] + 1)}
                points |= {e + 1 for e in open_.values()} | {n + values[s].freed_at for s in open_}
                known = kinds.get(kind)
                if known is None:
                    kinds[kind] = [f2, open_, points]
                else:     # (relax_steps: the same values pending, merged)
                    for j, (k_j, r_j, e_j) in f2.items():
                        k0, r0, e0 = known[0][j]
                        known[0][j] = (min(k0, k_j), max(r0, r_j), min(e0, e_j))
                    for s, e in open_.items():
                        known[1][s] = min(known[1][s], e)
                    known[2] |= points
                moves.append((states, kind, add, done, extra, c))
        nxt = {}
        for kind, (f2, open_, points) in kinds.items():
            cut = np.array(sorted(p for p in points | rest_points if p < n + t))
            floor = None
            if budget is not None:
                F = future[d].copy()
                for s, e in open_.items():   # a kept storage still to be counted
                    F[:e + 1] += values[s].nbytes
                    F[n + values[s].freed_at:] += values[s].nbytes
                floor = budget - np.maximum.reduceat(F, cut)
            nxt[kind] = (cut, floor, _Bucket(len(cut)))
        for states, kind, add, done, extra, c in moves:
            cut, floor, bucket = nxt[kind]
            for _, cost, P, plan in states:
                if cost_limit is not None and cost + extra >= cost_limit:
                    continue
                P2 = P
                if add or done:
                    P2 = P.copy()
                    for lo, hi, nb in add:
                        if lo <= hi:
                            P2[lo:hi + 1] += nb
                    for s, e in done:
                        P2 = finalize(P2, s, e)
                key = np.maximum.reduceat(P2, cut)
                if floor is not None:
                    if int(key.max()) > budget:
                        continue
                    key = np.maximum(key, floor)
                filled += [] if bucket.n else [kind]   # (by first state: ties as before)
                bucket.offer(key, 0.0 if feasible_only else cost + extra, P2,
                             None if plan is None else plan | {i} if c == RECOMPUTE else plan,
                             relax_bytes)
        level = {(tuple(sorted(kinds[kind][0].items())), tuple(sorted(kinds[kind][1].items()))):
                 nxt[kind][2].states() for kind in filled}
        size = sum(len(v) for v in level.values())
        most = max(most, size)
        if size > state_limit:
            return Front([], size, time.perf_counter() - start, d + 1, len(order))
    points = []
    for (_, group_items), states in level.items():
        for _, cost, P, plan in states:
            for s, end in group_items:
                P = finalize(P, s, end)
            points.append((int(P.max()), cost, plan))
    if budget is not None:
        points = sorted((p for p in points if p[0] <= budget), key=lambda x: (x[1], x[0]))
        return Front(points, most, time.perf_counter() - start, len(order), len(order))
    points.sort(key=lambda x: (x[0], x[1]))
    front, best_cost = [], float("inf")
    for p, c, plan in points:
        if c < best_cost:
            front.append((p, c, plan))
            best_cost = c
    return Front(front, most, time.perf_counter() - start, len(order), len(order))


def lowest_bound(profile, high, decisions=None, state_limit=STATE_LIMIT, tolerance=1e-3,
                 low=0, rounds=None, plans=None):
    """(lo, hi): the least bound of any plan lies in (lo, hi], so every plan's
    simulated peak is above ``lo`` -- by bisection on a budget, each step the
    bound's DP for that budget asking only whether any plan's bound fits
    (``bound_front(..., feasible_only=True)``), until ``hi - lo`` is at most
    ``tolerance * hi``. ``high``: a peak some plan reaches (the planner's);
    ``low``: a peak no plan's bound is at or below (0; or the bound of the
    empty assignment, every value open, less one). Where the DP gives up (over
    ``state_limit`` states), or after ``rounds`` steps, the bracket found so far
    is returned, and ``lo`` is still proven. ``plans``: a list that receives
    (bound, recompute set) of the plans each step found, the lowest first."""
    lo, hi = int(low), int(high)
    while hi - lo > tolerance * hi and (rounds is None or rounds > 0):
        rounds = None if rounds is None else rounds - 1
        mid = (lo + hi) // 2
        found = bound_front(profile, decisions, state_limit, budget=mid, feasible_only=True)
        if not found.complete:
            break
        if found.points:
            hi = min(p for p, _, _ in found.points)
            if plans is not None:
                plans[:0] = sorted(((p, plan) for p, _, plan in found.points),
                                   key=lambda x: x[0])
        else:
            lo = mid
    return lo, hi
