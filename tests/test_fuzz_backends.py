"""Random programs (tests/fuzz_programs.py): every backend against eager autograd,
and eager against torch, on a fixed set of seeds. Each seed is a program of 6-30
ops over a pool of values (views, in-place ops, reductions, matmuls, indexing,
a custom Function) wrapped in one variant (checkpoint, saved-tensor hooks,
tensor hooks, offload, autograd.grad), run twice per backend (a compile, then a
cache hit on other values), and at three sizes in a row (dynamic shapes), and
under memory plans against itself without (``check_plan``). Bugs it found are
kept as named tests in test_c_backend.py, test_edge_semantics.py,
test_dynamic_shapes.py and test_memory_plan.py.

More seeds: ``python tests/fuzz_programs.py --count 2000 --torch`` (``--plans``:
under memory plans)."""
import numpy as np
import pytest

import fuzz_programs
from helpers import BACKENDS, torch

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")


def _variant(seed):
    return fuzz_programs.VARIANTS[seed % len(fuzz_programs.VARIANTS)]


@pytest.mark.parametrize("seed", range(60))
def test_backends_match_eager_in_float64(seed):
    with np.errstate(all="ignore"):
        problems = fuzz_programs.check(seed, _variant(seed), BACKENDS, np.float64,
                                       with_torch=torch is not None)
    assert not problems, f"\n{fuzz_programs.generate(seed)}\n" + "\n".join(problems)


@pytest.mark.parametrize("seed", range(1000, 1024))
def test_backends_match_eager_in_float32(seed):
    with np.errstate(all="ignore"):
        problems = fuzz_programs.check(seed, _variant(seed), BACKENDS, np.float32)
    assert not problems, f"\n{fuzz_programs.generate(seed)}\n" + "\n".join(problems)


@pytest.mark.parametrize("seed", range(2000, 2030))
def test_backends_match_eager_across_sizes(seed):
    # The program at its sizes, then 1 and 2 larger: with dynamic=True, and with
    # the sizes that changed made dynamic by the cache (fuzz_programs.check_dynamic).
    with np.errstate(all="ignore"):
        problems = fuzz_programs.check_dynamic(seed, _variant(seed), BACKENDS)
    if problems is None:
        pytest.skip("the program does not fit other sizes")
    assert not problems, f"\n{fuzz_programs.generate(seed)}\n" + "\n".join(problems)


def test_a_program_resizes():
    prog = fuzz_programs.generate(2001)
    bigger = fuzz_programs.resize(prog, 2)
    assert [name for name, _, _ in bigger.steps] == [name for name, _, _ in prog.steps]
    assert bigger.dims == tuple(n + 2 for n in prog.dims)
    assert [len(v.shape) for v in bigger.values] == [len(v.shape) for v in prog.values]
    assert bigger.values[0].shape != prog.values[0].shape


def test_the_comparison_fails_on_a_wrong_gradient():
    ours = {"v0": np.array([1.0, 2.0]), "v1": None}
    assert fuzz_programs.compare(ours, ours, 1e-10, 1e-12) is None
    off = {"v0": np.array([1.0, 2.0 + 1e-6]), "v1": None}
    assert "1 of 2 differ" in fuzz_programs.compare(off, ours, 1e-10, 1e-12)
    assert "None vs a gradient" in fuzz_programs.compare(
        {"v0": None, "v1": None}, ours, 1e-10, 1e-12)
    inf = {"v0": np.array([np.inf, np.nan]), "v1": None}
    assert fuzz_programs.compare(inf, inf, 1e-10, 1e-12) is None
    assert "1 of 2 differ" in fuzz_programs.compare({"v0": np.array([1.0, np.nan]), "v1": None},
                                                    inf, 1e-10, 1e-12)
    assert "float32" in fuzz_programs.compare(
        {"v0": np.array([1.0, 2.0], np.float32), "v1": None}, ours, 1e-10, 1e-12)


def test_a_program_shrinks_and_still_runs():
    prog = fuzz_programs.generate(3)
    assert len(prog.steps) >= 6 and prog.weights
    # Dropping steps keeps a valid program (the minimizer's move).
    smaller = fuzz_programs.without(prog, 0)
    assert len(smaller.steps) < len(prog.steps)
    grads = fuzz_programs.run(smaller, "ca", np.float64)
    assert any(g is not None for g in grads.values())


@pytest.mark.parametrize("seed", range(3000, 3022))   # (each of PLAN_VARIANTS twice)
def test_memory_plans_change_nothing(seed):
    # The program (in one of fuzz_programs.PLAN_VARIANTS) under memory plans --
    # the planner's for a random budget, one recomputing every value (its
    # backward inside ``with plan:``), one recomputing a random half (a backward
    # with retain_graph=True, then another) -- against itself without a plan, on
    # the eager engine and every backend: gradients bit for bit (within rtol 1e-5
    # on "c"), the same errors, hook calls and custom backward calls, and no
    # recipe alive after the backward (fuzz_programs.check_plan). ("c", whose
    # compiles make most of the time, on every other seed.)
    backends = BACKENDS if seed % 2 == 0 else tuple(b for b in BACKENDS if b != "c")
    with np.errstate(all="ignore"):
        problems = fuzz_programs.check_plan(seed, (None,) + backends)
    assert not problems, f"\n{fuzz_programs.generate(seed)}\n" + "\n".join(problems)


@pytest.mark.parametrize("seed", range(1633, 1639))
def test_memory_plans_change_nothing_in_float32(seed):
    # (1636: an amax whose input "c" recomputed, next to the forward's output)
    with np.errstate(all="ignore"):
        problems = fuzz_programs.check_plan(seed, (None,) + BACKENDS, np.float32)
    assert not problems, f"\n{fuzz_programs.generate(seed)}\n" + "\n".join(problems)


def test_the_plan_check_finds_a_stale_recipe(monkeypatch):
    # Program 0 writes a clone in place (setitem_mask) and saves it: a recipe
    # taken for the value written gives a wrong gradient, which the check sees.
    from compiled_autograd.autograd.recipe import RecipeRecorder

    def ignoring_versions(self, array):
        entry = self._made.get(id(array))
        return entry if entry is not None and entry[0]() is array else None
    monkeypatch.setattr(RecipeRecorder, "_entry", ignoring_versions)
    with np.errstate(all="ignore"):
        problems = fuzz_programs.check_plan(0, (None, "python"))
    assert any("engine, plan all: v0:" in p and "differ" in p for p in problems), problems
