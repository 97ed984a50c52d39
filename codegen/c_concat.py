"""Which sums of slice gradients the C backend writes as one concatenation
(``tiled_sums``). Planned on the graph before any C is emitted, like fusion
(``c_fusion``), and read by codegen/c.py's Emitter.

``q, k, v = qkv.chunk(3, -1)`` has three slice nodes; their backward is three
``slice_backward`` nodes (each a buffer of qkv's shape, zero-filled, with one
gradient copied into its window) summed by ``add`` nodes (the gradient
accumulation). Where the windows are disjoint along one dim, that sum is the
gradients side by side: one buffer into which each gradient is copied in its
window, as ``cat`` does (zeros written only where no window lies), with no
full zero fill and no add.

The result is the old one's exactly, but for the sign of a zero: the old sum
adds the other windows' +0.0 to each element (-0.0 + 0.0 = +0.0), the copy keeps
a gradient's -0.0. The C backend's contract is values within float tolerance of
eager, which both meet (and -0.0 == 0.0).

Everything else keeps the old code: windows that overlap, a step other than 1,
bounds or sizes that are symbolic (a dynamic graph: disjointness not proven),
mixed shapes or dtypes, a broadcasting add, a slice gradient or an inner add
with another user, a leaf of the sum that is not a slice gradient (the add
order is kept: nothing is reassociated), a barrier (a store, a hook that may
write an input) between a slice gradient and the sum.
"""
from __future__ import annotations

import bisect
from typing import NamedTuple

from compiled_autograd.codegen.c_fusion import barriers, lowering
from compiled_autograd.codegen.c_layout import dim
from compiled_autograd.ir.graph import Node

# The most slice gradients one sum is checked with: the walk of a sum is
# linear in its leaves, and a sum that does not tile is walked again from each
# of its inner adds (a long chain of them would make the planning quadratic).
MAX_PIECES = 64


class Tiling(NamedTuple):
    """How a sum of slice gradients is written: ``pieces`` (start, gradient
    node), each copied into the window of ``dim`` from its start; ``gaps``
    (start, stop), filled with zeros; ``members``: the slice_backward and inner
    add nodes of the sum, and ``reshapes``, which emit no code (their reads
    happen at the sum's step). ``reshapes``: the pieces that are reshapes read
    by nothing else, whose input is copied into their window seen in its shape
    where their own C would copy it first (heads merged back after a transpose:
    attention's q, k and v gradients), one copy instead of two."""
    dim: int
    pieces: tuple
    gaps: tuple
    members: frozenset
    reshapes: frozenset = frozenset()


def _is_add(n) -> bool:
    low = lowering(n)
    return low is not None and bool(low.options.get("adds"))


def _is_slice_grad(n) -> bool:
    low = lowering(n)
    return low is not None and low.kind == "slice_scatter"


def _meta(n):
    return tuple(map(dim, n.meta["shape"])), n.meta["dtype"]


def _sole_operand(a, n) -> bool:
    """``a`` is an operand of ``n`` read by nothing else, of ``n``'s shape and dtype."""
    return isinstance(a, Node) and len(a.users) == 1 and _meta(a) == _meta(n)


def tiled_sums(graph) -> dict:
    """{root add node: Tiling} for each sum of slice gradients whose windows are
    disjoint along one dim (see the module's docstring)."""
    # pieces[n]: how many slice gradients the sum at add node n has, where every
    # leaf of its tree of adds is one (each read only by its add), else absent.
    pieces: dict = {}
    for n in graph.nodes:
        if not _is_add(n) or n.kwargs or len(n.args) != 2 or \
                not all(_sole_operand(a, n) for a in n.args):
            continue
        count = 0
        for a in n.args:
            if _is_slice_grad(a):
                count += 1
            elif a in pieces:
                count += pieces[a]
            else:
                break
        else:
            pieces[n] = count
    step = {n: i for i, n in enumerate(graph.nodes)}
    stops = barriers(graph)
    plans, taken = {}, set()
    for root in reversed(graph.nodes):       # a whole sum before its inner adds
        if root not in pieces or root in taken or pieces[root] > MAX_PIECES:
            continue
        tiling = _tiling(root, step, stops)
        if tiling is not None:
            plans[root] = tiling
            taken |= tiling.members
    return plans


def _tiling(root, step, stops):
    """The Tiling of the sum at ``root``, or None where its windows are not
    provably disjoint along one dim."""
    members, leaves, stack = set(), [], list(root.args)
    while stack:
        n = stack.pop()
        members.add(n)
        if _is_slice_grad(n):
            leaves.append(n)
        else:
            stack.extend(n.args)
    # Each slice gradient's source is read at the sum's step instead of its own:
    # never across a barrier (as a fused node: c_fusion).
    first = min(step[n] for n in leaves)
    if stops and bisect.bisect_left(stops, first) != bisect.bisect_left(stops, step[root]):
        return None
    shape, _ = _meta(root)
    d = leaves[0].kwargs.get("dim")
    if not isinstance(d, int) or not 0 <= d < len(shape) or not isinstance(shape[d], int):
        return None
    windows = []
    for n in leaves:
        g, p = n.args[0], n.kwargs
        if not isinstance(g, Node) or _meta(n) != _meta(root) or p.get("dim") != d:
            return None
        g_shape, g_dtype = _meta(g)
        start, size, step_ = dim(p["start"]), g_shape[d], dim(p["step"])
        if step_ != 1 or g_dtype != root.meta["dtype"] or not isinstance(start, int) or \
                not isinstance(size, int) or len(g_shape) != len(shape) or \
                any(a != b for k, (a, b) in enumerate(zip(g_shape, shape)) if k != d):
            return None
        if size:                     # an empty window adds nothing
            windows.append((start, start + size, g))
    windows.sort(key=lambda w: w[0])
    gaps, end = [], 0
    for start, stop, _ in windows:
        if start < end:              # overlapping windows (or a negative start)
            return None
        if start > end:
            gaps.append((end, start))
        end = stop
    if end > shape[d]:
        return None
    if end < shape[d]:
        gaps.append((end, shape[d]))
    reshapes = frozenset(g for _, _, g in windows if _is_sole_reshape(g))
    if reshapes and stops and bisect.bisect_left(stops, min(step[g] for g in reshapes)) != \
            bisect.bisect_left(stops, step[root]):
        reshapes = frozenset()
    return Tiling(d, tuple((start, g) for start, _, g in windows), tuple(gaps),
                  frozenset(members) | reshapes, reshapes)


def _is_sole_reshape(n) -> bool:
    """A reshape (a view, which copies a strided input) read only by its slice
    gradient, of an array computed in the graph."""
    low = lowering(n)
    return (low is not None and low.kind == "view" and low.options.get("layout") == "reshaped"
            and len(n.users) == 1 and isinstance(n.args[0], Node))
