"""Graph passes run after tracing (each one linear in the graph's size).

- ``eliminate_dead_code``: drop pure nodes nobody uses; hooks and stores (side
  effects) stay.
- ``in_place_writes``: which nodes a backend may compute straight into the array
  a ``store`` writes, and which scaled adds it computes in one pass (no pass over
  the graph: a decision the Python backend and the memory schedule share, with
  ``folded_last_uses``).
- ``saved_reads_after_callbacks``: which saved values each call into Python comes
  before (their version is checked after it, as eager checks at unpack).
- ``place_reads``: move each read of a boxed value (``getitem``) and each
  ``unpack_hook`` call to just before its first user -- progressive unpacking: a
  checkpointed segment is recomputed, an offloaded value reloaded, only when the
  backward reaches it. ``unpack="upfront"`` instead puts every unpack right after
  the placeholders, as compiled autograd did before PyTorch PR 147242.
"""
from __future__ import annotations

import numpy as np

from compiled_autograd.ir.symbolic import SymFloat, SymInt
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


def saved_reads_after_callbacks(graph) -> tuple:
    """For each call into Python (a ``call_hook`` node other than an accumulation,
    in program order): the saved values read after it and before the next one, as
    ("saved", i, name, origin) -- ``plain[i]`` of the collected args (meta "saved"),
    the node whose backward needs it -- or ("kept", j, recipe, None): the j-th kept
    array of a memory plan (meta "kept_version" of its read), which the
    recomputation ``recipe`` (meta "recomputes") computes from. A hook or custom
    backward may modify a saved tensor in place; eager raises when the node that
    saved it unpacks it (or a recomputation reads it), so a compiled backward
    checks, after each such call, the versions of the values read before the next
    (``hook_calls.after_python``); with how eager's error names the value
    (``SavedVariable.origin``). () when no value is read after one. A kept array
    is read once, before the first recomputation from it: it is checked where
    each recomputation from it comes, not where it is read."""
    sites, current, kept = [], None, set()
    for node in graph.nodes:
        if node.op == "call_hook" and node.target != "accumulate_grad":
            current, kept = [], set()
            sites.append(current)
        elif current is not None and _is_read(node) and "saved" in node.meta:
            i, origin = node.meta["saved"]
            current.append(("saved", i, node.meta.get("source") or "backward", origin))
        elif current is not None and "recomputes" in node.meta:
            for a in node.all_input_nodes:
                j = a.meta.get("kept_version")
                if j is not None and j not in kept:
                    kept.add(j)
                    current.append(("kept", j, node.meta["recomputes"], None))
    if not any(sites):
        return ()
    return tuple(tuple(site) for site in sites)


def _static_meta(node):
    shape = node.meta.get("shape")
    if shape is None or not all(type(d) is int for d in shape):
        return None
    return tuple(shape), node.meta["dtype"]


def one_ufunc(node) -> bool:
    """A prim that is one numpy ufunc (``Prim.ufunc``), called without params: it
    may be computed into an array (``out=``), and where its value is not 0-d the
    ufunc's own result is the kernel's."""
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
      shares and nothing else holds (a gradient scaled by the learning rate);
    - a scaled add ``a + s * b`` or ``a - s * b`` computed into an array, ``s`` a
      scalar and ``a``, ``b`` float arrays of its shape and dtype, right after the
      multiplication (reads of boxed values aside), which nothing else uses: the
      multiplication maps to "folded", and the add is one pass (``kernels.c``'s
      ``axpy``: the same roundings as the two), reading ``b`` where it runs
      (``read_positions``)."""
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
        if node not in feeds or not one_ufunc(node):
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
        if nodes[i - 1] is not value or not one_ufunc(value) or \
                list(value.users) != [node] or meta is None or _static_meta(value) != meta:
            continue
        out[value], out[node] = dst, "stored"
        j, later = i - 2, value
        while j >= 0 and dst not in later.args:
            prev = nodes[j]
            if not one_ufunc(prev) or list(prev.users) != [later] or \
                    _static_meta(prev) != meta:
                break
            out[prev], j, later = dst, j - 1, prev
    for i, node in enumerate(nodes):
        dst = out.get(node)
        if dst is None or dst == "stored" or node.target not in ("add", "sub"):
            continue
        j = i - 1
        while j >= 0 and _is_read(nodes[j]):
            j -= 1
        scaling = nodes[j] if j >= 0 else None
        if scaling is None or scaling is dst or scaling.target != "mul" or \
                not one_ufunc(scaling) or list(scaling.users) != [node]:
            continue
        meta = _static_meta(node)
        if meta is None or meta[1] not in _FLOATS or _static_meta(scaling) != meta:
            continue
        # (sub: only a - s * b; the other operand an array of the same layout)
        first, second = node.args
        other = first if second is scaling else \
            second if first is scaling and node.target == "add" else None
        if other is None or _static_meta_of(other) != meta or \
                _scale_of(scaling, meta) is None:
            continue
        out[scaling] = "folded"
    return out


def _owned(value) -> bool:
    """A fresh array only the graph holds, which no view shares: a non-view prim's
    result whose users are all non-view prims (not a hook, a store or the output)."""
    def plain(n):
        return n.op == "call_function" and n.target in PRIMS and not PRIMS[n.target].view
    return plain(value) and "recipe" not in value.meta and all(plain(u) for u in value.users)


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _static_meta_of(value):
    return _static_meta(value) if hasattr(value, "op") else None


def _scale_of(mul, meta):
    """(array, scalar) of ``mul``: one operand a node of ``meta``, the other a
    number (not a node), or None."""
    x, y = mul.args
    if hasattr(y, "op"):
        x, y = y, x
    if hasattr(y, "op") or _static_meta_of(x) != meta or isinstance(y, bool) or \
            not isinstance(y, (int, float, SymFloat, SymInt)):
        return None
    return x, y


def folded_operands(node, out):
    """(a, scalar, b, negate) of a scaled add ``node`` whose multiplication is
    "folded" in ``out`` (``in_place_writes``), else None."""
    if node.target not in ("add", "sub"):
        return None
    for k, arg in enumerate(node.args):
        if hasattr(arg, "op") and out.get(arg) == "folded":
            b, s = _scale_of(arg, _static_meta(arg))
            return node.args[1 - k], s, b, node.target == "sub"
    return None


def folded_last_uses(graph, out) -> dict:
    """``graph.last_uses()``, where a folded multiplication's inputs die at its add
    (the one pass reads them there) and the folded value frees nothing."""
    dies_after = graph.last_uses()
    for n, d in out.items():
        if d == "folded":
            user = next(iter(n.users))
            moved = dies_after.pop(n, [])
            dies_after[user] = [v for v in dies_after.get(user, ()) if v is not n] + moved
    return dies_after
