"""The reference interpreter: backend "eager". Runs a graph node by node on numpy
arrays, taking boxed values as it reads them and dropping every value right after
its last use (``Graph.last_uses``), so its memory behaviour is the generated code's.
"""
from __future__ import annotations

from compiled_autograd.ir.graph import map_nodes
from compiled_autograd.compiled.hook_calls import CALL_HOOK
from compiled_autograd.ir.symbolic import contains_symbol, resolve
from compiled_autograd.runtime import memory
from compiled_autograd.runtime.prims import PRIMS, run_kernel


class Interpreter:
    """``Interpreter(graph)(inputs, sizes, scalars, hooks, packed_data)``."""

    def __init__(self, graph):
        self.graph = graph
        self.dies_after = graph.last_uses()
        # Nodes whose arguments hold symbolic sizes or scalars, resolved per call.
        self.symbolic = {n for n in graph.nodes if contains_symbol((n.args, n.kwargs))}

    def __call__(self, inputs, sizes, scalars, hooks, packed_data):
        boxed = dict(inputs=inputs, sizes=sizes, scalars=scalars, hooks=hooks,
                     packed_data=packed_data)
        env = {}
        accounting = memory.active()
        for node in self.graph.nodes:
            if node.op == "placeholder":
                env[node] = boxed.pop(node.target)
            elif node.op == "output":
                return map_nodes(node.args[0], env.__getitem__)
            else:
                args = map_nodes(node.args, env.__getitem__)
                kwargs = node.kwargs
                if node in self.symbolic:
                    args = resolve(args, sizes, scalars)
                    kwargs = resolve(kwargs, sizes, scalars)
                if node.op == "call_function" and node.target == "getitem":
                    container, i = args
                    value = container[i]
                    if isinstance(container, list):
                        container[i] = None  # take: the graph now owns the value
                elif node.op == "call_function":
                    if accounting:
                        with memory.source(node.meta.get("source") or node.name):
                            value = run_kernel(PRIMS[node.target], args, kwargs)
                    else:
                        value = run_kernel(PRIMS[node.target], args, kwargs)
                else:
                    if node.target == "unpack_hook":    # (the result must have its shape)
                        args = tuple(args) + (resolve(node.meta["shape"], sizes, scalars),)
                    value = CALL_HOOK[node.target](*args)
                env[node] = value
                del args, kwargs, value  # the env is the only owner (as generated code)
            for dead in self.dies_after.get(node, ()):
                env.pop(dead, None)
            if accounting:
                memory.mark(node.name)  # aligns the measured timeline with the graph
        raise RuntimeError("graph has no output node")
