"""What a user compiler receives: the traced backward as a callable module.

``compiled_backward(backend=compiler_fn)`` calls ``compiler_fn(gm)`` once per new
graph, as torch's compiled autograd hands its compiler a ``torch.fx.GraphModule``.
``gm`` runs the backward with the reference interpreter, so ``lambda gm: gm`` is a
valid compiler (and gives eager's results); ``gm.graph`` is the graph to rewrite or
lower, ``gm.code`` the generated Python, ``gm.print_readable()`` prints it.
"""
from __future__ import annotations

from compiled_autograd.compiled.backends import resolve_backend
from compiled_autograd.compiled.interpreter import Interpreter


class GraphModule:
    """A traced backward graph that can be called, read and printed."""

    def __init__(self, graph):
        self.graph = graph
        self._interpreter = Interpreter(graph)
        self._code = None

    def __call__(self, inputs, sizes, scalars, hooks, packed_data):
        """Run the backward (the reference interpreter): the boxed calling
        convention of every compiled backward."""
        return self._interpreter(inputs, sizes, scalars, hooks, packed_data)

    @property
    def code(self) -> str:
        """The generated straight-line Python of this graph (backend "python")."""
        if self._code is None:
            self._code = resolve_backend("python")(self.graph).code
        return self._code

    def print_readable(self, print_output=True) -> str:
        """The generated Python, with each value's type and its autograd node."""
        text = self.code
        if print_output:
            print(text)
        return text

    def __str__(self):
        return str(self.graph)
