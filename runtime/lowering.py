"""How a prim lowers to C: one small record in the prim's table entry (``c=``).

The C backend (``codegen/c.py``, ``codegen/c_ops.py``) never looks at a prim's
name: it reads the record's ``kind`` to pick its emitter (a table keyed by kind,
like tinygrad's ``code_for_op``), and the record's fields for everything that
emitter needs -- the C expression, the template file under
``codegen/templates/c/``, the reduction's accumulator, a flag that selects a
variant of a shared template. So a new elementwise prim lowers to C from its
entry alone, and a new prim of an existing kind needs no change in ``codegen/``.

Fusion is a fact of the kind: an elementwise value (``fusable``) may be inlined
as an expression into the loop of its single consumer, where that consumer's
record ``inlines`` the operand (every operand of an elementwise loop over the
same shape; a reduction's input).
"""
from __future__ import annotations

# ``Lowering.inlines`` of an elementwise loop: any operand of the loop's own shape.
SAME_LOOP = "same loop"


class Lowering:
    """A prim's C lowering. ``kind`` names the C backend's emitter; ``template``
    is its file under ``codegen/templates/c/`` (None where the kind's emitter
    uses the shared loop template, or emits no code: a view); ``options`` are
    the facts that emitter reads (``lowering.options["log"]``)."""

    __slots__ = ("kind", "template", "options")
    fusable = False   # its value may be inlined into its consumer's loop
    inlines = ()      # operand positions that may be such an inlined value

    def __init__(self, kind, template=None, **options):
        self.kind, self.template, self.options = kind, template, options

    def __repr__(self):
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({self.kind!r}, {self.template!r}{opts})"


class Elementwise(Lowering):
    """One loop over the result's elements: ``expr`` is the C expression of one
    element, a jinja2 template over the inputs ``a``, ``b``, ``c``, the params,
    the result's C type ``T`` and ``sfx`` (which typed helper of runtime/ca_math.h to call:
    ``f``, ``d``, ``i``).

    ``compute``: "out" computes in the result's type; "inputs" in the inputs'
    common type (a comparison, whose result is bool). ``uncast``: operand
    positions read as they are, not converted (a condition, a mask, a cast's
    source). ``reads_inputs=False``: the inputs give only the shape (a fill).
    ``adds``: the op is ``a + b``, so a zero operand gives the other one back
    (a sum of window gradients becomes their concatenation: codegen/c_concat.py)."""

    __slots__ = ()
    fusable = True
    inlines = SAME_LOOP

    def __init__(self, expr, compute="out", uncast=(), reads_inputs=True, adds=False):
        super().__init__("elementwise", None, expr=expr, compute=compute,
                         uncast=tuple(uncast), reads_inputs=reads_inputs, adds=adds)

    @property
    def expr(self) -> str:
        return self.options["expr"]


class Reduction(Lowering):
    """A reduction over the params' ``dims``: ``op`` is the template's update
    ("sum": ``acc += v``; "amax": NaN-propagating max), ``init`` the
    accumulator's start for float and for integer inputs, ``wide``: accumulate
    in double / int64 rather than the result's type. Its input may be an
    inlined elementwise expression."""

    __slots__ = ()
    inlines = (0,)

    def __init__(self, op, init, wide):
        super().__init__("reduction", "reduce.c.j2", op=op, init=tuple(init), wide=wide,
                         rows_template="reduce_rows.c.j2")


class View(Lowering):
    """No code: the result is a new layout over its input's storage. ``layout``
    names how the strides change (after ``compiled_autograd.codegen.c_layout``'s functions):
    "permuted", "expanded", "sliced", "reshaped" (a copy first when the input
    is not contiguous), "strided"."""

    __slots__ = ()

    def __init__(self, layout):
        super().__init__("view", None, layout=layout)


class Template(Lowering):
    """A kernel of its own: ``kind`` names the emitter that fills ``template``
    (gemm, row_softmax, gather_scatter, ...), ``options`` select its variants."""

    __slots__ = ()

    def __init__(self, template, kind, **options):
        super().__init__(kind, template, **options)
