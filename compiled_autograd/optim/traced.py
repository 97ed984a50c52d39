"""An optimizer's update of one parameter, traced into a compiled backward.

Each optimizer writes its rule once (``_update``), on arrays, as numpy calls with
``out=`` and in-place operators, through a namespace ``xp``: numpy itself when
``step()`` runs it, and ``TRACE`` here when compiled autograd records it inside a
backward (``ca.optim.in_backward``). ``TRACE`` works on ``Buffer``s. A buffer holds
the graph value it has now; a call with ``out=`` (or ``+=``, ``*=``, ...) gives it a
new one, a prim node, so the rule's in-place steps become a chain of values. A
parameter or state buffer is written back into its array by a ``store`` node at
its last write (the rule runs twice: once to count the writes, then for good), and
is read from its array after that: so the chain ending there has one user, the
store, and the C backend writes it in one loop, straight into the array. The floats the rule computes with (``lr``, betas,
Adam's bias corrections, ...) come in ``scalars``: the runtime scalars of the
graph, so a scheduler's new learning rate is a new input, not a new graph.

In numpy, an ``out=`` that is also an input is read before it is written, element
by element; a chain of values computes the same. Two scratch requests of one index
are one buffer here as they are one array in ``Scratch``, so a rule that reuses a
temporary reads what it wrote.
"""
from __future__ import annotations

from types import SimpleNamespace

from compiled_autograd.runtime.prims import PRIMS


class Buffer:
    """An array of a traced update: its current graph value (a Proxy), and, for a
    parameter or state array, the graph value of the array it is stored into."""

    __slots__ = ("value", "target", "writes", "last", "store")

    def __init__(self, value=None, target=None, last=None, store=None):
        self.value, self.target = value, target
        self.writes, self.last, self.store = 0, last, store

    @property
    def _data(self):
        return self    # (it stands where a state Tensor stands: ``state[k]._data``)

    @property
    def shape(self):
        return self.value.shape

    @property
    def dtype(self):
        return self.value.dtype

    def __iadd__(self, other):
        return add(self, other, out=self)

    def __isub__(self, other):
        return subtract(self, other, out=self)

    def __imul__(self, other):
        return multiply(self, other, out=self)

    def __itruediv__(self, other):
        return divide(self, other, out=self)


def _value(x):
    if isinstance(x, Buffer):
        if x.value is None:
            raise RuntimeError("ca.optim: an update read a temporary before writing it")
        return x.value
    return x


def _set(out, value):
    if not isinstance(out, Buffer):
        raise TypeError("ca.optim: a traced update writes only into its buffers (out=)")
    out.value = value
    out.writes += 1
    if out.writes == out.last:
        out.store(out.target, value)
        out.value = out.target     # (read from its array from here on)
    return out


def _binary(name):
    prim = PRIMS[name]

    def op(a, b, out):
        return _set(out, prim(_value(a), _value(b)))
    op.__name__ = name
    return op


def _unary(name):
    prim = PRIMS[name]

    def op(a, out):
        return _set(out, prim(_value(a)))
    op.__name__ = name
    return op


add, subtract, multiply, divide = (_binary(n) for n in ("add", "sub", "mul", "div"))
maximum = _binary("maximum")
negative, sqrt = _unary("neg"), _unary("sqrt")


# The numpy functions a rule calls, on buffers (``xp`` while tracing).
TRACE = SimpleNamespace(add=add, subtract=subtract, multiply=multiply, divide=divide,
                        maximum=maximum, negative=negative, sqrt=sqrt)


class TraceScratch:
    """``Scratch`` while tracing: temporary ``i`` is one buffer, as it is one array."""

    def __init__(self):
        self._buffers = {}

    def get(self, like, i):
        return self._buffers.setdefault(i, Buffer())
