"""The predicted memory of forward plus backward under a plan, from the profile.

A plan is the set ``recompute`` of forward values (prim call indices) that are
saved as recipes. ``needed`` follows: the values backward nodes saved, and the
inputs of every recomputed value's recipe; the needed values not recomputed are
kept (their storages live from the forward until their last use in the backward).

Forward: the recording run's live bytes after each prim call, plus every kept
storage the recording run had already freed by then.

Backward: the recorded graph recomputes every saved value; the plan's graph is
derived from it exactly as the tracer would build it -- each saved value is
emitted where the autograd node that first reads it starts (its recomputation's
prim nodes, with what they need that was not emitted before; a kept value is read
from ``inputs`` instead) -- and planned with ``memory_schedule``
(the one liveness analysis, ``Graph.last_uses``). To its live bytes come the
bytes live when the backward starts, plus the kept storages until their last use
(on "c", until the end: it releases its inputs only at callbacks). That is the
"python" backend's schedule, to the byte; the C backend's arena and the eager
engine (backend None) hold memory their own ways, so ``plan_checkpoints``
measures its plan.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from compiled_autograd.autograd.recipe import saved_with_output
from compiled_autograd.ir.graph import Graph
from compiled_autograd.memory.schedule import memory_schedule
from compiled_autograd.runtime.prims import PRIMS


@dataclass
class Simulation:
    recompute: frozenset      # the values recomputed (only those needed)
    kept: frozenset           # the values kept for the backward
    peak: int                 # predicted peak of forward plus backward
    forward_peak: int
    backward_peak: int
    cost: float               # recompute cost, seconds at the reference rates
    flops: int                # recompute FLOPs
    graph: Graph              # the plan's backward graph
    schedule: object          # its MemorySchedule
    node_of: dict             # recomputed value -> its node in ``graph``
    backward_start: int = 0   # bytes live outside the graph when the backward starts
    freed_after: dict = field(default_factory=dict)  # step -> kept bytes freed after it

    def whole_schedule(self):
        """``schedule`` with the bytes live outside the backward graph added to every
        step (what the forward left live, kept storages until their last use): the
        predicted live bytes of forward plus backward, during the backward, as
        ``ca.memory.profile()`` counts them around both. Its ``peak_bytes`` is
        ``backward_peak``; its ``live_at_peak`` is empty (what lives outside the
        graph has no graph node)."""
        steps, outside, peak, at = [], self.backward_start, self.backward_start, None
        for step in self.schedule.steps:
            during = outside + step.peak_bytes
            outside -= self.freed_after.get(step.index, 0)
            steps.append(replace(step, peak_bytes=during, live_bytes=outside + step.live_bytes))
            if during > peak:
                peak, at = during, step.node
        return replace(self.schedule, steps=steps, peak_bytes=peak, peak_node=at,
                       live_at_peak=[])


def needed_values(profile, recompute) -> tuple[frozenset, frozenset]:
    """(recomputed, kept): the values the backward needs, split by the plan. (The
    output of a prim whose backward reads it with an input is recomputed with
    that input, as the recorder does: ``recipe.saved_with_output``.)"""
    values = profile.values
    recompute = set(recompute)
    for v in values:
        if v.index not in recompute:
            tied = saved_with_output(PRIMS[v.prim])
            if any(type(a) is tuple and a and a[0] == "value" and a[1] in recompute
                   for a in (v.inputs[i] for i in tied if i < len(v.inputs))):
                recompute.add(v.index)
    needed, stack = set(), [v.index for v in values if v.saved]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        if i in recompute:
            stack.extend(a[1] for a in values[i].inputs
                         if type(a) is tuple and a and a[0] == "value")
    return frozenset(needed & recompute), frozenset(needed - recompute)


def kept_storages(profile, kept) -> dict:
    """storage -> bytes, for the storages the kept values hold that the recording
    run freed during the forward (the rest were alive anyway)."""
    out = {}
    for i in kept:
        s = profile.values[i].storage
        if s is not None and profile.values[s].freed_at is not None:
            out[s] = profile.values[s].nbytes
    return out


def plan_graph(profile, recompute):
    """The plan's backward graph: (graph, node_of recomputed value, kept reads)."""
    old_graph = profile.graph
    graph = Graph()
    new, node_of, kept_nodes = {}, {}, {}

    def copy(old, args):
        # (a prim node is named after its prim, as the tracer names it: the plan's
        # graph and the traced one then give recomputed values the same names)
        hint = old.target if old.op == "call_function" and old.target in PRIMS else \
            re.sub(r"_\d+$", "", old.name)
        node = graph.create_node(old.op, old.target, args, old.kwargs, name=hint,
                                 meta=old.meta)
        new[old] = node
        return node

    def arg(a):
        if not hasattr(a, "op"):
            return tuple(arg(x) for x in a) if isinstance(a, (tuple, list)) else a
        if a in new:
            return new[a]
        index = a.meta.get("recipe")
        if index is None:   # a read that the walk has not reached yet
            return copy(a, tuple(arg(x) for x in a.args))
        if index not in recompute:
            node = graph.create_node("call_function", "getitem", (new[old_graph.nodes[0]], -1),
                                     name="kept", meta={**a.meta, "kept": index})
            kept_nodes[index] = node
            new[a] = node
            return node
        node = copy(a, tuple(arg(x) for x in a.args))
        node_of[index] = node
        return node

    # A saved value is swapped in when the autograd node that reads it starts
    # (after its pre-hooks), in the order of its saved values: the recorded graph
    # notes each swap (meta "swapped": (visit, sequence)); it is emitted there,
    # with what it needs that was not emitted before.
    swaps = sorted((visit, seq, node) for node in old_graph.nodes
                   for visit, seq in node.meta.get("swapped", ()))
    swapped_at: dict = {}
    for visit, _, node in swaps:
        swapped_at.setdefault(visit, []).append(node)
    for old in old_graph.nodes:
        if "recipe" in old.meta:
            continue
        if old.meta.get("visit") in swapped_at and not _before_swaps(old):
            for saved in swapped_at.pop(old.meta["visit"]):
                arg(saved)
        if old not in new:
            copy(old, tuple(arg(a) for a in old.args))
    return graph, node_of, kept_nodes


def _before_swaps(node) -> bool:
    """A node of an autograd node's visit that comes before its saved values are
    swapped in: a pre-hook, or a read."""
    return (node.op == "call_hook" and node.target in ("tensor_pre_hook", "pre_hook")) or \
        (node.op == "call_function" and node.target == "getitem")


def simulate(profile, recompute) -> Simulation:
    recompute, kept = needed_values(profile, frozenset(recompute))
    storages = kept_storages(profile, kept)
    values = profile.values
    # forward
    extra_at = {}
    for s, nbytes in storages.items():
        t = values[s].freed_at
        extra_at[t] = extra_at.get(t, 0) + nbytes
    extra, forward_peak = 0, 0
    for t, live in enumerate(profile.forward_live):
        extra += extra_at.get(t, 0)
        forward_peak = max(forward_peak, live + extra)
    # backward
    graph, node_of, kept_nodes = plan_graph(profile, recompute)
    schedule = memory_schedule(graph, profile.packed_kinds)
    dies_after = schedule.dies_after
    position = {node: i for i, node in enumerate(graph.nodes)}
    last = {}
    for node, dead in dies_after.items():
        for d in dead:
            index = d.meta.get("kept")
            if index is not None and kept_nodes.get(index) is d:
                s = values[index].storage
                last[s] = max(last.get(s, -1), position[node])
            s = d.meta.get("storage")   # (a storage read as it is, see profile.Value)
            if s is not None:
                last[s] = max(last.get(s, -1), position[node])
    # Storages alive at the end of the forward only for the backward's sake
    # (saved as they are, or held by saved-tensor hooks): freed after their last
    # use, as the kept ones are.
    held = {s: values[s].nbytes for s in last
            if s is not None and s not in storages and values[s].freed_with_graph}
    freed_after = {}
    # (the C backend calls no Python where none is needed, so the arrays it was
    # handed stay until it returns: kept values live through its backward)
    frees_inputs = profile.backend != "c"
    for s, nbytes in list(storages.items()) + list(held.items()):
        at = last.get(s)
        if at is not None and frees_inputs:
            freed_after[at] = freed_after.get(at, 0) + nbytes
    start = profile.backward_start + sum(storages.values())
    released, backward_peak = 0, start
    for step in schedule.steps:
        backward_peak = max(backward_peak, start - released + step.peak_bytes)
        released += freed_after.get(step.index, 0)
    done = [i for i in recompute if i in node_of]
    peak = max(forward_peak, backward_peak)
    if not done and profile.baseline_peak:
        # Recomputing nothing is the run without a plan, whose peak was measured
        # (what the simulation does not see -- a selective checkpoint's cache, a
        # checkpoint's saved inputs -- is in it): a budget of 1.0 always fits.
        peak = profile.baseline_peak
    return Simulation(frozenset(done), kept, peak, forward_peak,
                      backward_peak, sum(values[i].cost for i in done),
                      sum(values[i].flops for i in done), graph, schedule, node_of, start,
                      freed_after)
