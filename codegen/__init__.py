"""codegen: graph IR -> source (Python and C emitters from jinja2 templates), with
the liveness analysis and memory planning they share.

Nothing here yet: the tracer (compiled_autograd) produces the graph IR first. This
layer may import runtime and compiled_autograd's IR, never the other way round; the
front end reaches it only through the backend registry.
"""
