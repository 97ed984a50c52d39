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
    blocks: list           # per buffer: the index of its block
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


def plan(buffers, cuts=()) -> ArenaPlan:
    """Blocks and offsets for ``buffers`` (a list of (nbytes, first, last)), with
    callbacks at the sorted steps ``cuts``."""
    cuts = list(cuts)
    windows = sorted({window(f, l, cuts) for _, f, l in buffers}) or [(0, len(cuts))]
    index = {w: k for k, w in enumerate(windows)}
    blocks = [index[window(f, l, cuts)] for _, f, l in buffers]
    offsets, block_sizes = [0] * len(buffers), []
    for k in range(len(windows)):
        members = [i for i, b in enumerate(blocks) if b == k]
        member_offsets, size = _best_fit([buffers[i] for i in members])
        for i, o in zip(members, member_offsets):
            offsets[i] = o
        block_sizes.append(size)
    held = [sum(n for (o, c), n in zip(windows, block_sizes) if o <= i <= c)
            for i in range(len(cuts) + 1)]
    return ArenaPlan(offsets, max(held), lower_bound(buffers),
                     sum(_align(b[0]) for b in buffers), blocks, windows, block_sizes)


def _best_fit(buffers):
    """(offsets, size) of ``buffers`` packed in one block."""
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
    return offsets, size
