"""A memory plan: which values of one forward are kept and which are recomputed.

    plan = ca.memory.plan_checkpoints(loss_fn, *args, budget=0.5)   # backend "python"
    with plan:
        loss = loss_fn(*args)        # values in plan.recomputed are saved as recipes
    with ca.compiled_backward(backend=plan.backend):
        loss.backward()              # ... and recomputed, inline, where needed

A plan's budget holds on the backend it was made for (``plan.backend``; None:
a plain ``loss.backward()`` on the eager engine): a backward on another one is
refused (``autograd.recipe.check_backend``).

Under ``with plan:`` every prim call of the forward is checked against the
profiled forward (same prim, same input shapes, in the same order): a plan made
for one forward is refused for another, with the first difference named.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiled_autograd.autograd.recipe import ANY_BACKEND, RecipeRecorder, describe_backend
from compiled_autograd.planning.profile import signature_of


def _fmt(n) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


@dataclass
class Recomputed:
    """A value the plan recomputes."""
    index: int         # its prim call in the forward
    prim: str
    shape: tuple
    bytes: int         # its own storage (0: a view)
    flops: int
    node: str          # its node in the plan's backward graph


class MemoryPlan:
    """What ``plan_checkpoints`` chose, and the context that applies it."""

    def __init__(self, profile, simulation, budget_bytes, budget, formulation,
                 planning_seconds, candidates, backend=ANY_BACKEND):
        self.profile = profile
        self.simulation = simulation
        self.budget = budget
        self.budget_bytes = budget_bytes
        self.baseline_peak_bytes = profile.baseline_peak
        self.predicted_peak_bytes = simulation.peak
        self.recompute_flops = simulation.flops
        self.recompute_seconds = simulation.cost
        self.formulation = formulation
        self.planning_seconds = planning_seconds
        self.profiling_seconds = profile.seconds
        self.candidates = candidates
        values = profile.values
        self.recomputed = [Recomputed(i, values[i].prim, values[i].shape, values[i].nbytes,
                                      values[i].flops, simulation.node_of[i].name)
                           for i in sorted(simulation.recompute)]
        self._recompute = frozenset(simulation.recompute)
        self._active = []
        self.measured_peak_bytes = None   # set by plan_checkpoints (on its backend)
        # The backend whose backward the plan's recipes may run on (a plan made by
        # hand, ANY_BACKEND: any); plan_checkpoints' plans name theirs.
        self._made_for = backend

    @property
    def backend(self):
        """The backend the plan was made and measured for (None: the eager
        engine); its backward must run there."""
        return self.profile.backend if self._made_for is ANY_BACKEND else self._made_for

    @property
    def recomputed_storages(self) -> list:
        """The recomputed values with storage of their own (the others are views
        of them, recomputed for free): what ``candidates`` counts."""
        return [r for r in self.recomputed if r.bytes]

    @property
    def kept(self) -> list:
        """The forward values the plan keeps for the backward (prim call indices)."""
        return sorted(self.simulation.kept)

    @property
    def graph(self):
        """The backward graph the plan predicts (recomputation included)."""
        return self.simulation.graph

    def __repr__(self):
        return (f"MemoryPlan(budget={_fmt(self.budget_bytes)}, predicted_peak="
                f"{_fmt(self.predicted_peak_bytes)}, baseline_peak="
                f"{_fmt(self.baseline_peak_bytes)}, recomputed={len(self.recomputed)} values, "
                f"recompute_flops={self.recompute_flops:,})")

    # ------------------------------------------------------------ applying it

    def _check(self, index, prim, arrays, params):
        expected = self.profile.signature
        got = signature_of(prim, arrays)
        if index >= len(expected) or expected[index] != got:
            want = (f"{expected[index][0]} on shapes {_shapes(expected[index][1])}"
                    if index < len(expected) else "nothing (it had ended)")
            raise RuntimeError(
                f"memory plan: this forward is not the one the plan was made for: its prim "
                f"call #{index} is {got[0]} on shapes {_shapes(got[1])}, the profiled forward "
                f"called {want}. A plan fits one forward (the same prims on the same shapes, "
                "in the same order); make a new plan with ca.memory.plan_checkpoints for "
                "this one.")

    def __enter__(self):
        recorder = RecipeRecorder(self._recompute.__contains__, self._check,
                                  made_for=self._made_for)
        recorder.__enter__()
        self._active.append(recorder)
        return self

    def __exit__(self, exc_type, exc, tb):
        recorder = self._active.pop()
        recorder.__exit__(exc_type, exc, tb)
        expected = len(self.profile.signature)
        if exc_type is None and recorder.count != expected:
            raise RuntimeError(
                f"memory plan: this forward is not the one the plan was made for: it made "
                f"{recorder.count} prim calls, the profiled forward {expected}. Make a new "
                "plan with ca.memory.plan_checkpoints for this one.")
        return False

    # ------------------------------------------------------------ showing it

    def table(self) -> str:
        """The plan as text: budget, peaks, cost, and one row per recomputed value."""
        base = self.baseline_peak_bytes
        views = len(self.recomputed) - len(self.recomputed_storages)
        w = max([14] + [len(r.prim) for r in self.recomputed])     # the prim column
        rows = [f"memory plan ({self.formulation}) for {describe_backend(self.backend)}: "
                f"budget {_fmt(self.budget_bytes)} ({self.budget_bytes / base:.2f} of the "
                f"peak without a plan, {_fmt(base)}: fn as written, its own checkpoints "
                "included)",
                f"predicted peak {_fmt(self.predicted_peak_bytes)} "
                f"({self.predicted_peak_bytes / base:.2f}); forward "
                f"{_fmt(self.simulation.forward_peak)}, backward "
                f"{_fmt(self.simulation.backward_peak)}" + (
                    "" if self.measured_peak_bytes is None else
                    f"; measured {_fmt(self.measured_peak_bytes)} "
                    f"({self.measured_peak_bytes / base:.2f})"),
                f"recomputes {len(self.recomputed_storages)} of {self.candidates} candidate "
                "values (values with storage of their own)"
                + (f" and {views} views of them" if views else "") + ": "
                f"{self.recompute_flops:,} FLOPs (~{self.recompute_seconds * 1e3:.2f} ms at "
                "the reference rates); keeps "
                f"{len(self.kept)} values",
                f"profiling {self.profiling_seconds:.2f} s, planning "
                f"{self.planning_seconds:.3f} s", "",
                f"{'forward #':>9}  {'prim':<{w}} {'shape':<18} {'bytes':>11} {'FLOPs':>13}  "
                "backward graph node"]
        for r in self.recomputed:
            rows.append(f"{r.index:>9}  {r.prim:<{w}} {str(list(r.shape)):<18} {r.bytes:>11,} "
                        f"{r.flops:>13,}  {r.node}")
        return "\n".join(rows)


def _shapes(shapes) -> str:
    return ", ".join("scalar" if s is None else str(list(s)) for s in shapes) or "none"
