"""Graph passes run after tracing (each one linear in the graph's size).

- ``eliminate_dead_code``: drop pure nodes nobody uses; hooks (side effects) stay.
- ``place_reads``: move each read of a boxed value (``getitem``) and each
  ``unpack_hook`` call to just before its first user -- progressive unpacking: a
  checkpointed segment is recomputed, an offloaded value reloaded, only when the
  backward reaches it. ``unpack="upfront"`` instead puts every unpack right after
  the placeholders, as compiled autograd did before PyTorch PR 147242.
"""
from __future__ import annotations


def eliminate_dead_code(graph) -> int:
    dead = set()
    for node in reversed(graph.nodes):
        if node.op == "call_function" and all(u in dead for u in node.users):
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
