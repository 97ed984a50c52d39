"""The planned memory schedule of a compiled backward: live bytes after every graph
node, from the graph alone (``Graph.last_uses`` -- the liveness analysis every
backend uses -- and the nodes' ``meta``).

What allocates, in the plan:
- a prim's output, unless the prim is a view (its storage is its input's, which
  then lives as long as any of its views) -- category recomputed for the prims a
  memory plan put in to recompute a saved value (``autograd.recipe``), else
  gradient;
- an ``unpack_hook`` that reloads an offloaded value (category reloaded);
- the first ``unpack_hook`` of a checkpointed segment, whichever saved value it
  reads (also a leaf's or a kept input's, which recomputation does not allocate):
  recomputation produces every saved value of the segment at once; each is handed
  to its own unpack later and freed after that value's last use (category
  recomputed);
- ``accumulate_grad``: the leaf's new ``.grad`` (assuming it was None), unless
  the gradient is a fresh array nothing else uses: then that array becomes
  ``.grad`` (``fresh_and_only_here``), as the backends do, and lives on.
Saved values and leaves read from ``inputs`` existed before the backward and are
not counted, as ``ca.memory.profile()`` counts only what is allocated inside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from compiled_autograd.ir.graph import STRUCTURAL, fresh_and_only_here
from compiled_autograd.ir.passes import folded_last_uses, in_place_writes
from compiled_autograd.runtime.prims import PRIMS


@dataclass
class Step:
    index: int
    node: str
    op: str
    target: str
    source: str | None
    allocated: int
    live_bytes: int            # after the node, once its dead inputs are freed
    peak_bytes: int = 0        # while it runs: its inputs and its output together
    event: str | None = None   # "recompute", "reload", "unpack", "accumulate"
    recipe: int | None = None  # a memory plan's recomputation: the forward prim call


@dataclass
class LiveValue:
    name: str
    bytes: int
    category: str
    source: str | None


@dataclass
class MemorySchedule:
    steps: list
    peak_bytes: int
    peak_node: str | None
    live_at_peak: list
    unpacks: dict = field(default_factory=dict)  # value -> (unpack step, free step)
    arena: object = None   # backend "c": its static arena plan (size, lower bound, total)
    dies_after: dict = field(default_factory=dict, repr=False)  # Graph.last_uses() it used

    def __repr__(self):
        arena = f", arena={self.arena.size:,}" if self.arena is not None else ""
        return (f"MemorySchedule(peak_bytes={self.peak_bytes:,}, peak_node={self.peak_node!r}, "
                f"steps={len(self.steps)}, unpacks={len(self.unpacks)}{arena})")

    def table(self, limit=None) -> str:
        """Everything as text: the peak, one row per graph node (# | node | target |
        allocated | while running | live after | event), the values live at the
        peak, each unpacked value's unpack and free node, and the C arena if any.
        ``table(n)``: only the ``n`` rows with the most bytes live while their node
        runs (ties: the most allocated), in graph order; nodes that only take a
        value from the inputs (placeholders, getitems) are never among them."""
        steps = self.steps
        head = [f"planned peak {self.peak_bytes:,} bytes at graph node {self.peak_node}; "
                f"{len(steps)} graph nodes, {len(self.unpacks)} unpacked values"]
        if limit is not None:
            ranked = [s for s in steps if s.op not in ("placeholder", "output")
                      and s.target != "getitem"]
            ranked.sort(key=lambda s: (-s.peak_bytes, -s.allocated, s.index))
            steps = sorted(ranked[:max(0, limit)], key=lambda s: s.index)
            head.append(f"the {len(steps)} of {len(self.steps)} graph nodes with the most bytes "
                        f"live while they run (table() shows all)")
        rows = head + ["", f"{'#':>5}  {'node':<22} {'target':<18} {'allocated':>12} "
                           f"{'while running':>14} {'live after':>12}  event"]
        for s in steps:
            rows.append(f"{s.index:>5}  {s.node[:22]:<22} {str(s.target)[:18]:<18} "
                        f"{s.allocated:>12,} {s.peak_bytes:>14,} {s.live_bytes:>12,}  "
                        f"{s.event or ''}")
        if limit is not None:
            return "\n".join(rows)
        rows += ["", f"live at the peak ({len(self.live_at_peak)} values)",
                 f"{'bytes':>12}  {'category':<11} {'value':<22} source"]
        rows += [f"{v.bytes:>12,}  {v.category:<11} {v.name[:22]:<22} {v.source or ''}"
                 for v in self.live_at_peak]
        names = [s.node for s in self.steps]
        rows += ["", f"unpacked values ({len(self.unpacks)}): unpacked at # -> freed at #"]
        rows += [f"  {name:<22} {u:>5} -> {f:<5} ({names[f]})"
                 for name, (u, f) in self.unpacks.items()]
        if self.arena is not None:
            rows += ["", f"C arena: {self.arena.size:,} bytes"]
        return "\n".join(rows)


def _packed_index(node):
    packed = node.args[1]
    return packed.args[1] if packed.op == "call_function" and packed.target == "getitem" else None


def memory_schedule(graph, packed_kinds=()) -> MemorySchedule:
    """Plan the live bytes of ``graph``. ``packed_kinds[j]`` says what
    ``packed_data[j]`` is: ("checkpoint", segment, alias), ("offload", None) or
    ("hook", None)."""
    into = in_place_writes(graph)    # (values the Python backend computes into an input)
    dies_after = folded_last_uses(graph, into)
    storage_of, owners, size, category, source = {}, {}, {}, {}, {}
    group_members: dict = {}
    for node in graph.nodes:
        if node.op == "call_hook" and node.target == "unpack_hook":
            j = _packed_index(node)
            if j is not None and j < len(packed_kinds) and packed_kinds[j][0] == "checkpoint" \
                    and not packed_kinds[j][2]:  # aliases of kept tensors allocate nothing
                group_members.setdefault(packed_kinds[j][1], []).append(node)
    recomputed_groups = set()
    live, steps, peak, peak_index, peak_live = 0, [], 0, None, []
    unpack_step = {}

    def own(node, key, nbytes, cat):
        storage_of[node] = key
        owners[key] = owners.get(key, 0) + 1
        size.setdefault(key, nbytes)
        category.setdefault(key, cat)
        source.setdefault(key, node.meta.get("source"))

    for i, node in enumerate(graph.nodes):
        allocated, event, recipe = 0, None, None
        if node.op == "call_function" and node.target not in STRUCTURAL:
            recipe = node.meta.get("recipe")
            prim = PRIMS[node.target]
            base = next((a for a in node.args if hasattr(a, "op")), None)
            if node in into:
                base = into[node]       # (an input: made before the backward)
            if into.get(node) == "folded":   # (computed inside its add: no array)
                pass
            elif (prim.view or node in into) and base is not None:
                if base in storage_of:  # else a view of a value made before the backward
                    own(node, storage_of[base], 0, category.get(storage_of[base], "gradient"))
            else:
                allocated = node.meta.get("nbytes") or 0
                # (a memory plan's recomputation of a saved value: meta "recipe")
                own(node, node, allocated, "recomputed" if recipe is not None else "gradient")
        elif node.op == "call_hook" and node.target == "unpack_hook":
            j = _packed_index(node)
            kind, group, *alias = packed_kinds[j] if j is not None and j < len(packed_kinds) \
                else ("hook", None)
            nbytes = node.meta.get("nbytes") or 0
            unpack_step[node.name] = i
            if kind == "checkpoint":
                if group not in recomputed_groups:
                    # The segment's first unpack recomputes it, whichever holder
                    # it reads (also one of a leaf or kept input).
                    recomputed_groups.add(group)
                    burst = sum(m.meta.get("nbytes") or 0 for m in group_members.get(group, ()))
                    allocated, event = burst, "recompute"
                else:
                    event = "unpack"
                if not (alias and alias[0]):
                    # The value moves from the frame's cache to this node: live
                    # bytes are unchanged until its last use frees it. (A leaf or
                    # kept input was not recomputed: nothing to own.)
                    own(node, node, nbytes, "recomputed")
            elif kind == "offload":
                allocated, event = nbytes, "reload"
                own(node, node, nbytes, "reloaded")
            else:
                event = "unpack"
        elif node.op == "call_hook" and node.target == "accumulate_grad":
            leaf, grad = node.args[0], node.args[1]
            event = "accumulate"
            if fresh_and_only_here(grad) and grad in storage_of:
                # The gradient's own array becomes .grad (no copy): it outlives
                # the backward.
                owners[storage_of[grad]] += 1
            else:
                allocated = leaf.meta.get("nbytes") or 0
                own(node, ("grad", leaf.name), allocated, "gradient")
                owners[("grad", leaf.name)] += 1  # .grad outlives the backward
        live += allocated
        during = live
        for dead in dies_after.get(node, ()):
            key = storage_of.get(dead)
            if key is None:
                continue
            owners[key] -= 1
            if owners[key] == 0:
                live -= size[key]
        steps.append(Step(i, node.name, node.op, str(node.target), node.meta.get("source"),
                          allocated, live, during, event, recipe))
        if during > peak:
            peak, peak_index = during, i
            peak_live = [LiveValue(k.name if hasattr(k, "name") else f"{k[1]}.grad", size[k],
                                   category[k], source[k])
                         for k, n in owners.items() if (n > 0 or k is node) and size[k]]
    free_step = {}
    for node in graph.nodes:
        if node.name in unpack_step:
            users = [graph.nodes.index(u) for u in node.users]
            free_step[node.name] = max(users) if users else unpack_step[node.name]
    return MemorySchedule(steps, peak, graph.nodes[peak_index].name if peak_index is not None
                          else None, sorted(peak_live, key=lambda v: -v.bytes),
                          {k: (unpack_step[k], free_step[k]) for k in unpack_step},
                          dies_after=dies_after)
