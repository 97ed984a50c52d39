"""Symbolic sizes for dynamic shapes.

A ``SymInt`` is an ``int`` whose value is a size seen at trace time (its *hint*) and
which also carries an expression over the graph's ``sizes`` list: ``s3`` is
``sizes[3]``, ``(s3*64)`` a product. Arithmetic keeps it symbolic, so shape
arguments computed by derivative formulas (reshape targets, expand shapes) become
expressions evaluated at run time. Everything else a trace does with a symbolic size
-- compare it, turn it into a Python int -- records a *guard* (the same comparison
must give the same answer), and a cache lookup re-checks every guard: a graph is
reused only for sizes on which it was traced correctly.
"""
from __future__ import annotations

import threading

_state = threading.local()


class ShapeEnv:
    """Collects the guards of one trace (install with ``with ShapeEnv() as env``)."""

    def __init__(self):
        self.guards: list = []   # (lhs expr, op, rhs expr, result)

    def __enter__(self):
        self._prev = getattr(_state, "env", None)
        _state.env = self
        return self

    def __exit__(self, *exc):
        _state.env = self._prev
        return False


def _record(lhs, op, rhs, result):
    env = getattr(_state, "env", None)
    if env is not None:
        env.guards.append((lhs, op, rhs, result))
    return result


def expr_of(v):
    if isinstance(v, (SymInt, SymFloat)):
        return v.expr
    return float(v) if isinstance(v, float) else int(v)


def hint(v):
    """The trace-time value of a symbol, without recording a guard."""
    return v._hint if isinstance(v, (SymInt, SymFloat)) else v


_BINOPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
           "//": lambda a, b: a // b}
_COMPARE = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def evaluate(expr, sizes, scalars=()):
    """The value of an expression for the run-time ``sizes`` and ``scalars``."""
    if isinstance(expr, (int, float)):
        return expr
    if expr[0] == "s":
        return sizes[expr[1]]
    if expr[0] == "c":
        return scalars[expr[1]]
    op, a, b = expr
    return _BINOPS[op](evaluate(a, sizes, scalars), evaluate(b, sizes, scalars))


def format_expr(expr) -> str:
    if isinstance(expr, (int, float)):
        return repr(expr)
    if expr[0] in ("s", "c"):
        return f"{expr[0]}{expr[1]}"
    op, a, b = expr
    return f"({format_expr(a)}{op}{format_expr(b)})"


def guards_hold(guards, sizes, scalars=()) -> bool:
    return all(_COMPARE[op](evaluate(lhs, sizes, scalars), evaluate(rhs, sizes, scalars))
               == result for lhs, op, rhs, result in guards)


def is_symbolic(v) -> bool:
    return isinstance(v, (SymInt, SymFloat))


def resolve(value, sizes, scalars):
    """``value`` with every symbol replaced by its run-time number."""
    if isinstance(value, (SymInt, SymFloat)):
        return evaluate(value.expr, sizes, scalars)
    if isinstance(value, tuple):
        return tuple(resolve(v, sizes, scalars) for v in value)
    if isinstance(value, list):
        return [resolve(v, sizes, scalars) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, sizes, scalars) for k, v in value.items()}
    return value


def contains_symbol(value) -> bool:
    if isinstance(value, (SymInt, SymFloat)):
        return True
    if isinstance(value, (tuple, list)):
        return any(contains_symbol(v) for v in value)
    if isinstance(value, dict):
        return any(contains_symbol(v) for v in value.values())
    return False


def _binop(op, a, b):
    if not isinstance(b, int) or isinstance(b, bool):
        return NotImplemented
    return SymInt(_BINOPS[op](hint(a), hint(b)), (op, expr_of(a), expr_of(b)))


def _compare(op, a, b):
    if not isinstance(b, int) or isinstance(b, bool):
        return NotImplemented
    result = _COMPARE[op](hint(a), hint(b))
    return _record(expr_of(a), op, expr_of(b), result)


class SymInt(int):
    """A size that may differ between calls of one compiled graph."""

    def __new__(cls, value, expr):
        obj = super().__new__(cls, value)
        obj._hint = int.__int__(obj)
        obj.expr = expr
        return obj

    @classmethod
    def size(cls, value, position):
        return cls(value, ("s", position))

    __add__ = lambda self, o: _binop("+", self, o)          # noqa: E731
    __radd__ = lambda self, o: _binop("+", o, self) if isinstance(o, int) else NotImplemented  # noqa: E501,E731
    __sub__ = lambda self, o: _binop("-", self, o)          # noqa: E731
    __rsub__ = lambda self, o: _binop("-", o, self) if isinstance(o, int) else NotImplemented  # noqa: E501,E731
    __mul__ = lambda self, o: _binop("*", self, o)          # noqa: E731
    __rmul__ = lambda self, o: _binop("*", o, self) if isinstance(o, int) else NotImplemented  # noqa: E501,E731
    __floordiv__ = lambda self, o: _binop("//", self, o)    # noqa: E731
    __eq__ = lambda self, o: _compare("==", self, o)        # noqa: E731
    __ne__ = lambda self, o: _compare("!=", self, o)        # noqa: E731
    __lt__ = lambda self, o: _compare("<", self, o)         # noqa: E731
    __le__ = lambda self, o: _compare("<=", self, o)        # noqa: E731
    __gt__ = lambda self, o: _compare(">", self, o)         # noqa: E731
    __ge__ = lambda self, o: _compare(">=", self, o)        # noqa: E731
    __hash__ = int.__hash__

    def _specialize(self):
        # Leaving the symbolic world pins the value: guard that it stays.
        _record(self.expr, "==", self._hint, True)
        return self._hint

    def __index__(self):
        return self._specialize()

    def __int__(self):
        return self._specialize()

    def __float__(self):
        return float(self._specialize())

    def __bool__(self):
        return bool(self._specialize())

    def __repr__(self):
        return format_expr(self.expr)

    __str__ = __repr__

    def __reduce__(self):
        return (SymInt, (self._hint, self.expr))


def _fbinop(op, a, b):
    if not isinstance(b, (int, float)) or isinstance(b, bool):
        return NotImplemented
    return SymFloat(_FBINOPS[op](hint(a), hint(b)), (op, expr_of(a), expr_of(b)))


_FBINOPS = dict(_BINOPS, **{"/": lambda a, b: a / b})
_BINOPS["/"] = _FBINOPS["/"]


def _fcompare(op, a, b):
    if not isinstance(b, (int, float)) or isinstance(b, bool):
        return NotImplemented
    return _record(expr_of(a), op, expr_of(b), _COMPARE[op](hint(a), hint(b)))


class SymFloat(float):
    """A Python float a node saved (mean's 1/n, a scalar factor), lifted into the
    graph's ``scalars`` list so that a new value is not a new graph. Inside
    derivative formulas it behaves as the float it is; arithmetic stays symbolic,
    comparisons record guards."""

    def __new__(cls, value, expr):
        obj = super().__new__(cls, value)
        obj._hint = float.__float__(obj)
        obj.expr = expr
        return obj

    @classmethod
    def scalar(cls, value, position):
        return cls(value, ("c", position))

    __add__ = lambda self, o: _fbinop("+", self, o)          # noqa: E731
    __radd__ = lambda self, o: _fbinop("+", o, self) if isinstance(o, (int, float)) else NotImplemented  # noqa: E501,E731
    __sub__ = lambda self, o: _fbinop("-", self, o)          # noqa: E731
    __rsub__ = lambda self, o: _fbinop("-", o, self) if isinstance(o, (int, float)) else NotImplemented  # noqa: E501,E731
    __mul__ = lambda self, o: _fbinop("*", self, o)          # noqa: E731
    __rmul__ = lambda self, o: _fbinop("*", o, self) if isinstance(o, (int, float)) else NotImplemented  # noqa: E501,E731
    __truediv__ = lambda self, o: _fbinop("/", self, o)      # noqa: E731
    __rtruediv__ = lambda self, o: _fbinop("/", o, self) if isinstance(o, (int, float)) else NotImplemented  # noqa: E501,E731
    __eq__ = lambda self, o: _fcompare("==", self, o)        # noqa: E731
    __ne__ = lambda self, o: _fcompare("!=", self, o)        # noqa: E731
    __lt__ = lambda self, o: _fcompare("<", self, o)         # noqa: E731
    __le__ = lambda self, o: _fcompare("<=", self, o)        # noqa: E731
    __gt__ = lambda self, o: _fcompare(">", self, o)         # noqa: E731
    __ge__ = lambda self, o: _fcompare(">=", self, o)        # noqa: E731
    __hash__ = float.__hash__

    def __repr__(self):
        return format_expr(self.expr)

    __str__ = __repr__

    def __reduce__(self):
        return (SymFloat, (self._hint, self.expr))
