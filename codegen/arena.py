"""The static memory plan of a compiled C backward: arena blocks, offsets per buffer.

Every intermediate buffer has a live range ``[first, last]`` (the step that writes
it, the last step that reads it -- from the liveness analysis). Two buffers whose
ranges do not overlap may share bytes. ``plan`` places the buffers greedily, largest
first, each in the smallest gap left by the placed buffers that are live at the same
time (best fit; "greedy by size" as in TFLite's planner), else above them.

A backward that calls back into Python (unpack hooks: a checkpointed segment
recomputed, an activation reloaded) passes the steps of its callbacks as ``cuts``.
Only at a callback can Python allocate or free, so a buffer needs memory from the
callback before its first write to the callback after its last read: its *window*.
Buffers with the same window share one block, planned as above; a block is
allocated at the callback that opens its window and freed at the one that closes
it. So while Python recomputes a segment, the C side holds only the buffers live
across that callback, not a whole-backward arena sized by its widest step. Without
callbacks there is one block, the arena, for the whole call.

``lower_bound`` is the most bytes live at any one step: no plan can use less.
``size`` is the most block bytes held at once.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class ArenaPlan:
    offsets: list          # one byte offset per buffer (in its block), in the order given
    size: int              # the most block bytes held at once
    lower_bound: int       # max over steps of live (aligned) bytes
    total: int             # sum of all buffers (what no reuse would need)
    block_of: list         # per buffer: the index of its block
    windows: list          # per block: (open, close), see ``window``
    block_sizes: list      # per block: bytes

    def summary(self) -> str:
        ratio = self.size / self.lower_bound if self.lower_bound else 1.0
        blocks = f" in {len(self.block_sizes)} blocks" if len(self.block_sizes) > 1 else ""
        return (f"arena {self.size:,} B{blocks} for {self.total:,} B of buffers "
                f"(lower bound {self.lower_bound:,} B, {ratio:.2f}x)")


def window(first, last, cuts) -> tuple:
    """(open, close) of a buffer live over steps ``[first, last]``, for sorted
    callback steps ``cuts``: its block is allocated at the end of callback
    ``open - 1`` (at the call's start if ``open`` is 0) and freed at the start of
    callback ``close`` (at the call's end if ``close`` is ``len(cuts)``). A callback
    at a step inside ``[first, last]`` runs while the buffer is live."""
    return bisect.bisect_left(cuts, first), bisect.bisect_right(cuts, last)


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


def plan(buffers, cuts=(), fill=True) -> ArenaPlan:
    """Blocks and offsets for ``buffers`` (a list of (nbytes, first, last)), with
    callbacks at the sorted steps ``cuts``.

    A buffer that lives across a callback goes to the block of its window. One that
    lives between two callbacks, with ``fill``, first looks for a gap in a block
    that is held there anyway (one whose window contains its own), and only then
    gets a block of its own: so buffers between two callbacks share bytes with the
    blocks around them, as they would in one arena. Which block a buffer lands in
    then depends on the sizes: a graph with symbolic sizes is planned without
    ``fill``, so that its blocks, which the C is compiled for, are the same for
    every size."""
    cuts = list(cuts)
    wins = [window(f, l, cuts) for _, f, l in buffers]
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i][0], buffers[i][1]))
    placed: dict = {}                 # window -> [(offset, end, first, last)]
    where = [None] * len(buffers)     # (window, offset)

    def put(i, w, offset):
        need = _align(buffers[i][0])
        placed.setdefault(w, []).append((offset, offset + need, buffers[i][1], buffers[i][2]))
        where[i] = (w, offset)

    for i in order:                   # buffers live across a callback
        if wins[i][0] < wins[i][1]:
            put(i, wins[i], _fit(placed.get(wins[i], []), buffers[i])[1])
    for i in order:                   # buffers between two callbacks
        if wins[i][0] == wins[i][1]:
            k = wins[i][0]
            around = [w for w in placed if w[0] <= k <= w[1] and w[0] < w[1]] if fill else []
            fits = [(_fit(placed[w], buffers[i], grow=False), w) for w in around]
            fits = [(gap, offset, w) for (gap, offset), w in fits if offset is not None]
            if fits:
                _, offset, w = min(fits)       # the smallest gap
                put(i, w, offset)
            else:
                put(i, wins[i], _fit(placed.get(wins[i], []), buffers[i])[1])
    windows = sorted(placed) or [(0, len(cuts))]
    index = {w: k for k, w in enumerate(windows)}
    block_sizes = [max((e for _, e, _, _ in placed.get(w, ())), default=0) for w in windows]
    held = [sum(n for (o, c), n in zip(windows, block_sizes) if o <= i <= c)
            for i in range(len(cuts) + 1)]
    return ArenaPlan([o for _, o in where], max(held), lower_bound(buffers),
                     sum(_align(b[0]) for b in buffers), [index[w] for w, _ in where],
                     windows, block_sizes)


def _fit(placed, buffer, grow=True):
    """Best fit in one block: (gap, offset) of the smallest gap between the buffers
    in ``placed`` live at the same time as ``buffer`` that holds it, else the end of
    the highest of them (gap: what is left above the block's size, or 0 if it
    grows; offset None if it would grow and ``grow`` is false)."""
    nbytes, first, last = buffer
    need = _align(nbytes)
    busy = sorted((o, e) for o, e, f, l in placed if f <= last and first <= l)
    gaps, cursor = [], 0
    for o, e in busy:
        if o - cursor >= need:
            gaps.append((o - cursor, cursor))
        cursor = max(cursor, e)
    if gaps:
        return min(gaps)
    size = max((e for _, e, _, _ in placed), default=0)
    if cursor + need <= size:
        return size - cursor, cursor
    return (0, cursor) if grow else (0, None)
