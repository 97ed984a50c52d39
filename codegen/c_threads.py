"""Which generated loops run on several threads, and the OpenMP line that says so.

A loop nest is split across threads only where each thread's results are the
ones one thread would compute: by its independent outputs (the outer loops of an
elementwise nest; the rows of a softmax, a layer_norm or a reduction over inner
dims; the columns of a reduction that keeps the last dim). No accumulation is
ever split, and each output element is computed by the same compiled code
whatever the thread count (the ``if`` clause keeps one code path: the loop is
outlined once and run by a team of one or more), so the results are bitwise the
same at any thread count.

The pragma goes through ``CA_OMP(...)`` (templates/c/prelude.c.j2): an
``_Pragma`` with ``-fopenmp``, nothing without (``compiled_autograd.runtime.cbuild.openmp``), so the
source is one and the build decides. ``ca_nt`` is the team size, read from the
BLAS at each call (templates/c/backward.c.j2).

A nest whose work is known to be small gets no pragma at all; one whose size is
symbolic gets the test in its ``if`` clause. Work is elements times a rough
per-element cost: 1 for loads, stores and arithmetic, ``HEAVY`` for an element
that calls exp, erf, log, pow or tanh.
"""
from __future__ import annotations

import re

from compiled_autograd.codegen.c_layout import c_expr, mul, prod

# Below this much work a loop stays on the calling thread: starting a team and
# waiting for it costs about what a thread gains on this many simple elements
# (measured on 2 cores: docs/c-backend.md, "Threads").
MIN_WORK = 32768
# An element that calls a transcendental function costs about this many simple ones.
HEAVY = 8
_HEAVY_CALL = re.compile(r"\b(ca_(exp|erf|gelu|sigmoid|tanh|log)\w*|exp|log|pow|tanh|erf|sqrt)\(")


def cost(body: str) -> int:
    """A rough per-element cost of the C expression ``body``."""
    return HEAVY if _HEAVY_CALL.search(body) else 1


def pragma(work, collapse: int = 1, parallel_for: bool = True) -> str:
    """The line that puts the next loop (``collapse`` of them, nested) on
    ``ca_nt`` threads, or "" where ``work`` (a size: an int, or symbolic) is
    known to be below ``MIN_WORK``. ``parallel_for=False``: a bare parallel
    region, for a block whose threads share the work out themselves (ca_share)."""
    if isinstance(work, int):
        if work < MIN_WORK:
            return ""
        cond = "ca_nt > 1"
    else:
        cond = f"ca_nt > 1 && ({c_expr(work)}) >= {MIN_WORK}"
    if not parallel_for:
        return f"CA_OMP(omp parallel num_threads(ca_nt) if({cond}))"
    clauses = f" collapse({collapse})" if collapse > 1 else ""
    return f"CA_OMP(omp parallel for num_threads(ca_nt) if({cond}) schedule(static){clauses})"


def work(dims, per_element: int = 1):
    """Elements of a loop nest over ``dims`` times ``per_element``."""
    return mul(prod(list(dims)), per_element)


def no_overlap(dims, strides) -> bool:
    """Whether a store through ``strides`` over ``dims`` writes each element at
    most once (then its iterations may run on different threads; an
    overlapping window, possible in as_strided_scatter, keeps the last write of
    one thread's order). Symbolic strides are not proved: False."""
    pairs = [(s, n) for s, n in zip(strides, dims) if n != 1]
    if not all(isinstance(s, int) and isinstance(n, int) for s, n in pairs):
        return False
    span = 1
    for s, n in sorted((abs(s), n) for s, n in pairs):
        if s < span:
            return False
        span = s * n
    return True
