"""Measuring memory policies side by side: the hand ones (checkpoint per layer,
sqrt(n) segments, selective, disk offload) and ``ca.memory.plan_checkpoints``.

Shared by ``benchmarks/memory.py`` and ``tests/test_memory_plan_policies.py`` (which
loads this file by path), so that the claims the benchmark prints and the test
asserts come from one measuring code:

- ``measure_peak``: the peak of forward plus backward as ``ca.memory.profile()``
  counts it, on the second (warm) run, every ``.grad`` None at the start -- the
  measure a plan's budget and prediction refer to;
- the recompute FLOPs: for a hand checkpoint, the FLOPs (``prim_flops``) of the
  kernels that really run under the "recomputed" memory category during the
  backward (``RecomputeFlops``); for a plan, those of the recipe nodes of its
  traced backward graph (``plan_graph_flops``), which ``plan.recompute_flops``
  must equal;
- ``backward_seconds``: the median backward time on a backend (forward untimed).
"""
from __future__ import annotations

import copy
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np

import compiled_autograd as ca
from compiled_autograd.autograd.recipe import ANY_BACKEND
from compiled_autograd.compiled.api import backward_on
from compiled_autograd.examples import build
from compiled_autograd.planning.profile import prim_flops
from compiled_autograd.runtime import memory as rt_memory
from compiled_autograd.runtime import prims as rt_prims

# (key, label, build() options)
HAND_POLICIES = [
    ("none", "no checkpointing", dict(checkpoint="none")),
    ("layer", "per-layer checkpoint", dict(checkpoint="layer")),
    ("sqrt", "sqrt(n) segments", dict(checkpoint="sqrt")),
    ("selective", "selective (keep linear)", dict(checkpoint="selective")),
    ("offload", "disk offload", dict(offload=True)),
]
BUDGETS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


class RecomputeFlops:
    """Counts the FLOPs of the prim kernels run while the memory category is
    "recomputed": a checkpoint's recomputation pushes it (when a
    ``ca.memory.profile()`` is active), on every backend, since a hand checkpoint
    recomputes in Python. A selective policy's kept outputs are handed back
    without running their kernel, so they are not counted. Enter it inside
    ``ca.memory.profile()``: it wraps the profile's kernel hook."""

    def __init__(self):
        self.flops = 0
        self.prims = 0

    def __enter__(self):
        self._accounting = rt_prims._kernel_hook
        if self._accounting is None:
            raise RuntimeError("RecomputeFlops: enter it inside ca.memory.profile()")
        rt_prims.set_kernel_hook(self._hook)
        return self

    def _hook(self, prim, out, args):
        self._accounting(prim, out, args)
        if rt_memory.current_category() == "recomputed":
            shapes = [a.shape if isinstance(a, np.ndarray) else None for a in args]
            self.flops += prim_flops(prim.name, shapes, np.shape(out))
            self.prims += 1

    def __exit__(self, *exc):
        rt_prims.set_kernel_hook(self._accounting)
        return False


def plan_graph_flops(plan, ex) -> tuple[int, int]:
    """(FLOPs, nodes) of the recomputation in the backward graph of a forward under
    ``plan``: the prim nodes the tracer emitted for recipes (meta "recipe")."""
    ex.zero_grad()
    with plan:
        loss = ex.loss()
    graph = ca.trace_backward(loss).graph
    flops = nodes = 0
    for n in graph.nodes:
        if "recipe" in n.meta:
            shapes = [a.meta["shape"] if hasattr(a, "meta") else None for a in n.args]
            flops += prim_flops(n.target, shapes, n.meta["shape"])
            nodes += 1
    return flops, nodes


def _backward(loss, backend):
    """"eager" is the eager engine (as the CLI's ``--backend``)."""
    backward_on(loss, None if backend == "eager" else backend)


def measure_peak(ex, plan=None, backend="python", witness=False):
    """(profile, recompute FLOPs counted) of forward plus backward on ``backend``,
    every .grad None at the start, after an unprofiled run (which compiles)."""
    for profiled in (False, True):
        ex.zero_grad()
        with ca.memory.profile(tracemalloc_witness=witness) if profiled else nullcontext() \
                as prof, RecomputeFlops() if profiled else nullcontext() as counter:
            with plan if plan is not None else nullcontext():
                loss = ex.loss()
            _backward(loss, backend)
            del loss
    ex.zero_grad()
    return prof, counter.flops


def backward_seconds(ex, backends, reps, plan=None) -> dict:
    """Median backward time per backend (the forward, under ``plan``, untimed;
    .grad None before each; one untimed warm-up per backend; backends interleaved).
    ``plan`` runs on every backend (``anywhere``)."""
    plan = anywhere(plan)
    times = {b: [] for b in backends}
    for rep in range(reps + 1):
        for b in backends:
            ex.zero_grad()
            with plan if plan is not None else nullcontext():
                loss = ex.loss()
            start = time.perf_counter()
            _backward(loss, b)
            elapsed = time.perf_counter() - start
            del loss
            if rep:
                times[b].append(elapsed)
    ex.zero_grad()
    return {b: statistics.median(ts) for b, ts in times.items()}


@dataclass
class Row:
    key: str                 # "none", "layer", ... or "plan 0.40", "plan 9712552"
    label: str
    peak: int                # measured on "python" (the measure budgets refer to)
    flops: int               # recompute FLOPs, measured
    witness_peak: int | None = None              # tracemalloc's, same run
    other_peaks: dict = field(default_factory=dict)   # backend -> measured peak
    times: dict = field(default_factory=dict)    # backend -> median seconds
    plan: object = None
    budget: object = None    # the budget the plan was asked for (fraction or bytes)

    @property
    def is_plan(self) -> bool:
        return self.plan is not None


def anywhere(plan):
    """``plan`` (a copy) whose backward may run on every backend: its budget holds
    on the backend it was made for ("python" here), which alone would refuse the
    others; this benchmark measures it elsewhere too (the peaks on "c", the times)."""
    if plan is None:
        return None
    plan = copy.copy(plan)
    plan._made_for = ANY_BACKEND
    return plan


def _measure(row, ex, plan, backends, reps, peak_backends):
    plan = anywhere(plan)
    for b in peak_backends:
        row.other_peaks[b] = measure_peak(ex, plan, backend=b)[0].peak_bytes
    if backends:
        row.times = backward_seconds(ex, backends, reps, plan)
    return row


def hand_row(name, sizes, key, backends=(), reps=0, witness=False, peak_backends=()) -> Row:
    """Measure a hand policy (a key of HAND_POLICIES) on the bundled model ``name``:
    the peak on "python" (and on ``peak_backends``), the FLOPs recomputed, and
    backward medians on ``backends``."""
    label, options = next((lab, o) for k, lab, o in HAND_POLICIES if k == key)
    ex = build(name, **sizes, **options)
    prof, flops = measure_peak(ex, witness=witness)
    row = Row(key, label, prof.peak_bytes, flops,
              prof.tracemalloc_peak_bytes if witness else None)
    return _measure(row, ex, None, backends, reps, peak_backends)


class Unreachable(Exception):
    """The planner found no plan for the budget (its message says the smallest peak);
    ``seconds``: how long plan_checkpoints took to say so (profiling included)."""

    def __init__(self, message, seconds=0.0):
        super().__init__(message)
        self.seconds = seconds


def plan_row(ex, budget, formulation="knapsack", backends=(), reps=0, witness=False,
             key=None, label=None, peak_backends=()) -> Row:
    """Plan ``ex.loss`` for ``budget`` and measure the plan as ``hand_row`` does."""
    start = time.perf_counter()
    try:
        plan = ca.memory.plan_checkpoints(ex.loss, budget=budget, formulation=formulation)
    except ValueError as e:
        if "no plan fits" not in str(e):
            raise
        raise Unreachable(str(e), time.perf_counter() - start) from None
    prof, counted = measure_peak(ex, plan, witness=witness)
    flops, _ = plan_graph_flops(plan, ex)
    if flops != plan.recompute_flops:
        raise AssertionError(f"plan at {budget}: the recipe nodes of its backward graph make "
                             f"{flops:,} FLOPs, plan.recompute_flops says "
                             f"{plan.recompute_flops:,}")
    # (On "python" the recipe nodes run under the backward's "gradient" category,
    # so the counter sees nothing; were they tagged "recomputed", it would see them.)
    assert counted in (0, flops), (counted, flops)
    key = key or (f"plan {budget:.2f}" if isinstance(budget, float) else f"plan {budget}")
    row = Row(key, label or key, prof.peak_bytes, flops,
              prof.tracemalloc_peak_bytes if witness else None, plan=plan, budget=budget)
    return _measure(row, ex, plan, backends, reps, peak_backends)


def dominated_by(row, hands) -> list:
    """The hand rows with both a lower measured peak and fewer recompute FLOPs."""
    return [h for h in hands if h.peak < row.peak and h.flops < row.flops]
