"""The graph IR of a compiled backward: an FX-like, straight-line list of nodes.

A ``Node`` has a unique ``name`` (a Python identifier), an ``op`` --
``placeholder``, ``call_function`` (a prim, or ``getitem`` on a boxed list),
``call_hook`` (a user hook, an unpack hook, or gradient accumulation), ``output`` --
a ``target``, ``args``/``kwargs`` (which may hold other nodes), its ``users`` and a
``meta`` dict with ``shape``, ``dtype``, ``nbytes`` and ``source`` (the autograd Node
it came from). Placeholders come first, ``output`` last.

``getitem(boxed_list, i)`` *takes* element i: it reads it and clears the slot, so
the running graph is the only owner of what it read (the boxed calling convention).
``Graph.last_uses()`` is the one liveness analysis: the interpreter and the code
generators free each value after its last use with it, and the memory planner
counts live bytes with it.
"""
from __future__ import annotations

import json
import keyword
import re

import numpy as np

from compiled_autograd.runtime.prims import PRIMS

OPS = ("placeholder", "call_function", "call_hook", "output")
def fresh_and_only_here(value) -> bool:
    """A value that a non-view prim just made (a fresh array: only view prims
    may alias their inputs) and that one node alone uses: an accumulation into
    a ``.grad`` that is None may keep it as ``.grad`` instead of copying it (the
    backends do; the memory plan counts it so)."""
    return (isinstance(value, Node) and value.op == "call_function" and value.target in PRIMS
            and not PRIMS[value.target].view and len(value.users) == 1)


HOOK_KINDS = ("unpack_hook", "tensor_pre_hook", "pre_hook", "post_hook",
              "post_acc_grad_hook", "accumulate_grad", "call_backward")
BOXED = ("inputs", "sizes", "scalars", "hooks", "packed_data")
STRUCTURAL = ("getitem",)  # call_function targets that are not prims

_DTYPE_ABBR = {"float32": "f32", "float64": "f64", "int64": "i64", "bool": "b8",
               "int32": "i32", "float16": "f16"}


def _flatten(value):
    if isinstance(value, Node):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _flatten(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flatten(v)


def map_nodes(value, fn):
    """``value`` with every Node in it replaced by ``fn(node)``."""
    if isinstance(value, Node):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(map_nodes(v, fn) for v in value)
    if isinstance(value, list):
        return [map_nodes(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_nodes(v, fn) for k, v in value.items()}
    return value


class Node:
    """One instruction of the graph."""

    __slots__ = ("graph", "name", "op", "target", "args", "kwargs", "users", "meta")

    def __init__(self, graph, name, op, target, args, kwargs, meta):
        self.graph, self.name, self.op, self.target = graph, name, op, target
        self.args, self.kwargs = tuple(args), dict(kwargs)
        self.users: dict[Node, None] = {}
        self.meta = meta
        for inp in self.all_input_nodes:
            inp.users[self] = None

    @property
    def all_input_nodes(self):
        seen = {}
        for n in _flatten((self.args, self.kwargs)):
            seen[n] = None
        return list(seen)

    def replace_all_uses_with(self, other):
        for user in list(self.users):
            user.args = map_nodes(user.args, lambda n: other if n is self else n)
            user.kwargs = map_nodes(user.kwargs, lambda n: other if n is self else n)
            other.users[user] = None
        self.users.clear()

    def format_type(self) -> str:
        shape, dtype = self.meta.get("shape"), self.meta.get("dtype")
        if shape is None:
            return ""
        dt = _DTYPE_ABBR.get(np.dtype(dtype).name, np.dtype(dtype).name)
        return f"{dt}[{', '.join(str(d) for d in shape)}]"

    def format(self) -> str:
        """A typed one-line form: ``%mul_3 : f32[4, 8] = mul(%a, %b)  # MulBackward``."""
        def fmt(v):
            if isinstance(v, Node):
                return f"%{v.name}"
            if isinstance(v, tuple):
                return "(" + ", ".join(fmt(x) for x in v) + ("," if len(v) == 1 else "") + ")"
            if isinstance(v, list):
                return "[" + ", ".join(fmt(x) for x in v) + "]"
            if isinstance(v, np.dtype):
                return v.name
            return repr(v)
        parts = [fmt(a) for a in self.args] + [f"{k}={fmt(v)}" for k, v in self.kwargs.items()]
        typ = self.format_type()
        head = f"%{self.name}" + (f" : {typ}" if typ else "")
        if self.op == "placeholder":
            return f"{head} = placeholder[{self.target}]"
        if self.op == "output":
            return f"return {', '.join(parts)}"
        call = self.target if self.op == "call_function" else f"call_hook[{self.target}]"
        line = f"{head} = {call}({', '.join(parts)})"
        source = self.meta.get("source")
        return line + (f"  # {source}" if source else "")

    def __repr__(self):
        return self.name


class Graph:
    """An ordered list of Nodes (no control flow)."""

    def __init__(self):
        self.nodes: list[Node] = []
        self._names: dict[str, int] = {}

    def _unique(self, hint: str) -> str:
        base = re.sub(r"\W|^(?=\d)", "_", hint) or "v"
        if keyword.iskeyword(base) or base in BOXED and hint not in BOXED:
            base += "_"
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 and not base[-1].isdigit() else f"{base}_{n}"

    def create_node(self, op, target, args=(), kwargs=None, name=None, meta=None) -> Node:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}")
        node = Node(self, self._unique(name or str(target)), op, target, args, kwargs or {},
                    dict(meta or {}))
        self.nodes.append(node)
        return node

    @property
    def placeholders(self):
        return [n for n in self.nodes if n.op == "placeholder"]

    @property
    def output_node(self):
        return self.nodes[-1] if self.nodes and self.nodes[-1].op == "output" else None

    def erase_node(self, node):
        if node.users:
            raise RuntimeError(f"cannot erase {node.name}: it still has users "
                               f"{[u.name for u in node.users]}")
        for inp in node.all_input_nodes:
            inp.users.pop(node, None)
        self.nodes.remove(node)

    def move_before(self, node, anchor):
        """Move ``node`` to just before ``anchor``."""
        self.nodes.remove(node)
        self.nodes.insert(self.nodes.index(anchor), node)

    # ------------------------------------------------------------ analyses

    def last_uses(self, position=None) -> dict:
        """node -> the nodes whose value dies right after it runs (one reverse walk;
        the liveness analysis shared by every backend and the memory planner).
        ``position``: node -> the step at which it reads its inputs, for a code
        generator that moves reads (the C backend reads a node fused into a loop
        at that loop's step); by default, its place in the graph."""
        order = reversed(self.nodes)
        if position is not None:     # latest read first; ties in reverse graph order
            order = sorted(order, key=lambda n: -position[n])
        seen, dies_after = set(), {}
        for node in order:
            for inp in node.all_input_nodes:
                if inp not in seen:
                    seen.add(inp)
                    dies_after.setdefault(node, []).append(inp)
        for node in self.nodes:  # values nobody uses die where they are made
            if node not in seen and node.op != "output":
                dies_after.setdefault(node, []).append(node)
        return dies_after

    def lint(self) -> None:
        """Check well-formedness and re-run every prim's shape rule."""
        names, position = set(), {}
        seen_non_placeholder = False
        for i, node in enumerate(self.nodes):
            if node.name in names:
                raise RuntimeError(f"lint: duplicate node name {node.name}")
            if not node.name.isidentifier():
                raise RuntimeError(f"lint: {node.name!r} is not an identifier")
            names.add(node.name)
            position[node] = i
            if node.op == "placeholder":
                if seen_non_placeholder:
                    raise RuntimeError(f"lint: placeholder {node.name} after other nodes")
            else:
                seen_non_placeholder = True
            for inp in node.all_input_nodes:
                if inp not in position:
                    raise RuntimeError(f"lint: {node.name} uses {inp.name} before it is defined")
                if node not in inp.users:
                    raise RuntimeError(f"lint: {inp.name}.users lacks {node.name}")
            if node.op == "output" and i != len(self.nodes) - 1:
                raise RuntimeError("lint: output is not the last node")
            if node.op == "call_hook" and node.target not in HOOK_KINDS:
                raise RuntimeError(f"lint: unknown hook kind {node.target}")
            if node.op == "call_function":
                if node.target in STRUCTURAL:
                    continue
                prim = PRIMS.get(node.target)
                if prim is None:
                    raise RuntimeError(f"lint: unknown prim {node.target}")
                shape, dtype = prim.meta(*[Aval.of(a) for a in node.args], **node.kwargs)
                if tuple(shape) != tuple(node.meta["shape"]) or np.dtype(dtype) != node.meta["dtype"]:
                    raise RuntimeError(f"lint: {node.name}: meta says {node.meta['shape']} "
                                       f"{node.meta['dtype']}, shape rule says {shape} {dtype}")
        for node in self.nodes:
            for user in node.users:
                if user not in position:
                    raise RuntimeError(f"lint: {node.name} has a user not in the graph")
        if self.output_node is None:
            raise RuntimeError("lint: the graph has no output node")

    # ------------------------------------------------------------ printing

    def __str__(self):
        return "\n".join(n.format() for n in self.nodes)

    def tabular(self) -> str:
        rows = [("opcode", "name", "target", "args", "shape", "bytes")]
        for n in self.nodes:
            args = ", ".join(a.name if isinstance(a, Node) else repr(a) for a in n.args)
            shape = n.meta.get("shape")
            rows.append((n.op, n.name, str(n.target), args,
                         "" if shape is None else str(list(shape)),
                         "" if shape is None else f"{n.meta.get('nbytes', 0):,}"))
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        widths[3] = min(widths[3], 48)
        lines = []
        for j, r in enumerate(rows):
            cells = [c if len(c) <= widths[i] else c[:widths[i] - 3] + "..."
                     for i, c in enumerate(r)]
            lines.append("  ".join(c.ljust(widths[i]) if i < 5 else c.rjust(widths[i])
                                   for i, c in enumerate(cells)).rstrip())
            if j == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def to_dot(self) -> str:
        """Graphviz source: one box per node, edges for data flow."""
        def esc(s):
            return str(s).replace("\\", "\\\\").replace('"', '\\"')
        lines = ["digraph backward {", '  rankdir=TB; node [shape=box, fontname="monospace"];']
        for n in self.nodes:
            label = f"{n.name}\\n{esc(n.target)}"
            if n.format_type():
                label += f"\\n{esc(n.format_type())}"
            style = {"placeholder": ', style=filled, fillcolor="#e0e0e0"',
                     "call_hook": ', style=filled, fillcolor="#ffe9b0"',
                     "output": ', style=filled, fillcolor="#c8e6c9"'}.get(n.op, "")
            lines.append(f'  "{esc(n.name)}" [label="{label}"{style}];')
            for inp in n.all_input_nodes:
                lines.append(f'  "{esc(inp.name)}" -> "{esc(n.name)}";')
        lines.append("}")
        return "\n".join(lines)

    def to_json(self) -> str:
        """JSON: {"nodes": [{name, op, target, args, kwargs, shape, dtype, nbytes,
        source}]}; a node reference is {"node": name}."""
        def enc(v):
            if isinstance(v, Node):
                return {"node": v.name}
            if isinstance(v, (tuple, list)):
                return [enc(x) for x in v]
            if isinstance(v, dict):
                return {k: enc(x) for k, x in v.items()}
            if isinstance(v, np.dtype):
                return v.name
            if type(v) in (int, float, str, bool) or v is None:
                return v
            return repr(v)  # symbolic sizes and scalars print as s3, c0, (s3*64)
        out = []
        for n in self.nodes:
            shape = n.meta.get("shape")
            out.append({"name": n.name, "op": n.op, "target": str(n.target),
                        "args": enc(list(n.args)), "kwargs": enc(n.kwargs),
                        "shape": None if shape is None else [d if type(d) is int else str(d)
                                                             for d in shape],
                        "dtype": None if n.meta.get("dtype") is None else
                        np.dtype(n.meta["dtype"]).name,
                        "nbytes": n.meta.get("nbytes"), "source": n.meta.get("source")})
        return json.dumps({"version": 1, "nodes": out}, indent=1)


class Aval:
    """Shape and dtype of a node's value, for re-running shape rules in lint."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    @classmethod
    def of(cls, a):
        if isinstance(a, Node):
            return cls(a.meta["shape"], a.meta["dtype"])
        return a
