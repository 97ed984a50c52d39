"""Backend "c": a graph becomes one C function with a static memory plan.

``generate(graph)`` walks the graph once, in order, and turns every node into C
through the templates under ``templates/c/``, by the lowering record in its prim's
table entry (``prim.c``: its kind picks the emitter in ``c_ops``; an elementwise
prim's record holds its C expression, the others name their template file):

- view prims make no code: they re-stride a value (``c_layout``), so a transpose
  folds into the BLAS call that reads it;
- a ``store`` writes its value into an input's array in one loop (an elementwise
  value stored and used nowhere else is that loop's expression); nothing is fused
  across a store or a hook that may write an input (a parameter updated in place),
  so every read of an input happens where the graph puts it;
- an elementwise node whose single user is an elementwise node of the same shape
  (or a sum/amax reading it) is *fused*: its expression is inlined into the user's
  loop, so it never touches memory; a cheap one (plain arithmetic) with up to
  MAX_RECOMPUTE such users is recomputed in each of their loops rather than
  stored and read back;
- every other value gets a buffer: in the arena (offsets from ``arena.plan`` over the
  buffers' live ranges; ``c_memory`` places them), or, for a gradient handed to
  ``.grad`` or a returned value, an array Python allocates;
- a ``call_hook`` node is a *callback site*: the C code calls back into Python
  (``runner``) at its place in the order, so an unpack hook recomputes or reloads
  exactly when the backward reaches it. The array it returns is used in place and
  released by Python at the next callback after its last use (nothing Python can
  see happens in between). Gradient accumulation is deferred the same way.
  (The runner, c_call.c, does that work in C; only the hook is Python.)

Every decision is taken on records before the C it affects is rendered, and no C
is rewritten afterwards: fusion from the lowering records before the walk; a
loop's writing over a dying input (``reuse_dying_input``) from its out and leaves,
with lifetimes known up front, before the loop's text exists; arena placement and
late allocation after the walk, as statements and declarations of their own. Each
statement (``c_text.Stmt``) records the storages it names and the pointers it sets
(``Emitter.ptr``), so the declarations a function or a part needs come from those
records.
"""
from __future__ import annotations

import jinja2
import numpy as np

from compiled_autograd.codegen import c_memory, c_ops, c_threads
from compiled_autograd.codegen.c_concat import tiled_sums
from compiled_autograd.codegen.c_fusion import fusable, lowering, sums_in_producer_loops
from compiled_autograd.codegen.c_layout import (Storage, Val, broadcast_strides, c_expr, ctype, dim,
                                                in_layout, mul)
from compiled_autograd.codegen.c_text import ENV as _ENV
from compiled_autograd.codegen.c_text import Stmt, literal, split_parts
from compiled_autograd.codegen.python import _comment
from compiled_autograd.ir.graph import Node
from compiled_autograd.ir.symbolic import SymFloat, SymInt
from compiled_autograd.runtime.cbuild import array_data_offset, blas
from compiled_autograd.runtime.prims import PRIMS

_EXPR_CACHE: dict[str, jinja2.Template] = {}


def _used_as_array(node) -> bool:
    """An input is a Python object (a leaf Tensor) where a hook takes the variable
    itself (accumulate_grad's first argument, post_acc_grad_hook's second); every
    other use reads its array."""
    for u in node.users:
        if u.op == "call_hook" and (u.target == "post_acc_grad_hook" or (
                u.target == "accumulate_grad" and u.args[1] is not node)):
            continue
        return True
    return False


# A C function of more lines than this is split into parts compiled in parallel:
# gcc's time grows a little faster than the function's length, and a machine's
# cores can compile the parts at once.
PART_LINES = 800


class Site:
    """A callback into Python: a hook node, with how to find its arguments."""

    def __init__(self, index, node, args, step, release=()):
        self.index, self.node, self.args, self.step = index, node, args, step
        self.kind = node.target if node is not None else "release"
        self.results: list = []       # (item index or None, Val) of what the hook returns
        self.item_vals: dict = {}     # item index -> Val, for a hook returning a tuple
        self.release = list(release)  # storages Python drops before running it
        self.alloc: list = []         # "out" storages Python allocates at this callback
        self.open_blocks: list = []   # arena blocks Python allocates at its end
        self.close_blocks: list = []  # arena blocks Python drops at its start
        self.early: list = []         # release sites left out, run first (fold_releases)


class CProgram:
    """What ``generate`` returns: the source and everything the runner needs."""

    def __init__(self):
        self.source = ""              # all of the C (its translation units, joined)
        self.sources: list = []       # the translation units: one, or a main and parts
        self.inputs: list = []        # (box index, Storage) arrays read from `inputs`
        self.pyrefs: dict = {}        # graph node -> (box name, index): Python objects
        self.sites: list[Site] = []
        self.accumulations: list = []  # (step, variable node, grad Val)
        self.outputs: list = []       # returned values: Val, None, or a pyref node
        self.out_storages: list = []
        self.arena_storages: list = []
        self.ext_storages: list = []
        self.plan = None              # the arena plan (None if it depends on sizes)
        self.cuts: list = []          # the callbacks' steps, sorted
        self.block_of: list = []      # per arena storage: its block (see compiled_autograd.codegen.arena)
        self.windows: list = []       # per block: (open, close) callback ordinals
        self.call_block = None        # the block held for the whole call (`arena`), if any
        self.dynamic = False
        # Whether the C reads the boxed sizes and scalars at all: a graph
        # without size (scalar) symbols gives the C no way to (``symbol_kinds``).
        self.reads_sizes = self.reads_scalars = True
        self.errors: list[str] = []   # messages of C-detected errors (code = -(i+1))
        self.gemms: list = []         # each BLAS call site: a Gemm (its floor: benchmarks)




class Emitter:
    def __init__(self, graph, part_lines=PART_LINES):
        self.graph = graph
        self.part_lines = part_lines
        self.prog = CProgram()
        self.vals: dict = {}
        self.stmts: list[Stmt] = []
        self.named: set = set()       # storages the statement being built names
        self.step = 0
        self.counts = {"arena": 0, "out": 0, "in": 0, "ext": 0}
        self.fused = fusable(graph)
        # Sums of slice gradients written as one concatenation (c_concat): the
        # sum's node gets a buffer (it is never fused), its slice_backward and
        # inner add nodes emit nothing and read at the sum's step.
        self.tiled = tiled_sums(graph)
        self.absorbed = set().union(*(t.members for t in self.tiled.values()))
        self.fused -= self.absorbed | set(self.tiled)
        # Sums computed in the loop of the elementwise node they read: the
        # sum's node emits nothing at its own step.
        self.sums_in_loop = sums_in_producer_loops(graph, self.fused | self.absorbed
                                                   | set(self.tiled))
        self.summed_early = set(self.sums_in_loop.values())
        self.read_until = self._last_reads()
        self.site_of: dict = {}     # hook node -> its callback Site
        self.wants_out = self._wanted_outputs()

    # ------------------------------------------------------------ planning passes

    def _last_reads(self):
        """Each value's last read step, from the graph's one liveness analysis
        (``Graph.last_uses``), where a node fused into a loop reads at that
        loop's step, and a node absorbed into a tiled sum (c_concat) at the
        sum's. Known before the walk, so that a buffer's ``last`` is final
        for the values on it so far (see ``run``) when a loop asks whether an
        input dies in it."""
        step = {n: i for i, n in enumerate(self.graph.nodes)}

        def read_step(n):      # (a recomputed node: at its last user's loop)
            if n in self.fused or n in self.absorbed:
                return max(map(read_step, n.users))
            return step[n]
        position = {n: read_step(n) for n in self.graph.nodes}
        return {value: position[reader]
                for reader, values in self.graph.last_uses(position).items()
                for value in values}

    def _wanted_outputs(self):
        want = set()
        for n in self.graph.nodes:
            if n.op == "call_hook" and n.target == "accumulate_grad":
                want.add(n.args[1])
            elif n.op == "output":
                want.update(a for a in n.args[0] if isinstance(a, Node))
        return want

    # ------------------------------------------------------------ storage

    def new_storage(self, kind, dtype, shape):
        s = Storage(kind, self.counts[kind], dtype, tuple(shape), self.step)
        self.counts[kind] += 1
        {"arena": self.prog.arena_storages, "out": self.prog.out_storages,
         "ext": self.prog.ext_storages}.get(kind, []).append(s)
        return s

    def fresh(self, node_or_meta, kind=None):
        shape = tuple(map(dim, node_or_meta.meta["shape"]))
        dtype = node_or_meta.meta["dtype"]
        if kind is None:
            kind = "out" if node_or_meta in self.wants_out else "arena"
        return Val(self.new_storage(kind, dtype, shape), dtype, shape)

    def ptr(self, v) -> str:
        """The C name of ``v``'s storage (``v`` a Val or a Storage), noted as
        named by the statement being built: its declarations follow from these
        notes. Every pointer the emitters write goes through here."""
        s = v if isinstance(v, Storage) else v.storage
        self.named.add(s)
        return s.name

    def emit(self, text, source="", sets=()):
        """Append a statement: ``text``, naming the storages noted since the last
        one, and setting the pointers of ``sets``."""
        self.stmts.append(Stmt(self.step, source, text, frozenset(self.named),
                               frozenset(sets)))
        self.named = set()

    # ------------------------------------------------------------ expressions

    def operand(self, a, loop, leaves, ct):
        """C text of ``a`` inside a loop over ``loop``, converted to ``ct``."""
        if isinstance(a, Node):
            if a in self.fused:
                text, dt = self.expression(a, loop, leaves)
            else:
                return self.operand_val(self.vals[a], loop, leaves, ct)
            return text if ct is None or ctype(dt) == ct else f"(({ct}){text})"
        return literal(a, ct or "double")

    def expression(self, node, loop, leaves):
        """(C expression, dtype) of an elementwise node over ``loop``."""
        low = PRIMS[node.target].c.options
        out_ct = ctype(node.meta["dtype"])
        if low["compute"] == "inputs":
            arrays = [a.meta["dtype"] for a in node.args if isinstance(a, Node)]
            compute = ctype(np.result_type(*arrays)) if arrays else "double"
        else:
            compute = out_ct
        keep = low["uncast"]
        names = {}
        if low["reads_inputs"]:
            for i, a in enumerate(node.args):
                names["abc"[i]] = self.operand(a, loop, leaves, None if i in keep else compute)
        for k, v in node.kwargs.items():
            scalar = isinstance(v, (int, float)) and not isinstance(v, bool)
            names[k] = literal(v, compute) if scalar else v
        template = _EXPR_CACHE.get(low["expr"])
        if template is None:
            template = _EXPR_CACHE[low["expr"]] = jinja2.Template(
                low["expr"], undefined=jinja2.StrictUndefined)
        # sfx: which typed version of a runtime/ca_math.h helper (_f, _d, _i) the template calls
        sfx = {"float": "f", "double": "d"}.get(compute, "i")
        text = template.render(T=out_ct, sfx=sfx, **names)
        return f"(({out_ct})({text}))", node.meta["dtype"]

    # ------------------------------------------------------------ loops

    def loop_nest(self, loop, vectors):
        """Coalesce a loop over ``loop`` (dims) for the given stride vectors.
        Returns (dims, vectors) with size-1 dims dropped and mergeable dims merged."""
        keep = [d for d, n in enumerate(loop) if n != 1]
        dims = [loop[d] for d in keep]
        vecs = [[v[d] for d in keep] for v in vectors]
        d = len(dims) - 2
        while d >= 0:
            if all(v[d] == mul(v[d + 1], dims[d + 1]) for v in vecs):
                dims[d:d + 2] = [mul(dims[d], dims[d + 1])]
                for v in vecs:
                    v[d:d + 2] = [v[d + 1]]
            d -= 1
        return dims, vecs

    @staticmethod
    def index(offset, strides, names):
        terms = [] if offset == 0 else [c_expr(offset)]
        for s, name in zip(strides, names):
            if s == 0:
                continue
            terms.append(name if s == 1 else f"{name} * {c_expr(s)}")
        return " + ".join(terms) or "0"

    def store_loop(self, out: Val, text, leaves, accumulate=False):
        """The elementwise statement ``out[...] = text`` over out's shape."""
        loop = out.shape
        vectors = [list(out.strides)] + [s for _, s, _ in leaves]
        dims, vecs = self.loop_nest(loop, vectors)
        names = [f"i{k}" for k in range(len(dims))]
        body = text
        for j, (offset, _, _) in enumerate(leaves):
            body = body.replace(f"@{j}@", self.index(offset, vecs[j + 1], names))
        target = f"{self.ptr(out)}[{self.index(out.offset, vecs[0], names)}]"
        # Each element is written once (an overlapping window is not): the outer
        # loops may run on several threads.
        omp = (c_threads.pragma(c_threads.work(dims, c_threads.cost(body)),
                                collapse=max(1, len(dims) - 1))
               if dims and c_threads.no_overlap(dims, vecs[0]) else "")
        return _ENV.get_template("elementwise.c.j2").render(
            loops=list(zip(names, map(c_expr, dims))), target=target, body=body,
            op="+=" if accumulate else "=", omp=omp)

    def reuse_dying_input(self, out: Val, leaves) -> Val:
        """Where ``out`` may live, for a node whose whole C is one loop writing
        ``out`` from ``leaves``: over an arena input that dies in that loop and
        is read exactly where the same element of the result is written
        (out[i] = f(a[i], ...)), else where it is. The two buffers become one,
        which lowers the arena (the planner never has to hold both). Only for a
        node of one loop: one that first fills its result (slice_backward's
        zeros, as_strided_scatter's base copy) would overwrite the input before
        the loop reads it. Decided before the loop is rendered, so its C (and
        every later reader's) names the buffer it really uses."""
        b = out.storage
        if b.kind != "arena" or b.first != self.step:
            return out
        for offset, strides, a in leaves:
            if (a is b or a.kind != "arena" or a.last != self.step or a.dtype != b.dtype
                    or a.nbytes != b.nbytes or not isinstance(a.nbytes, int)):
                continue
            same = all(o == out.offset and list(st) == list(out.strides)
                       for o, st, s in leaves if s is a)
            if same and out.offset == 0 and out.is_contiguous():
                arena = self.prog.arena_storages   # (b is the newest, but for a copy)
                arena.pop() if arena[-1] is b else arena.remove(b)
                return Val(a, out.dtype, out.shape, out.strides, out.offset)
        return out

    def copy_into(self, dst: Val, src: Val, accumulate=False):
        leaves = []
        text = self.operand_val(src, dst.shape, leaves, dst.ctype)
        return self.store_loop(dst, text, leaves, accumulate)

    def operand_val(self, v: Val, loop, leaves, ct):
        """C text of array ``v`` read inside a loop over ``loop`` (broadcast),
        converted to ``ct`` (None: as it is)."""
        leaves.append((v.offset, broadcast_strides(v.shape, v.strides, len(loop)), v.storage))
        text = f"{self.ptr(v)}[@{len(leaves) - 1}@]"
        return text if ct is None or v.ctype == ct else f"(({ct}){text})"

    def materialize(self, v: Val, kind="arena") -> Val:
        """A contiguous copy of ``v`` in a new buffer."""
        out = Val(self.new_storage(kind, v.dtype, v.shape), v.dtype, v.shape)
        self.emit(self.copy_into(out, v))
        return out

    def contiguous(self, v: Val) -> Val:
        return v if v.is_contiguous() else self.materialize(v)

    # ------------------------------------------------------------ the walk

    def run(self):
        for step, node in enumerate(self.graph.nodes):
            self.step = step
            source = _comment(node.meta.get("source") or "")
            if node.op == "placeholder":
                continue
            if node.op == "output":
                self.output(node)
            elif node.op == "call_hook":
                self.hook(node)
            elif node.target == "getitem":
                self.getitem(node)
            elif node.target == "store":
                self.store(node, source)
            elif node in self.fused or node in self.absorbed:
                continue
            elif node in self.summed_early:
                pass     # (its value: at its operand's step, c_ops._elementwise)
            else:
                low = lowering(node)
                if low is None:
                    raise NotImplementedError(f"C backend: {node.target!r} is not a prim")
                before = len(self.stmts)
                if node in self.tiled:
                    c_ops.tiled_sum(self, node, self.tiled[node])
                else:
                    c_ops.emit(self, node, low)
                # A view's copy (a reshape of a strided value) is not labelled
                # with the node's source: it stays under the block before it.
                if low.kind != "view":
                    self.stmts[before:] = [st._replace(source=source)
                                           for st in self.stmts[before:]]
            # The buffer under the node's value lives to the value's last read
            # (a buffer no node owns, a scratch row or a copy, lives in its step).
            v = self.vals.get(node)
            if v is not None and node in self.read_until:
                v.storage.last = max(v.storage.last, self.read_until[node])
        return self.finish()

    def getitem(self, node):
        container, i = node.args
        if container.op == "placeholder":
            box = container.target
            self.prog.pyrefs[node] = (box, int(i))
            if box == "inputs" and _used_as_array(node):
                v = in_layout(self.fresh(node, kind="in"), node.meta.get("strides"))
                self.prog.inputs.append((int(i), v.storage))
                self.vals[node] = v
            return
        site = self.site_of[container]
        self.vals[node] = site.item_vals[int(i)]

    def store(self, node, source):
        """``dst[...] = src``: one loop writing the input array ``dst``."""
        dst, src = node.args
        out, leaves = self.vals[dst], []
        if src in self.fused:
            text, dt = self.expression(src, out.shape, leaves)
            if ctype(dt) != out.ctype:
                text = f"(({out.ctype}){text})"
        else:
            text = self.operand_val(self.vals[src], out.shape, leaves, out.ctype)
        self.emit(self.store_loop(out, text, leaves), source)

    # ------------------------------------------------------------ hooks and outputs

    def hook(self, node):
        if node.target == "accumulate_grad":
            variable, grad = node.args
            v = self.vals[grad]
            if v.storage.kind == "arena":   # a view of an arena buffer: copy it out
                v = self.materialize(v, kind="out")
            self.prog.accumulations.append((self.step, variable, v))
            return
        args = []
        for a in node.args:
            if isinstance(a, Node):
                if a in self.vals and not (node.target == "post_acc_grad_hook"):
                    args.append(("val", self.vals[a]))
                else:
                    args.append(("py", a))
            else:
                args.append(("lit", a))
        site = Site(len(self.prog.sites), node, args, self.step)
        if node.users:
            if node.meta.get("shape") is not None:       # one array
                # An unpacked value comes back in the layout it was saved in
                # (a recomputed transpose, a slice): read it there, no copy.
                v = in_layout(self.fresh(node, kind="ext"), node.meta.get("strides"))
                site.results.append((None, v))
                self.vals[node] = v
            else:                                         # a tuple: its items
                for u in node.users:
                    if u.op == "call_function" and u.target == "getitem":
                        i = int(u.args[1])
                        if i not in site.item_vals:
                            v = self.fresh(u, kind="ext")
                            site.results.append((i, v))
                            site.item_vals[i] = v
        self.site_of[node] = site
        self.prog.sites.append(site)
        lines = [f"if (ca_call_back(cb, {site.index}, {'r' if site.results else 'NULL'})) return 1;"]
        for j, (_, v) in enumerate(site.results):
            lines.append(f"{self.ptr(v)} = ({v.ctype} *)r[{j}];")
        self.emit(_ENV.get_template("callback.c.j2").render(
            n=len(site.results), lines=lines, kind=node.target),
            sets=[v.storage for _, v in site.results])

    def output(self, node):
        for a in node.args[0]:
            if a is None:
                self.prog.outputs.append(None)
            elif a not in self.vals:
                self.prog.outputs.append(("py", a))
            else:
                v = self.vals[a]
                if v.storage.kind == "arena":
                    v = self.materialize(v, kind="out")
                self.prog.outputs.append(("val", v))

    # ------------------------------------------------------------ the function

    def finish(self):
        prog = self.prog
        prog.dynamic = any(not isinstance(s.nbytes, int) for s in prog.arena_storages)
        n_steps = len(self.graph.nodes)
        # A graph that calls back into Python anyway (it has hooks) also calls back
        # to drop each Python-owned array right after its last use, as the Python
        # backend would; a graph without hooks keeps its inputs until it returns.
        if prog.sites:
            dying: dict = {}
            for s in prog.ext_storages + [st for _, st in prog.inputs]:
                if s.last < n_steps - 1:     # one the output returns stays to the end
                    dying.setdefault(s.last, []).append(s)
            for step in sorted(dying):
                site = Site(len(prog.sites), None, [], step + 0.5, dying[step])
                prog.sites.append(site)
                text = (f"if (ca_call_back(cb, {site.index}, NULL)) return 1;"
                        f"  /* release: {len(dying[step])} array(s) past last use */")
                self.stmts.append(Stmt(step + 0.5, "", text, frozenset(), frozenset()))
        prog.arena_index = {s: i for i, s in enumerate(prog.arena_storages)}
        lazy = c_memory.allocate_outputs_late(prog, self.stmts)
        late_arena = c_memory.plan_arena_blocks(prog, self.stmts)
        c_memory.fold_releases(prog, self.stmts)
        # Every pointer some statement names: its C type, name and initial value.
        # (An input only hooks or the output read is never named in C.)
        named = set().union(*(st.uses for st in self.stmts))
        decls = []

        def decl(storage, init, note=""):
            if storage in named:
                decls.append({"type": ctype(storage.dtype), "name": storage.name, "init": init,
                              "note": note, "storage": storage})
        for s in prog.arena_storages:
            decl(s, "NULL" if s in late_arena else c_memory.arena_pointer(prog, s))
        for s in prog.out_storages:
            decl(s, "NULL" if s in lazy else f"({ctype(s.dtype)} *)CA_DATA(out[{s.index}])")
        for j, (_, s) in enumerate(prog.inputs):
            decl(s, f"({ctype(s.dtype)} *)CA_DATA(in[{j}])")
        for s in prog.ext_storages:
            # (void): a result only Python reads (a gradient to accumulate, a hook's
            # argument) is set here but never read in C (-Wunused-but-set-variable)
            decl(s, "NULL", f" (void){s.name};")
        blocks, current = [], None
        current_source = ""
        for st in sorted(self.stmts, key=lambda t: t.step):
            source = st.source if st.step == int(st.step) else current_source
            current_source = source
            if current is None or current["source"] != source:
                current = {"source": source, "stmts": [], "uses": set(), "sets": set()}
                blocks.append(current)
            current["stmts"].append(st.text)
            current["uses"] |= st.uses
            current["sets"] |= st.sets
        parts = split_parts(blocks, self.part_lines)
        common = dict(decls=decls, n_nodes=n_steps, data_offset=array_data_offset(), blas=blas())
        prog.sources = [_ENV.get_template("backward.c.j2").render(
            blocks=blocks, parts=parts if len(parts) > 1 else [], **common)]
        if len(parts) > 1:
            for k, part in enumerate(parts):
                uses = set().union(*(b["uses"] for b in part))
                sets = set().union(*(b["sets"] for b in part))
                reads = [d for d in decls if d["storage"] in uses]
                writes = [d for d in reads if d["storage"] in sets]
                prog.sources.append(_ENV.get_template("part.c.j2").render(
                    index=k, blocks=part, reads=reads, writes=writes, **common))
        prog.source = "\n".join(prog.sources)
        prog.reads_sizes, prog.reads_scalars = symbol_kinds(self.graph)
        for box, reads in (("sizes", prog.reads_sizes), ("scalars", prog.reads_scalars)):
            if not reads and f"{box}[" in prog.source:      # (boxed_symbol's text)
                raise AssertionError(f"c codegen: the C reads {box} the graph has no symbol of")
        return prog


def symbol_kinds(graph) -> tuple[bool, bool]:
    """(whether the graph has size symbols, scalar symbols) in any node's args,
    kwargs or shape: the only ways the boxed sizes and scalars reach the code."""
    found = set()

    def visit(value):
        if isinstance(value, (SymInt, SymFloat)):
            found.add(type(value))
        elif isinstance(value, (tuple, list)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)
    for node in graph.nodes:
        visit((node.args, node.kwargs, node.meta.get("shape")))
    return SymInt in found, SymFloat in found


def generate(graph, part_lines=PART_LINES) -> CProgram:
    return Emitter(graph, part_lines).run()
