"""Which elementwise nodes the C backend fuses into other nodes' loops
(``fusable``): an elementwise node never touches memory when its expression is
inlined into its users' loops, as the prims' lowering records allow. Planned on
the graph before any C is emitted (codegen/c.py's Emitter)."""
from __future__ import annotations

import bisect

from compiled_autograd.codegen import c_threads
from compiled_autograd.codegen.c_layout import dim
from compiled_autograd.ir.graph import Node, is_store
from compiled_autograd.runtime.lowering import SAME_LOOP
from compiled_autograd.runtime.prims import PRIMS

# The deepest expression fused into one loop
MAX_FUSED_DEPTH = 32
# The most loops a cheap elementwise node is recomputed in rather than stored
MAX_RECOMPUTE = 4


def lowering(node):
    """The C lowering record of a call_function node's prim, or None (``getitem``
    and other IR-level targets are not prims)."""
    p = PRIMS.get(node.target) if node.op == "call_function" else None
    return p.c if p is not None else None


def barriers(graph) -> list:
    """The steps (sorted) of the nodes no read may be moved across: a store, and
    a call into Python that may write an input array in place (a hook updating a
    parameter, a custom backward); not an unpack hook's or an accumulation's,
    which make or write arrays of their own."""
    return [i for i, n in enumerate(graph.nodes) if is_store(n) or (
        n.op == "call_hook" and n.target not in ("unpack_hook", "accumulate_grad"))]


def fusable(graph):
    """The elementwise nodes inlined into their users' loops, as the lowering
    records allow: the producer's is ``fusable``, each user's ``inlines`` the
    operand it is. A node with several users (at most MAX_RECOMPUTE) is
    recomputed in each of their loops, instead of written once and read back,
    where that is cheap: plain arithmetic (no transcendental call), every user
    a loop of its own shape, its operands not themselves recomputed so (a
    layer norm's backward: x - mean read by the variance and by x-hat)."""
    fused, shared = set(), set()
    step = {n: i for i, n in enumerate(graph.nodes)}
    stores = barriers(graph)

    def inlined_into(n, u, alone, cheap):
        # A fused node is evaluated in its user's loop: never past a barrier,
        # which may overwrite an input it reads.
        if stores and bisect.bisect_left(stores, step[n]) != \
                bisect.bisect_left(stores, step[u]):
            return False
        if is_store(u):
            return alone and u.args[1] is n and u.args[0] is not n and \
                tuple(map(dim, n.meta["shape"])) == tuple(map(dim, u.args[0].meta["shape"]))
        user = lowering(u)
        uses = [i for i, a in enumerate(u.args) if a is n]
        if user is None or not uses or (len(uses) > 1 and not cheap) or \
                any(v is n for v in u.kwargs.values()):
            return False
        if user.inlines == SAME_LOOP:
            return tuple(map(dim, n.meta["shape"])) == tuple(map(dim, u.meta["shape"]))
        return all(i in user.inlines for i in uses)     # (a reduction's loop: n's)

    for n in graph.nodes:
        low = lowering(n)
        if low is None or not low.fusable or not n.users:
            continue
        alone = len(n.users) == 1
        cheap = c_threads.cost(low.options.get("expr", "")) == 1
        if not alone and (len(n.users) > MAX_RECOMPUTE or not cheap
                          or any(a in shared for a in n.args)):
            continue
        if all(inlined_into(n, u, alone, cheap) for u in n.users):
            fused.add(n)
            if not alone:
                shared.add(n)
    # A chain of single-use elementwise ops (a simulation's steps) would fuse
    # into one expression as deep as the chain: past MAX_FUSED_DEPTH levels a
    # node is materialized instead, which bounds both the Python recursion
    # of ``expression``/``operand`` and the nesting of the C the compiler
    # parses, whatever the graph's length.
    depth = {}
    for n in graph.nodes:
        if n not in fused:
            continue
        d = 1 + max((depth[a] for a in n.args if isinstance(a, Node) and a in depth),
                    default=0)
        if d > MAX_FUSED_DEPTH:
            fused.discard(n)
        else:
            depth[n] = d
    return fused


def _is_reshape(node) -> bool:
    low = lowering(node)
    return low is not None and low.kind == "view" and low.options["layout"] == "reshaped"


def sums_in_producer_loops(graph, emitted_elsewhere) -> dict:
    """{elementwise node: the sum computed inside its loop}: a sum over every
    dim but the last (a bias's gradient, ``sum(g, dims=(0,))``, of g or of
    reshapes of it to rows) of a value an elementwise loop writes is added up in that
    loop, as each element is written, instead of in a pass of its own that
    reads the value back. The loop then takes the sum's form (threads share
    the last dim's columns, as the sum's own loop does), so the result is the
    same, bit for bit, and nothing is read twice. Only across no barrier (a
    hook may write the value in place before the sum reads it) and for a last
    dim of 32 or more (threads: a narrower one keeps its loop over rows).
    ``emitted_elsewhere``: the nodes not emitted as a loop of their own."""
    step = {n: i for i, n in enumerate(graph.nodes)}
    stores = barriers(graph)
    out = {}
    for r in graph.nodes:
        low = lowering(r)
        if low is None or low.kind != "reduction" or low.options["op"] != "sum":
            continue
        v = n = r.args[0]
        while isinstance(n, Node) and _is_reshape(n):
            n = n.args[0]       # (the rows of n: views, no copy, of its contiguous loop)
        nlow = lowering(n) if isinstance(n, Node) else None
        if nlow is None or nlow.kind != "elementwise" or n in emitted_elsewhere or n in out:
            continue
        seen, shape = tuple(map(dim, v.meta["shape"])), tuple(map(dim, n.meta["shape"]))
        if (len(seen) < 2 or len(shape) < 2 or seen[-1] != shape[-1]
                or tuple(r.kwargs["dims"]) != tuple(range(len(seen) - 1))
                or (isinstance(shape[-1], int) and shape[-1] < 32)
                or r.meta["dtype"] != n.meta["dtype"]):
            continue
        if stores and bisect.bisect_left(stores, step[n]) != bisect.bisect_left(stores, step[r]):
            continue
        out[n] = r
    return out
