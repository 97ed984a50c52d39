"""The backend registry of compiled autograd: a name -> a compiler.

(A user callable passed as ``backend=`` is not registered: it gets a GraphModule,
compiled/graph_module.py.)

A compiler is ``compiler(graph) -> callable`` (the callable runs the backward:
``fn(inputs, sizes, scalars, hooks, packed_data)``). "eager" is the reference
interpreter; the code generators register theirs by module path ("module:function"),
resolved on first use, so this layer never imports them (codegen is above it).
"""
from __future__ import annotations

import importlib

from compiled_autograd.compiled.interpreter import Interpreter

# name -> "module:function" or a compiler callable(graph) -> callable
BACKENDS: dict = {"eager": Interpreter, "python": "compiled_autograd.codegen.python:compile_graph",
                  "c": "compiled_autograd.codegen.c_run:compile_graph"}


def register_backend(name: str, compiler) -> None:
    """Register ``compiler(graph) -> callable`` (or a "module:function" path)."""
    BACKENDS[name] = compiler


def resolve_backend(backend):
    if callable(backend):
        return backend
    try:
        compiler = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown compiled autograd backend {backend!r}; "
                         f"available: {sorted(BACKENDS)}") from None
    if isinstance(compiler, str):
        module, _, attr = compiler.partition(":")
        compiler = BACKENDS[backend] = getattr(importlib.import_module(module), attr)
    return compiler
