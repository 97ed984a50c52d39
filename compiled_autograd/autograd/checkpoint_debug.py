"""``checkpoint(..., debug=True)``: the log of the operators run in the original forward
and in the recomputation, for the error that reports a non-deterministic recomputation
(torch.utils.checkpoint's ``_get_debug_context_and_cb``).

torch logs every aten op under a ``LoggingTensorMode`` with its stack trace; here a
dispatch interceptor logs every prim called on Tensors (``$2: f32[4] = sin($1)``),
with the Python frames that called it (the library's own frames left out). In-place
ops, which bypass interceptors, are not logged.
"""
from __future__ import annotations

import os
import sys
import weakref

import numpy as np

from compiled_autograd.autograd import dispatch
from compiled_autograd.runtime import prims as _prims
from compiled_autograd.runtime.prims import run_kernel

# Frames from these folders are the machinery, not the user's code.
_LIBRARY_DIRS = tuple(os.path.dirname(os.path.abspath(f)) + os.sep
                      for f in (__file__, _prims.__file__))

_TEMPLATE = """ \
An error happened while unpacking tensors; dumping logs of latest computation
because you passed `debug=True` to `torch.utils.checkpoint.checkpoint()`.
Scroll all the way down for guidance on how to navigate these logs.

+~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~+
|        1. Stack traces of the operators that ran in the original forward     |
+------------------------------------------------------------------------------+

{forward_traces}
+~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~+
|        2. Stack traces of the operators that ran during recomputation        |
+------------------------------------------------------------------------------+

{recompute_traces}
+~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~+
|       3. Log of operators in the original forward and recomputation          |
+------------------------------------------------------------------------------+
(Scroll up to correlate stack traces with each operation listed below. This
 helps identify their source in the code.)

Operations executed during the original forward:

{forward_ops}

Operations executed during recomputation:

{recompute_ops}

{divergence}
+------------------------------------------------------------------------------+
 ERROR: Detected non-determinism while running activation checkpointing

 You are seeing this error because you passed `debug=True` to checkpoint and
 tensors to be saved during the original forward and differ between those saved
 during recomputation. This can happen if different operators were ran in the
 original forward and in the recomputation.

 To identify where the mismatch may be coming from, you can do the following:

 1) Compare the operators ran during original forward and recomputation to
    see where they differ. These operators are printed above in the order they
    were executed.

 2) Review the stack trace for each operator to locate its invocation source.
    Each operator's stack trace is printed in their execution order.

 Note that the logs can be quite long. Here's how they are structured:
 (Tip: you can Ctrl-f for these headers)

 1. Stack traces of the operators that ran in the original forward
 2. Stack traces of the operators that ran during recomputation
 3. Log of operators in the original forward and recomputation
 4. Error message                                             <--- You are here
--------------------------------------------------------------------------------
"""

_KIND = {"f": "f", "i": "i", "u": "u", "c": "c", "b": "b"}


def _type_str(a) -> str:
    """torch's short form: f32[4, 3]."""
    a = np.asarray(a)
    kind = _KIND.get(a.dtype.kind, a.dtype.kind)
    return f"{kind}{a.dtype.itemsize * 8}[{', '.join(str(d) for d in a.shape)}]"


def _short(value, limit=60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _OpLog:
    """Interceptor: logs each prim call (and its user frames), then computes it as
    the interceptor below it (or the kernel) would."""

    def __init__(self):
        self.ops = []       # "$2: f32[4] = sin($1)"
        self.traces = []    # per op: [(filename, line, function)], innermost first
        self._names = {}    # id(array) -> (weakref to it, "$k")
        self._count = 0
        self._below = None

    def _name(self, array, new=False):
        entry = self._names.get(id(array))
        if not new and entry is not None and entry[0]() is array:
            return entry[1]
        name = f"${self._count}"
        self._count += 1
        try:
            self._names[id(array)] = (weakref.ref(array), name)
        except TypeError:               # (not weak-referenceable: named once)
            pass
        return name

    def __call__(self, prim, arrays, params):
        out = (self._below(prim, arrays, params) if self._below is not None
               else run_kernel(prim, arrays, params))
        args = [self._name(a) if isinstance(a, np.ndarray) else _short(a) for a in arrays]
        args += [f"{k}={_short(v)}" for k, v in params.items()]
        self.ops.append(f"{self._name(out, new=True)}: {_type_str(out)} = "
                        f"{prim.name}({', '.join(args)})")
        self.traces.append(_user_frames(sys._getframe(1)))
        self._out = out
        return out

    def observe(self, result, args):
        if self._below is not None:
            self._below.observe(result, args)
        out, self._out = getattr(self, "_out", None), None
        data = result._data
        if out is not None and data is not out and id(out) in self._names:
            # (the Tensor holds a C-contiguous copy of the kernel's result)
            self._names[id(data)] = (weakref.ref(data), self._names[id(out)][1])

    def __enter__(self):
        self.ops, self.traces, self._names, self._count = [], [], {}, 0  # the latest run
        stack = dispatch._interceptors
        self._below = stack[-1] if stack else None
        dispatch.push_interceptor(self)
        return self

    def __exit__(self, *exc):
        dispatch.pop_interceptor(self)
        self._below = None
        return False


def _user_frames(frame):
    frames = []
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_LIBRARY_DIRS):
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return frames


def _traces(label, log) -> str:
    out = ""
    total = len(log.ops)
    for i, (op, frames) in enumerate(zip(log.ops, log.traces)):
        out += f"{op}   ({i + 1} of {total} in {label})\n\n"
        out += "".join(f"{f}:{line}:{name}\n" for f, line, name in frames)
        out += "\n\n"
    return out


def _signature(op) -> str:
    """An op line without its value names: what it did, to what shapes."""
    return op.split(": ", 1)[1] if ": " in op else op


def _divergence(forward, recompute) -> str:
    for i, (a, b) in enumerate(zip(forward.ops, recompute.ops)):
        if _signature(a) != _signature(b):
            return (f"The runs diverge at operator {i + 1}:\n"
                    f"  original forward: {a}\n  recomputation:    {b}\n")
    n = min(len(forward.ops), len(recompute.ops))
    if len(forward.ops) != len(recompute.ops):
        return (f"The first {n} operators are the same; the original forward ran "
                f"{len(forward.ops)}, the recomputation {len(recompute.ops)} (it stops once "
                "every saved tensor is recomputed).\n")
    return f"The {n} operators are the same in both runs.\n"


class DebugLogs:
    """The (forward, recompute) contexts of ``checkpoint(debug=True)`` and the
    message of the error they explain."""

    def __init__(self):
        self.forward, self.recompute = _OpLog(), _OpLog()

    def contexts(self):
        return self.forward, self.recompute

    def message(self) -> str:
        return _TEMPLATE.format(
            forward_traces=_traces("original", self.forward),
            recompute_traces=_traces("recompute", self.recompute),
            forward_ops="\n".join(self.forward.ops),
            recompute_ops="\n".join(self.recompute.ops),
            divergence=_divergence(self.forward, self.recompute))
