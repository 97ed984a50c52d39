"""The static memory plan of a compiled C backward: one arena, offsets per buffer.

Every intermediate buffer has a live range ``[first, last]`` (the step that writes
it, the last step that reads it -- from the liveness analysis). Two buffers whose
ranges do not overlap may share bytes. ``plan`` places the buffers greedily, largest
first, each in the smallest gap left by the placed buffers that are live at the same
time (best fit; "greedy by size" as in TFLite's planner), else above them.

``lower_bound`` is the most bytes live at any one step: no plan can use less.
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class ArenaPlan:
    offsets: list          # one byte offset per buffer, in the order given
    size: int              # arena bytes
    lower_bound: int       # max over steps of live (aligned) bytes
    total: int             # sum of all buffers (what no reuse would need)

    def summary(self) -> str:
        ratio = self.size / self.lower_bound if self.lower_bound else 1.0
        return (f"arena {self.size:,} B for {self.total:,} B of buffers "
                f"(lower bound {self.lower_bound:,} B, {ratio:.2f}x)")


def lower_bound(buffers) -> int:
    """``buffers``: (nbytes, first, last). The maximum over steps of live bytes."""
    events = []
    for nbytes, first, last in buffers:
        events.append((first, 0, _align(nbytes)))
        events.append((last, 1, -_align(nbytes)))
    live = best = 0
    for _, _, delta in sorted(events):  # allocations at a step before frees
        live += delta
        best = max(best, live)
    return best


def plan(buffers) -> ArenaPlan:
    """Offsets for ``buffers`` (a list of (nbytes, first, last))."""
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i][0], buffers[i][1]))
    placed: list[tuple[int, int, int, int]] = []   # (offset, end, first, last)
    offsets = [0] * len(buffers)
    size = 0
    for i in order:
        nbytes, first, last = buffers[i]
        need = _align(nbytes)
        busy = sorted((o, e) for o, e, f, l in placed if f <= last and first <= l)
        # best fit: the smallest gap between busy blocks that holds the buffer,
        # else the end of the highest busy block
        gaps, cursor = [], 0
        for o, e in busy:
            if o - cursor >= need:
                gaps.append((o - cursor, cursor))
            cursor = max(cursor, e)
        offset = min(gaps)[1] if gaps else cursor
        offsets[i] = offset
        placed.append((offset, offset + need, first, last))
        size = max(size, offset + need)
    return ArenaPlan(offsets, size, lower_bound(buffers),
                     sum(_align(b[0]) for b in buffers))
