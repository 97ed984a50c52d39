"""Placing a planned schedule (``MemorySchedule.steps``, one per graph node) on a
measured timeline (``ca.memory.profile().timeline``), so that the report draws the
plan at the events where each graph node really ran, and can say which graph node
made each event.

Two ways, the exact one first:

- **marks**: the "eager" graph backend marks the end of every graph node while
  profiling; node k's events are those after node k-1's mark up to its own.
- **allocations**: generated code (backend "python") marks nothing. Every
  ``call_function`` node of the graph runs exactly one kernel, and ``Event.step``
  counts kernel calls, so node k's allocation is the alloc event of its prim with
  its bytes at kernel call ``p_k + offset``, where ``p_k`` counts the graph's
  kernels up to node k and ``offset`` the kernels that ran outside them
  (recomputation, reloads, hooks). The offset changes only across a ``call_hook``
  node; elsewhere a candidate must keep it, which rules out a wrong match between
  two equal allocations. A recompute is placed at the first "recomputed"
  allocation after the node before it, a reload at the first "reloaded" one;
  other nodes skip those, except a memory plan's recomputation (``Step.recipe``),
  a prim node whose allocation is "recomputed".

Nodes that match no event (views, getitems, hooks that allocate nothing) are drawn
between their matched neighbours; they own no event.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from compiled_autograd.ir.graph import STRUCTURAL


def _get(e, key):
    return e[key] if isinstance(e, dict) else getattr(e, key)


def _prim(name) -> str:
    return str(name).rsplit(":", 1)[-1]


@dataclass
class Alignment:
    x: list              # per plan step: its first event (float; interpolated if not matched)
    matched: list        # per plan step: True when placed on a real event
    node_of_event: list  # per event: the plan step that made it, or None
    method: str          # "marks", "allocations" or "none"

    @property
    def n_matched(self) -> int:
        return sum(self.matched)


def align(steps, events) -> Alignment:
    """Place ``steps`` on ``events`` (see module doc). Indices are into ``events``."""
    events = list(events)
    if any(_get(e, "action") == "mark" for e in events):
        start = _by_marks(steps, events)
        method = "marks"
    else:
        start = _by_allocations(steps, events)
        method = "allocations" if any(s is not None for s in start) else "none"
    owner = [None] * len(events)
    anchors = [(x, k) for k, x in enumerate(start) if x is not None]
    for (x, k), nxt in zip(anchors, anchors[1:] + [(len(events), None)]):
        for i in range(x, nxt[0]):
            owner[i] = k
    return Alignment(_interpolate(start, len(events)), [s is not None for s in start],
                     owner, method)


def _by_marks(steps, events):
    mark_at = {}
    for i, e in enumerate(events):
        if _get(e, "action") == "mark":
            mark_at.setdefault(str(_get(e, "name")), i)
    start, prev = [], -1
    for s in steps:
        end = mark_at.get(s.node)
        if end is None or end <= prev:
            start.append(None)
            continue
        start.append(prev + 1)
        prev = end
    return start


def _by_allocations(steps, events):
    allocs = [(i, e) for i, e in enumerate(events) if _get(e, "action") == "alloc"]
    start = [None] * len(steps)
    cursor, kernels, offset, free_offset = 0, 0, 0, True
    for k, s in enumerate(steps):
        if s.op == "call_hook":
            free_offset = True
            if s.event in ("recompute", "reload"):
                want = "recomputed" if s.event == "recompute" else "reloaded"
                j = next((j for j in range(cursor, len(allocs))
                          if _get(allocs[j][1], "category") == want), None)
                if j is not None:
                    start[k], cursor = allocs[j][0], j + 1
            continue
        if s.op != "call_function" or s.target in STRUCTURAL:
            continue
        kernels += 1
        if not s.allocated:
            continue
        for j in range(cursor, len(allocs)):
            i, e = allocs[j]
            shift = int(_get(e, "step")) - kernels
            if shift < offset or (not free_offset and shift > offset):
                if shift > offset:
                    break            # past the kernel call this node must be
                continue
            if _get(e, "category") in ("recomputed", "reloaded") and \
                    getattr(s, "recipe", None) is None:
                continue     # (a checkpoint's recomputation: not this node's kernel)
            if _prim(_get(e, "name")) == s.target and int(_get(e, "bytes")) == s.allocated:
                start[k], cursor, offset, free_offset = i, j + 1, shift, False
                break
    return start


def _interpolate(start, n_events):
    """Unmatched steps evenly between their matched neighbours."""
    out = [None] * len(start)
    known = [(-1, 0.0)] + [(k, float(x)) for k, x in enumerate(start) if x is not None] \
        + [(len(start), float(max(n_events - 1, 0)))]
    for (k0, x0), (k1, x1) in zip(known, known[1:]):
        for k in range(max(k0, 0), min(k1, len(start))):
            out[k] = x0 if k == k0 else x0 + (x1 - x0) * (k - k0) / (k1 - k0)
    return out


# ---------------------------------------------------------------- what made an event


def without_marks(events, alignment=None):
    """The events without marks (what the report draws), and ``alignment`` with its
    indices moved to that list (marks only time the graph nodes)."""
    events = list(events)
    keep = [i for i, e in enumerate(events) if _get(e, "action") != "mark"]
    if alignment is None:
        return [events[i] for i in keep], None
    last = max(len(keep) - 1, 0)
    moved = Alignment([min(float(bisect_left(keep, x)), last) for x in alignment.x],
                      alignment.matched, [alignment.node_of_event[i] for i in keep],
                      alignment.method)
    return [events[i] for i in keep], moved


def made_by(event, steps=None, step_index=None):
    """(graph node, autograd node, op) of an event: the graph node from the
    alignment, the autograd node from the event's name ("MulBackward:mul") or the
    graph node's source."""
    name = str(_get(event, "name"))
    autograd_node, _, op = name.rpartition(":")
    node = None
    if steps is not None and step_index is not None:
        s = steps[step_index]
        node = s.node
        autograd_node = autograd_node or (s.source or "")
    return node, autograd_node or None, op


def live_at(events, index, steps=None, alignment=None, k=10):
    """The ``k`` largest storages live after event ``index`` (largest first), each
    ``{bytes, category, graph_node, autograd_node, op}`` as of its allocation."""
    live = {}
    for i, e in enumerate(events[:index + 1]):
        action = _get(e, "action")
        storage = _get(e, "storage")
        if action == "alloc":
            live[storage] = (i, _get(e, "category"))
        elif action == "free":
            live.pop(storage, None)
        elif action == "retag" and storage in live:
            live[storage] = (live[storage][0], _get(e, "category"))
    rows = []
    for i, cat in live.values():
        owner = alignment.node_of_event[i] if alignment is not None else None
        node, autograd_node, op = made_by(events[i], steps, owner)
        rows.append({"bytes": int(_get(events[i], "bytes")), "category": str(cat),
                     "graph_node": node, "autograd_node": autograd_node, "op": op})
    rows.sort(key=lambda r: -r["bytes"])
    return rows[:k]
