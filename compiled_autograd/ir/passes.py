"""Graph passes run after tracing (each one linear in the graph's size).

- ``eliminate_dead_code``: drop pure nodes nobody uses; hooks and stores (side
  effects) stay.
- ``in_place_writes``: which nodes a backend may compute straight into the array
  a ``store`` writes (no pass over the graph: a decision the Python backend and the
  memory schedule share).
- ``place_reads``: move each read of a boxed value (``getitem``) and each
  ``unpack_hook`` call to just before its first user -- progressive unpacking: a
  checkpointed segment is recomputed, an offloaded value reloaded, only when the
  backward reaches it. ``unpack="upfront"`` instead puts every unpack right after
  the placeholders, as compiled autograd did before PyTorch PR 147242.
"""
from __future__ import annotations

from compiled_autograd.runtime.prims import PRIMS


def eliminate_dead_code(graph) -> int:
    dead = set()
    for node in reversed(graph.nodes):
        if node.op == "call_function" and node.target != "store" and \
                all(u in dead for u in node.users):
            dead.add(node)
    for node in dead:
        for inp in node.all_input_nodes:
            inp.users.pop(node, None)
    graph.nodes = [n for n in graph.nodes if n not in dead]
    return len(dead)


def _is_read(node):
    return node.op == "call_function" and node.target == "getitem" and \
        node.args[0].op == "placeholder"


def _is_unpack(node):
    return node.op == "call_hook" and node.target == "unpack_hook"


def place_reads(graph, unpack="progressive") -> None:
    if unpack not in ("progressive", "upfront"):
        raise ValueError(f"unpack must be 'progressive' or 'upfront', got {unpack!r}")
    movable = {n for n in graph.nodes if _is_read(n) or _is_unpack(n)}
    order, placed = [], set()

    def place(node):
        # A deferred node goes right before its first user, after its own inputs.
        for inp in node.all_input_nodes:
            if inp in movable and inp not in placed:
                place(inp)
        placed.add(node)
        order.append(node)

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for n in placeholders:
        place(n)
    if unpack == "upfront":
        for n in graph.nodes:
            if _is_unpack(n):
                place(n)
    for n in graph.nodes:
        if n not in placed and (n not in movable or not n.users):
            place(n)
    graph.nodes = order


def _static_meta(node):
    shape = node.meta.get("shape")
    if shape is None or not all(type(d) is int for d in shape):
        return None
    return tuple(shape), node.meta["dtype"]


def _writes_in_place(node) -> bool:
    """A prim that is one numpy ufunc (``Prim.ufunc``), called without params."""
    if node.op != "call_function" or node.kwargs or "recipe" in node.meta:
        return False
    p = PRIMS.get(node.target)
    return p is not None and p.ufunc is not None


def in_place_writes(graph) -> dict:
    """Node -> the value it may be computed into (its ``out=``), for what a store
    writes (an optimizer's update traced into the backward; a graph without stores
    gets nothing here):

    - for each store ``store(dst, v)`` right after ``v`` (``v`` of dst's static
      shape and dtype, with no other user): ``v`` goes straight into ``dst``, and so
      does the chain of single-use operations right before it, from where none
      after reads ``dst`` itself (an elementwise operation may read what it
      overwrites, element by element); the store itself then has nothing to do: it
      maps to "stored";
    - another operation whose value only flows into stores writes over an operand
      of its own static shape and dtype that dies there: a fresh array that no view
      shares and nothing else holds (a gradient scaled by the learning rate)."""
    out = {}
    nodes = graph.nodes
    if not any(n.op == "call_function" and n.target == "store" for n in nodes):
        return out
    last_use = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last_use[a] = i
    feeds = set()      # nodes whose value flows only into stores
    for n in reversed(nodes):
        if n.users and all((u.op == "call_function" and u.target == "store") or u in feeds
                           for u in n.users):
            feeds.add(n)
    for i, node in enumerate(nodes):
        if node not in feeds or not _writes_in_place(node):
            continue
        meta = _static_meta(node)
        for a in node.args:
            if hasattr(a, "op") and last_use.get(a) == i and _owned(a) and \
                    _static_meta(a) == meta:
                out[node] = a
                break
    for i, node in enumerate(nodes):
        if node.op != "call_function" or node.target != "store" or i == 0:
            continue
        dst, value = node.args
        meta = _static_meta(dst)
        if nodes[i - 1] is not value or not _writes_in_place(value) or \
                list(value.users) != [node] or meta is None or _static_meta(value) != meta:
            continue
        out[value], out[node] = dst, "stored"
        j, later = i - 2, value
        while j >= 0 and dst not in later.args:
            prev = nodes[j]
            if not _writes_in_place(prev) or list(prev.users) != [later] or \
                    _static_meta(prev) != meta:
                break
            out[prev], j, later = dst, j - 1, prev
    return out


def _owned(value) -> bool:
    """A fresh array only the graph holds, which no view shares: a non-view prim's
    result whose users are all non-view prims (not a hook, a store or the output)."""
    def plain(n):
        return n.op == "call_function" and n.target in PRIMS and not PRIMS[n.target].view
    return plain(value) and "recipe" not in value.meta and all(plain(u) for u in value.users)
