"""Backend "python": a graph becomes one straight-line Python function.

The source comes from ``templates/python_backward.py.j2``; this module only turns
graph nodes into structured lines for it. Every value is dropped right after its
last use (``Graph.last_uses``, the liveness analysis the interpreter uses too).
Kernels, hook callers and constants are globals of the generated function, never
pasted as text; user-controlled strings (autograd node names of custom Functions)
only reach comments, sanitised. ``compiled_autograd.runtime.loader`` compiles it and registers it
with ``linecache``, so a traceback shows the generated line.

Two functions share one code object: one calling the kernels directly, one calling
them through ``run_kernel`` so that ``ca.memory.profile()`` sees every allocation.
A memory plan's recomputation (a prim node with meta ``recipe``) calls its kernel
as ``_r_<prim>``: the same kernel in the first, accounted as category
"recomputed" in the second (the compiled run accounts the rest as "gradient").

The value a ``store`` writes, and the chain of arithmetic right before it, is
computed straight into the stored array (``ir.passes.in_place_writes``; the prim's
numpy ufunc with ``out=``, as ``_u_<prim>``): an optimizer's update traced into the
backward allocates what its eager form does. A scaled add there, ``a + s * b``, is
one call (``_scaled_add``: one pass in C, numpy's roundings). Any other such prim
whose value has dimensions calls the ufunc itself, ``_n_<prim>`` (its kernel less
the wrapper that makes a 0-d result an array), accounted as its kernel.
"""
from __future__ import annotations

import math
import re
import struct
import types
from functools import partial

import jinja2
import numpy as np

from compiled_autograd.ir.graph import Node, fresh_and_only_here
from compiled_autograd.ir.passes import (folded_operands, folded_last_uses, in_place_writes,
                                         one_ufunc)
from compiled_autograd.compiled.hook_calls import CALL_HOOK, store
from compiled_autograd.ir.symbolic import SymFloat, SymInt, boxed_symbol, expr_text
from compiled_autograd.runtime import memory
from compiled_autograd.runtime.kernels import scaled_add
from compiled_autograd.runtime.loader import load_python
from compiled_autograd.runtime.prims import PRIMS, run_kernel

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("compiled_autograd.codegen", "templates"),
                          autoescape=False, keep_trailing_newline=True,
                          undefined=jinja2.StrictUndefined)


def render_expr(expr) -> str:
    """Python for a symbolic size or scalar: reads of ``sizes``/``scalars`` and
    arithmetic, nothing else."""
    return expr_text(expr, boxed_symbol, sep=" ")


def _comment(text) -> str:
    """A user-controlled name (a custom Function's) as a comment: identifier
    characters only, so it can neither end the comment line nor look like code."""
    return re.sub(r"[^A-Za-z0-9_]", "_", str(text))[:80]


class _Source:
    """Builds the template's data and the constants table."""

    def __init__(self, graph):
        self.graph = graph
        self.constants: dict[str, object] = {}
        self.typed: dict = {}       # (a number's text, dtype, bits) -> its 0-d array's name
        self.preamble: list = []    # the runtime scalars made 0-d arrays at the start

    def const(self, value):
        name = f"_c{len(self.constants)}"
        self.constants[name] = value
        return {"kind": "lit", "text": name}

    def value(self, v):
        if isinstance(v, Node):
            return {"kind": "name", "text": v.name}
        if isinstance(v, (SymInt, SymFloat)):
            return {"kind": "lit", "text": render_expr(v.expr)}
        if v is None or type(v) in (bool, int):
            return {"kind": "lit", "text": repr(v)}
        if type(v) is float and math.isfinite(v):
            return {"kind": "lit", "text": repr(v)}
        if isinstance(v, tuple):
            return {"kind": "tuple", "elements": [self.value(x) for x in v]}
        return self.const(v)  # dtypes, strings, non-finite floats, anything else

    def operand(self, node, v):
        """An argument of prim ``node``. A number operand of a ufunc computing in
        a float dtype, beside arrays of that dtype, becomes a 0-d array of it:
        numpy casts the number to that dtype anyway (NEP 50), and an array is its
        fast path (a Python float costs a conversion in every call). A literal is
        a constant; a runtime scalar (``scalars[i]`` and arithmetic on it) is made
        an array once, at the start (``preamble``)."""
        dtype = node.meta.get("dtype")
        if isinstance(v, Node) or type(v) not in (int, float, SymInt, SymFloat) or \
                not one_ufunc(node) or dtype is None or dtype.kind != "f" or \
                any(a.meta.get("dtype") != dtype for a in node.args if isinstance(a, Node)):
            return self.value(v)
        text = render_expr(v.expr) if isinstance(v, (SymInt, SymFloat)) else repr(v)
        # (a float by its bits too: -nan's repr is "nan", and its sign bit is kept)
        key = (text, dtype, struct.pack("<d", v) if type(v) is float else None)
        name = self.typed.get(key)
        if name is None:
            if isinstance(v, (SymInt, SymFloat)):
                name = f"_scalar{len(self.preamble)}"
                self.preamble.append({"name": name, "expr": text,
                                      "dtype": self.dtype_name(dtype)})
            else:
                name = "_" + re.sub(r"[^A-Za-z0-9]", "_", f"{dtype.name}_{text}")
                while name in self.constants:
                    name += "_"
                array = np.array(v, dtype)
                array.flags.writeable = False
                self.constants[name] = array
            self.typed[key] = name
        return {"kind": "name", "text": name}

    def dtype_name(self, dtype):
        name = f"_{dtype.name}"
        self.constants.setdefault(name, dtype)
        return name

    def lines(self):
        self.out = in_place_writes(self.graph)
        dies_after = folded_last_uses(self.graph, self.out)
        blocks, current = [], None
        for node in self.graph.nodes:
            if node.op == "placeholder" or self.out.get(node) in ("stored", "folded"):
                continue
            frees = [d.name for d in dies_after.get(node, ())
                     if not (d is node and not _has_value(node))]
            line = self.line(node, frees)
            source = _comment(node.meta.get("source") or "") if node.op != "output" else ""
            if current is None or current["source"] != source:
                current = {"source": source, "nodes": []}
                blocks.append(current)
            current["nodes"].append(line)
        return blocks

    def line(self, node, frees):
        base = {"name": node.name, "frees": frees}
        if node.op == "output":
            return dict(base, kind="output", result=self.value(node.args[0]))
        if node.op == "call_hook":
            args = [self.value(a) for a in node.args]
            if node.target == "accumulate_grad" and fresh_and_only_here(node.args[1]):
                args.append({"kind": "lit", "text": "True"})   # owned: becomes .grad as is
            if node.target == "unpack_hook":   # the shape the result must have
                args.append(self.value(tuple(node.meta["shape"])))
            return dict(base, kind="hook", target=node.target, has_value=_has_value(node),
                        args=args)
        if node.target == "store":
            return dict(base, kind="store", args=[self.value(a) for a in node.args])
        if node.target == "getitem":
            container, index = node.args
            if container.op == "placeholder":
                return dict(base, kind="take", box=container.name, index=int(index))
            return dict(base, kind="item", container=container.name, index=int(index))
        if node.target not in PRIMS:
            raise RuntimeError(f"python codegen: unknown target {node.target!r}")
        # A memory plan's recomputation of a saved value (meta "recipe") calls its
        # kernel as ``_r_<prim>``: the same kernel, accounted as "recomputed".
        kwargs = [(k, self.value(v)) for k, v in node.kwargs.items()]
        kernel = "_r_" if "recipe" in node.meta else "_k_"
        out = self.out.get(node)
        if out is not None:
            folded = folded_operands(node, self.out)
            if folded is not None:     # out = a + s * b in one pass
                a, scale, b, negate = folded
                scale = self.value(scale)
                if negate:
                    scale = {"kind": "lit", "text": f"-({scale['text']})"}
                return dict(base, kind="prim", target="scaled_add", kernel="_",
                            args=[self.value(out), self.value(a), scale, self.value(b)],
                            kwargs=[])
            kernel, kwargs = "_u_", [("out", self.value(out))]
        elif kernel == "_k_" and one_ufunc(node) and node.meta.get("shape"):
            kernel = "_n_"    # the ufunc itself (a value with dimensions: an array)
        return dict(base, kind="prim", target=node.target, kernel=kernel,
                    args=[self.operand(node, a) for a in node.args], kwargs=kwargs)


def _has_value(node):
    if node.op == "call_function":
        return node.target != "store"
    return node.target not in ("accumulate_grad", "post_acc_grad_hook") or bool(node.users)


def generate(graph):
    """(source, constants) of the graph's Python function."""
    src = _Source(graph)
    blocks = src.lines()
    text = _ENV.get_template("python_backward.py.j2").render(
        blocks=blocks, n_nodes=len(graph.nodes), preamble=src.preamble)
    return text.rstrip() + "\n", src.constants


def _accounted(prim, *args, **params):
    return run_kernel(prim, args, params)


def _accounted_recomputed(prim, *args, **params):
    with memory.category("recomputed"):
        return run_kernel(prim, args, params)


class PythonBackward:
    """The compiled function: ``(inputs, sizes, scalars, hooks, packed_data)``."""

    def __init__(self, graph):
        self.code, constants = generate(graph)
        fast = dict(constants)
        for name, prim in PRIMS.items():
            fast[f"_k_{name}"] = fast[f"_r_{name}"] = prim.kernel
            if prim.ufunc is not None:
                fast[f"_u_{name}"] = fast[f"_n_{name}"] = prim.ufunc
        for kind, fn in CALL_HOOK.items():
            fast[f"_h_{kind}"] = fn
        fast["_store"] = store
        fast["_scaled_add"] = scaled_add
        fast["_as"] = np.asarray
        self.filename, fast = load_python(self.code, fast)
        self.fast = fast["compiled_backward"]
        accounted = dict(fast)
        for name, prim in PRIMS.items():
            accounted[f"_k_{name}"] = accounted[f"_n_{name}"] = partial(_accounted, prim)
            accounted[f"_r_{name}"] = partial(_accounted_recomputed, prim)
        self.accounted = types.FunctionType(self.fast.__code__, accounted, "compiled_backward")

    def __call__(self, inputs, sizes, scalars, hooks, packed_data):
        fn = self.accounted if memory.active() else self.fast
        return fn(inputs, sizes, scalars, hooks, packed_data)


def compile_graph(graph):
    """The backend entry point registered as "python"."""
    return PythonBackward(graph)
