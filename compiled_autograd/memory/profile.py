"""``ca.memory.profile()``: accounting of tensor storage during a block of code.

    with ca.memory.profile() as prof:
        loss = model(x); loss.backward()
    prof.peak_bytes, prof.tracemalloc_peak_bytes, prof.timeline

Every storage allocated inside the block is recorded with its bytes, category
(parameter, activation, saved, recomputed, reloaded, gradient, temporary), the op or
node that made it and a step index; so is its free. ``peak_bytes`` is the peak of
live bytes allocated inside the block. ``tracemalloc_peak_bytes`` is an independent
witness: numpy reports its buffers to tracemalloc, so its peak over the block (minus
what was traced at the start) counts the same buffers plus small Python objects.

A compiled backward that misses the cache captures and compiles its graph inside
the block: the accounting does not see that (the tracer allocates no storage), but
tracemalloc does, so its peak then says more about the compiler than about the
backward. The profile warns (``CompileInProfileWarning``), ``prof.compiles`` says
how many, and ``prof.report`` says so on the page. Run the compiled backward once
before profiling to measure a cache hit.
"""
from __future__ import annotations

import tracemalloc
import warnings
from contextlib import nullcontext

from compiled_autograd.autograd.engine import current_compiler
from compiled_autograd.autograd.grad_mode import is_grad_enabled
from compiled_autograd.memory.report import export_memory_viz, write_report
from compiled_autograd.runtime import memory as _rt
from compiled_autograd.runtime.memory import CATEGORIES, Event, retag_saved  # noqa: F401  (re-exported)


def _default_category():
    return "activation" if is_grad_enabled() else "temporary"


class CompileInProfileWarning(UserWarning):
    """A compiled backward was captured and compiled inside ``ca.memory.profile()``."""


# Compiled autograd's counters (captures, compiles, cache_hits), handed over by the
# package's facade: compiled/ sits above memory/ and is not imported from here.
_compile_stats = None


def set_compile_stats(fn) -> None:
    global _compile_stats
    _compile_stats = fn


def _compiler_label(compiler):
    backend = getattr(compiler, "backend", None)
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", "a callable")
    return f"compiled, backend {name}, {getattr(compiler, 'unpack', '?')} unpacking"


def category(name):
    """Allocations inside are of category ``name`` (no-op when not profiling)."""
    return _rt.category(name) if _rt.active() else nullcontext()


def source(name):
    return _rt.source(name) if _rt.active() else nullcontext()



class profile:
    """Context manager recording storage allocations and frees (see module doc)."""

    def __init__(self, tracemalloc_witness=True):
        self._witness = tracemalloc_witness
        self._tracker = None
        self.tracemalloc_peak_bytes = None
        self.compiles = 0           # backward graphs captured and compiled inside
        self.compiled_runs = 0      # compiled backwards run inside (hits and misses)
        self._compilers = []

    def __enter__(self):
        if self._witness:
            self._started_tracemalloc = not tracemalloc.is_tracing()
            if self._started_tracemalloc:
                tracemalloc.start()
            self._traced_at_start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
        # What an allocation is when no category is pushed: it depends on grad mode,
        # which the runtime does not know.
        _rt.set_default_category(_default_category)
        self._stats = _compile_stats() if _compile_stats is not None else None
        self._compilers = [current_compiler()]
        self._tracker = _rt.start()
        return self

    def __exit__(self, *exc):
        _rt.stop(self._tracker)
        if self._witness:
            self.tracemalloc_peak_bytes = tracemalloc.get_traced_memory()[1] - self._traced_at_start
            if self._started_tracemalloc:
                tracemalloc.stop()
        self._compilers.append(current_compiler())
        if self._stats is not None:
            after = _compile_stats()
            self.compiles = after["captures"] - self._stats["captures"]
            self.compiled_runs = self.compiles + after["cache_hits"] - self._stats["cache_hits"]
            if self.compile_note() and exc[0] is None:
                warnings.warn(self.compile_note(), CompileInProfileWarning, stacklevel=2)
        return False

    def compile_note(self):
        """A sentence on the captures and compiles inside the block, or None."""
        if not self.compiles or not self._witness:
            return None
        return (f"This profile includes {self.compiles} capture(s) and compile(s) of a "
                f"compiled backward: the accounted bytes do not count them, but the "
                f"tracemalloc peak ({self.tracemalloc_peak_bytes or 0:,} bytes) counts the "
                f"tracer's and the compiler's Python objects. Run the compiled backward once "
                f"before profiling to measure a cache hit.")

    @property
    def run(self) -> str:
        """Which backward ran inside: "eager autograd" or "compiled, backend ..., ...
        unpacking" (the backend is known when the block ran inside
        ``ca.compiled_backward``; else pass ``run=`` to ``report``)."""
        if not self.compiled_runs:
            return "eager autograd (no compiled backward ran inside the profile)"
        seen = next((c for c in self._compilers if c is not None), None)
        label = _compiler_label(seen) if seen is not None else \
            "compiled (backend and unpacking not seen by the profile: pass run= to report())"
        how = "captured and compiled inside the profile" if self.compiles else "a cache hit"
        return f"{label}; {how}"

    @property
    def peak_bytes(self) -> int:
        """Peak of live bytes of the storage allocated inside the block."""
        return self._tracker.peak_bytes

    @property
    def peak_by_category(self) -> dict:
        return dict(self._tracker.peak_by_category)

    @property
    def live_bytes(self) -> int:
        """Bytes allocated inside the block and still alive (now, or at exit)."""
        return self._tracker.live_bytes

    @property
    def timeline(self) -> list:
        """The events: ``Event(step, action, bytes, category, name, storage)``."""
        return list(self._tracker.events)

    @property
    def max_by_category(self) -> dict:
        """Each category's own maximum of live bytes."""
        return dict(self._tracker.max_by_category)

    def node_schedule(self) -> dict:
        """Measured live bytes after each graph node, by node name: the measured
        schedule aligned with ``g.memory_schedule()`` (the "eager" graph backend
        marks every node while profiling)."""
        live, out = 0, {}
        for e in self._tracker.events:
            if e.action == "alloc":
                live += e.bytes
            elif e.action == "free":
                live -= e.bytes
            elif e.action == "mark":
                out[e.name] = live
        return out

    def bytes_allocated(self, category=None) -> int:
        return sum(e.bytes for e in self._tracker.events
                   if e.action == "alloc" and (category is None or e.category == category))

    def report(self, path, title="Memory profile", planned=None, run=None) -> str:
        """Write a report: ``.html`` (self-contained, SVG timeline), ``.txt`` or
        ``.json`` (the events), chosen by the suffix. ``planned``: a
        ``MemorySchedule`` to draw beside the measurement; ``run``: which run this
        was (default ``self.run``). Returns the path."""
        note = self.compile_note()
        write_report(self.timeline, path, title=title, peak_bytes=self.peak_bytes,
                     planned=planned, run=run or self.run, notes=[note] if note else [])
        return path

    def export_memory_viz(self, path) -> str:
        """A snapshot pickle that PyTorch's memory viewer (memory_viz) loads."""
        export_memory_viz(self.timeline, path)
        return path

    def summary(self) -> str:
        """A short text table: peak, and bytes allocated by category."""
        lines = [f"peak {self.peak_bytes:,} bytes (tracemalloc peak "
                 f"{self.tracemalloc_peak_bytes or 0:,})",
                 f"{'category':<12} {'at the peak':>14} {'own maximum':>14}"]
        for cat in CATEGORIES:
            lines.append(f"{cat:<12} {self.peak_by_category.get(cat, 0):>14,} "
                         f"{self.max_by_category.get(cat, 0):>14,}")
        return "\n".join(lines)
