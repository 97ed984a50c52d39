"""Symbolic sizes for dynamic shapes.

A ``SymInt`` is an ``int`` whose value is a size seen at trace time (its *hint*) and
which also carries an expression over the graph's ``sizes`` list: ``s3`` is
``sizes[3]``, ``(s3*64)`` a product. Arithmetic keeps it symbolic, so shape
arguments computed by derivative formulas (reshape targets, expand shapes) become
expressions evaluated at run time. Everything else a trace does with a symbolic size
-- compare it, turn it into a Python int -- records a *guard* (the same comparison
must give the same answer), and a cache lookup re-checks every guard: a graph is
reused only for sizes on which it was traced correctly.

The holes: whatever reads the number inside an ``int`` or ``float`` without asking
it records no guard -- a Python float on the *left* (``1.0 / n``:
``float.__truediv__`` accepts any int), ``range(n)``, indexing and numpy (an int
subclass is its own ``__index__``), ``math.exp(c)``. Derivative formulas, which
meet symbolic sizes, must not do that (``float(n)`` first guards it); user code
never meets one: inside a custom Function's backward a traced Tensor's shape is
plain ints, each pinned by a guard (tracer.Proxy).
"""
from __future__ import annotations

import numbers
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


_OPS = {op: op for op in ("+", "-", "*", "//", "/")}


def expr_text(expr, symbol, ops=_OPS, sep="") -> str:
    """Source text of a size or scalar expression (the one walker behind the
    printed form and the generated Python and C): numbers as literals, symbol
    ``("s", i)``/``("c", i)`` as ``symbol(kind, i)``, each operator in ``ops`` as
    its text there; any other operator or value is refused."""
    if isinstance(expr, bool) or not isinstance(expr, (int, float, tuple)):
        raise TypeError(f"not a size expression: {expr!r}")
    if not isinstance(expr, tuple):
        return repr(expr)
    if expr[0] in ("s", "c"):
        return symbol(expr[0], int(expr[1]))
    op, a, b = expr
    if op not in ops:
        raise ValueError(f"unknown size operator {op!r}")
    return (f"({expr_text(a, symbol, ops, sep)}{sep}{ops[op]}{sep}"
            f"{expr_text(b, symbol, ops, sep)})")


def boxed_symbol(kind, i) -> str:
    """A symbol as generated code reads it: ``sizes[i]`` or ``scalars[i]``."""
    return f"{'sizes' if kind == 's' else 'scalars'}[{i}]"


def format_expr(expr) -> str:
    return expr_text(expr, lambda kind, i: f"{kind}{i}")


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


def _operand(value, types):
    return isinstance(value, types) and not isinstance(value, bool)


def _install_operators(cls, ops, types):
    """Arithmetic that stays symbolic (a new ``cls`` carrying the expression) and
    comparisons that record guards, for the symbolic number class ``cls``."""
    def arith(op):
        def forward(self, other):
            if not _operand(other, types):
                if isinstance(other, numbers.Real) and not is_symbolic(other):
                    # a float for a SymInt, numpy's numbers: leaves the symbolic world
                    return _BINOPS[op](self._specialize(), other)
                return NotImplemented
            return cls(_BINOPS[op](hint(self), hint(other)),
                       (op, expr_of(self), expr_of(other)))

        def reflected(self, other):
            if not _operand(other, types):
                if isinstance(other, numbers.Real) and not is_symbolic(other):
                    return _BINOPS[op](other, self._specialize())
                return NotImplemented
            return cls(_BINOPS[op](hint(other), hint(self)),
                       (op, expr_of(other), expr_of(self)))
        return forward, reflected

    def compare(op):
        def method(self, other):
            if not _operand(other, (int, float)):
                return NotImplemented
            result = _COMPARE[op](hint(self), hint(other))
            return _record(expr_of(self), op, expr_of(other), result)
        return method

    def specialised(name):
        method = getattr(cls.__mro__[1], name)     # int's or float's own

        def specialise(self, *args):
            args = tuple(a._specialize() if is_symbolic(a) else a for a in args)
            return method(cls.__mro__[1](self._specialize()), *args)
        return specialise

    for op, name in ops:
        forward, reflected = arith(op)
        setattr(cls, f"__{name}__", forward)
        setattr(cls, f"__r{name}__", reflected)
    if cls.__mro__[1] is float:
        # (Not for sizes: the C backend's / is Python's // only for sizes >= 0.)
        cls.__neg__ = lambda self: cls(-hint(self), ("*", -1, expr_of(self)))
    # Any other arithmetic leaves the symbolic world: its operands are pinned by guards.
    for name in ("__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
                 "__rmod__", "__divmod__", "__rdivmod__", "__pow__", "__rpow__", "__neg__",
                 "__pos__", "__abs__", "__round__", "__trunc__", "__floor__", "__ceil__",
                 "__float__", "__int__", "__bool__", "__lshift__", "__rlshift__", "__rshift__",
                 "__rrshift__", "__and__", "__rand__", "__or__", "__ror__", "__xor__",
                 "__rxor__", "__invert__"):
        if hasattr(cls.__mro__[1], name) and name not in cls.__dict__:
            setattr(cls, name, specialised(name))
    for op, name in (("==", "eq"), ("!=", "ne"), ("<", "lt"), ("<=", "le"), (">", "gt"),
                     (">=", "ge")):
        setattr(cls, f"__{name}__", compare(op))
    cls.__hash__ = cls.__mro__[1].__hash__


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


_BINOPS["/"] = lambda a, b: a / b


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

    def _specialize(self):
        _record(self.expr, "==", self._hint, True)
        return self._hint


    def __repr__(self):
        return format_expr(self.expr)

    __str__ = __repr__

    def __reduce__(self):
        return (SymFloat, (self._hint, self.expr))


_install_operators(SymInt, (("+", "add"), ("-", "sub"), ("*", "mul"), ("//", "floordiv")), int)
_install_operators(SymFloat, (("+", "add"), ("-", "sub"), ("*", "mul"), ("/", "truediv")),
                   (int, float))
