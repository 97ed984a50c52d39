"""The C backend's text pieces shared by the emitter (``compiled_autograd.codegen.c``), the
per-kind lowerings (``compiled_autograd.codegen.c_ops``) and the memory passes (``compiled_autograd.codegen.c_memory``):
the templates under ``templates/c/``, the statement record, and how a Python
constant reads in C."""
from __future__ import annotations

import math
from typing import NamedTuple

import jinja2

from compiled_autograd.codegen.c_layout import c_expr
from compiled_autograd.ir.symbolic import SymFloat, SymInt, expr_of
from compiled_autograd.runtime.kernels import MATH_HEADER

# The templates, and runtime's plain-C headers (ca_math.h: the math helpers that the
# forward's C kernels share), pasted in by ``{% include %}``, so their text is part
# of each generated library's source and hash.
ENV = jinja2.Environment(loader=jinja2.ChoiceLoader([
                             jinja2.PackageLoader("compiled_autograd.codegen", "templates/c"),
                             jinja2.FileSystemLoader(str(MATH_HEADER.parent))]),
                         autoescape=False, keep_trailing_newline=True,
                         undefined=jinja2.StrictUndefined, trim_blocks=True,
                         lstrip_blocks=True)


class Stmt(NamedTuple):
    """One C statement of the function, rendered once: at graph step ``step``
    (a callback's release at step + 0.5), under the comment ``source``, with the
    storages its ``text`` names (``uses``) and those whose pointer it sets
    (``sets``): the function's and each part's declarations come from these."""
    step: float
    source: str
    text: str
    uses: frozenset
    sets: frozenset


def render(name, **data) -> str:
    """The template file ``name`` under ``templates/c/`` filled with ``data``."""
    return ENV.get_template(name).render(**data)


def literal(value, ct) -> str:
    """A Python scalar, or a symbolic one, as C of type ``ct``."""
    if isinstance(value, (SymFloat, SymInt)):
        return f"(({ct}){c_expr(expr_of(value))})"
    if isinstance(value, bool):
        return f"(({ct}){int(value)})"
    if isinstance(value, int):
        if ct in ("float", "double") and abs(value) > 2**31:
            # (as numpy casts a Python int to a float dtype: through float64 first;
            # one past long long's range is no C literal at all)
            try:
                value = float(value)
            except OverflowError:
                value = math.copysign(math.inf, value)
        else:
            return f"(({ct}){value}LL)" if abs(value) > 2**31 else f"(({ct}){value})"
    if isinstance(value, float):
        if math.isnan(value):     # (its sign kept: -nan is a negative NaN, as numpy's)
            return f"(({ct})(-NAN))" if math.copysign(1.0, value) < 0 else f"(({ct})NAN)"
        if math.isinf(value):
            return f"(({ct}){'-' if value < 0 else ''}INFINITY)"
        return f"(({ct}){value!r})"
    raise NotImplementedError(f"C backend: constant {value!r}")


def split_parts(blocks, max_lines):
    """The blocks in consecutive parts of at most about ``max_lines`` lines of C
    (a block is never cut), so that each part compiles as its own unit."""
    parts, current, lines = [], [], 0
    for block in blocks:
        n = 1 + sum(t.count("\n") + 1 for t in block["stmts"])
        if current and lines + n > max_lines:
            parts.append(current)
            current, lines = [], 0
        current.append(block)
        lines += n
    return parts + [current] if current else parts
