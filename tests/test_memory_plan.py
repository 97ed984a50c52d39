"""ca.memory.plan_checkpoints: recomputation as prims in the backward graph, chosen
for a memory budget. Gradients under a plan equal those without it; the predicted
peak is the measured one, to the byte; the planner's cost is compared with the
exhaustive optimum on small graphs; a plan adds no Python call on "c"."""
import contextlib
import gc
import itertools
import weakref

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen.c_run import CBackward
from compiled_autograd.autograd.recipe import ANY_BACKEND, Kept, describe_backend
from compiled_autograd.examples import build
from compiled_autograd.planning.plan import MemoryPlan
from compiled_autograd.planning.profile import profile_for_planning
from compiled_autograd.planning.simulate import needed_values, simulate
from compiled_autograd.planning.solve import solve
from helpers import BACKENDS, MLP, needs_cc

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")
F = ca.nn.functional


# "engine": the eager engine; the others: compiled_backward(backend=...)
MODES = ("engine",) + BACKENDS


def _backward(loss, backend):
    if backend == "engine":
        loss.backward()
    else:
        with ca.compiled_backward(backend=backend):
            loss.backward()


def _anywhere_plan(fn, *args, **kwargs):
    """plan_checkpoints' plan, its backward allowed on every backend: these tests
    check what recipes compute, not the budget, which holds on the plan's own
    backend (a backward elsewhere is refused: test_memory_plan_honest.py)."""
    plan = ca.memory.plan_checkpoints(fn, *args, **kwargs)
    plan._made_for = ANY_BACKEND
    return plan


def _grads(ex):
    out = [p.grad.numpy().copy() for p in ex.parameters()]
    ex.zero_grad()
    return out


def _measured_peak(plan, ex, backend="python"):
    """forward + backward under ``plan``, warm (the second run is measured), with
    every .grad None at the start (as the plan assumes: after zero_grad)."""
    fn = ex.loss
    for _ in range(2):
        ex.zero_grad()
        with ca.memory.profile(tracemalloc_witness=False) as prof:
            with plan:
                loss = fn()
            _backward(loss, backend)
            del loss
    return prof.peak_bytes


# (activations, not parameter gradients, make most of the peak: there is room to plan)
SMALL_TRANSFORMER = dict(layers=2, d_model=32, heads=2, seq=16, batch=4, vocab=50)
SMALL_MLP = dict(layers=4, width=32, batch=64, activation="gelu")
MODELS = [("transformer", SMALL_TRANSFORMER), ("mlp", SMALL_MLP)]


@pytest.mark.parametrize("name,sizes", MODELS)
@pytest.mark.parametrize("backend", MODES)
def test_gradients_under_a_plan_equal_those_without(name, sizes, backend):
    ex = build(name, **sizes)
    _backward(ex.loss(), "engine")
    expected = _grads(ex)
    plan = _anywhere_plan(ex.loss, budget=0.75)
    assert plan.recomputed and ex.parameters()[0].grad is None  # planning left no .grad
    for i in range(2):   # a miss, then a cache hit
        hits = ca.compiled_autograd_stats()["cache_hits"]
        with plan:
            loss = ex.loss()
        _backward(loss, backend)
        if i == 1 and backend != "engine":
            assert ca.compiled_autograd_stats()["cache_hits"] == hits + 1
        for g, e in zip(_grads(ex), expected):
            if backend == "c":
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
            else:
                assert np.array_equal(g, e)


@pytest.mark.parametrize("name,sizes", MODELS)
def test_predicted_peak_is_the_measured_peak_and_fits_the_budget(name, sizes):
    ex = build(name, **sizes)
    reached = 0
    for budget in (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2):
        try:
            plan = ca.memory.plan_checkpoints(ex.loss, budget=budget)
        except ValueError as e:
            assert "the smallest peak the planner reaches is" in str(e)
            continue
        reached += 1
        measured = _measured_peak(plan, ex)
        assert measured == plan.predicted_peak_bytes
        assert measured <= plan.budget_bytes == int(budget * plan.baseline_peak_bytes)
    assert reached >= 3


def test_the_backward_graph_recomputes_what_the_plan_says_as_prim_nodes():
    ex = build("transformer", **SMALL_TRANSFORMER)
    plan = _anywhere_plan(ex.loss, budget=0.6)
    with plan:
        loss = ex.loss()
    g = ca.trace_backward(loss)
    recomputed = {n.meta["recipe"]: n for n in g.graph.nodes if "recipe" in n.meta}
    assert {i: n.name for i, n in recomputed.items()} == {r.index: r.node
                                                         for r in plan.recomputed}
    assert all(n.op == "call_function" for n in recomputed.values())
    assert not [n for n in g.graph.nodes if n.op == "call_hook" and n.target != "accumulate_grad"]
    assert g.memory_schedule().peak_bytes == plan.simulation.schedule.peak_bytes
    table = plan.table()
    # Counted alike (issue 29, item 12: "recomputes 104 of 88 candidate values"):
    # values with storage of their own, the views of them apart.
    own = plan.recomputed_storages
    views = len(plan.recomputed) - len(own)
    assert views and len(own) <= plan.candidates
    assert plan.candidates == sum(1 for v in plan.profile.values if v.nbytes)
    assert "predicted peak" in table and (
        f"recomputes {len(own)} of {plan.candidates} candidate values (values with storage "
        f"of their own) and {views} views of them") in table
    assert all(r.node in table for r in plan.recomputed)


@needs_cc
def test_a_plan_adds_no_python_call_on_c():
    ex = build("transformer", **SMALL_TRANSFORMER)
    plan = _anywhere_plan(ex.loss, budget=0.6)
    with plan:
        loss = ex.loss()
    planned = CBackward(ca.trace_backward(loss).graph, build=False).prog
    plain = CBackward(ca.trace_backward(ex.loss()).graph, build=False).prog
    by_layer = CBackward(ca.trace_backward(build("transformer", checkpoint="layer",
                                                 **SMALL_TRANSFORMER).loss()).graph,
                         build=False).prog
    assert len(planned.sites) == len(plain.sites) == 0 < len(by_layer.sites)


def test_a_different_forward_is_refused_and_nothing_is_left_installed():
    ex = build("mlp", **MLP)
    plan = _anywhere_plan(ex.loss, budget=1.0)
    other = build("mlp", **dict(MLP, batch=MLP["batch"] + 1))
    with pytest.raises(RuntimeError, match=r"not the one the plan was made for: its prim "
                                           r"call #0 is linear on shapes"):
        with plan:
            other.loss()
    w = ca.tensor(np.ones((3, 4), np.float32), requires_grad=True)
    x = ca.tensor(np.ones((2, 4), np.float32))
    short = _anywhere_plan(lambda: F.linear(x, w).tanh().sum(), budget=1.0)
    with pytest.raises(RuntimeError, match=r"it made 1 prim calls, the profiled forward 3"):
        with short:
            F.linear(x, w)
    # nothing of the plan is left: a plain forward saves its values as they are
    from compiled_autograd.autograd import dispatch
    from compiled_autograd.autograd.saved_hooks import current_hooks
    assert current_hooks() is None and not dispatch._interceptors
    other.loss().backward()


def test_a_kept_value_modified_in_place_fails_as_a_saved_one_does():
    w = ca.tensor(np.linspace(-1, 1, 12).reshape(3, 4), requires_grad=True)
    x = ca.tensor(np.linspace(0, 1, 8).reshape(2, 4).astype(np.float32))

    def fn():   # x is read only by the recipe of tanh's output (nothing saves it)
        return ((x * 2) + w[0]).tanh().sum()
    plan = _anywhere_plan(fn, budget=10**9)   # (any plan: it is forced below)
    plan._recompute = frozenset(v.index for v in plan.profile.values)   # recompute all
    for backend in ("engine", "eager", "python"):
        with plan:
            loss = fn()
        with ca.no_grad():
            x.add_(1.0)
        with pytest.raises(RuntimeError, match=r"modified by an inplace operation: "
                                               r"\[ca.FloatTensor \[2, 4\]\] is at version \d; "
                                               r"expected version \d instead. Hint: the memory "
                                               r"plan recomputes mul"):
            _backward(loss, backend)


def test_budget_errors():
    ex = build("mlp", **MLP)
    with pytest.raises(TypeError, match="budget must be a float in"):
        ca.memory.plan_checkpoints(ex.loss, budget="half")
    with pytest.raises(ValueError, match=r"must be in \(0, 1\], got 1.5"):
        ca.memory.plan_checkpoints(ex.loss, budget=1.5)
    with pytest.raises(ValueError, match="must be positive"):
        ca.memory.plan_checkpoints(ex.loss, budget=0)
    with pytest.raises(ValueError, match=r"no plan fits a budget of 10 bytes \(0.01 of the "
                                           r"peak .*the smallest peak the planner reaches is"):
        ca.memory.plan_checkpoints(ex.loss, budget=10)
    with pytest.raises(RuntimeError, match="fn must return a scalar loss"):
        ca.memory.plan_checkpoints(lambda: ca.ones(3), budget=0.5)


# ------------------------------------------------------------- against the optimum

def _small_programs():
    rng = np.random.default_rng(0)

    def param(*shape):
        return ca.tensor(rng.standard_normal(shape) * 0.3, requires_grad=True)
    x = ca.tensor(rng.standard_normal((256, 32)))
    w1, w2, w3 = param(48, 32), param(48, 48), param(16, 48)

    def chain():      # linear -> tanh -> linear -> gelu -> linear -> tanh -> linear
        h = F.linear(x, w1).tanh()
        h = F.gelu(F.linear(h, w2))
        h = F.linear(h, w2).tanh()
        y = F.linear(h, w3)
        return (y * y).sum()

    def residual():   # a pre-LayerNorm residual block, twice
        h = F.linear(x, w1)
        for _ in range(2):
            h = h + F.gelu(F.linear(F.layer_norm(h, (48,)), w2))
        return F.linear(h, w3).tanh().sum()
    return {"chain": chain, "residual": residual}


@pytest.mark.parametrize("program", ["chain", "residual"])
@pytest.mark.parametrize("formulation", ["knapsack", "mincut"])
def test_the_planners_cost_is_within_ten_percent_of_the_exhaustive_optimum(program,
                                                                          formulation):
    fn = _small_programs()[program]
    profile = profile_for_planning(fn, (), {}, "python")
    candidates = [v.index for v in profile.values]
    assert 8 <= len(candidates) <= 16
    plans = {}
    for k in range(len(candidates) + 1):
        for subset in itertools.combinations(candidates, k):
            recompute = needed_values(profile, frozenset(subset))[0]
            if recompute not in plans:
                plans[recompute] = simulate(profile, recompute)
    base = profile.baseline_peak
    lowest = min(s.peak for s in plans.values())
    assert lowest < 0.8 * base
    checked = 0
    for fraction in np.linspace(lowest / base, 1.0, 7):
        budget = int(fraction * base)
        optimum = min(s.cost for s in plans.values() if s.peak <= budget)
        chosen, _, _, _ = solve(profile, budget, formulation)
        if formulation == "mincut" and chosen is None:
            continue   # min-cut plans are a subset: it may miss a tight budget
        assert chosen is not None and chosen.peak <= budget
        assert chosen.cost >= optimum - 1e-15   # (the exhaustive search saw it too)
        if formulation == "knapsack":   # (min-cut minimizes bytes, not cost: compared only)
            assert chosen.cost <= optimum * 1.10 + 1e-12, (fraction, chosen.cost, optimum)
        checked += 1
    assert checked >= (6 if formulation == "knapsack" else 2)


@pytest.mark.parametrize("backend", MODES)
def test_dropout_masks_are_kept_and_planning_leaves_the_generator_as_it_was(backend):
    rng = np.random.default_rng(0)
    w = ca.tensor(rng.standard_normal((16, 8)).astype(np.float32), requires_grad=True)
    x = ca.tensor(rng.standard_normal((32, 8)).astype(np.float32))

    def fn():
        return (F.gelu(F.dropout(F.linear(x, w).tanh(), p=0.5)) * 3).sum()
    ca.manual_seed(5)
    fn().backward()
    expected, w.grad = w.grad.numpy().copy(), None
    ca.manual_seed(5)
    plan = _anywhere_plan(fn, budget=10**9)
    plan._recompute = frozenset(v.index for v in plan.profile.values)   # recompute all
    with plan:      # (the generator is where planning found it: the same mask)
        loss = fn()
    _backward(loss, backend)
    if backend == "c":
        np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-5, atol=1e-5)
    else:
        assert np.array_equal(w.grad.numpy(), expected)


@pytest.mark.parametrize("backend", [None] + [b for b in BACKENDS if b != "python"])
def test_on_other_backends_the_plan_is_measured_and_fits_the_budget(backend):
    """The simulation is the "python" backend's schedule; the eager engine
    (None), the interpreter and the C backend (its arena, its inputs held to the
    end) are measured."""
    ex = build("transformer", **SMALL_TRANSFORMER)
    plan = ca.memory.plan_checkpoints(ex.loss, budget=0.8, backend=backend)
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert _measured_peak(plan, ex, backend or "engine") == plan.measured_peak_bytes
    table = plan.table()
    assert f"measured {plan.measured_peak_bytes / 2**10:.2f} KiB" in table
    assert f"for {describe_backend(backend)}: budget" in table and "None" not in \
        table.replace("backend=None", "")


@pytest.mark.parametrize("backend", MODES)
def test_a_value_modified_in_place_in_the_forward_is_saved_as_it_is(backend):
    """A recipe makes a value as a prim call made it: once an in-place op changed
    the value (or a view of its storage), no recipe stands for it."""
    w = ca.tensor(np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32), requires_grad=True)

    def fn():
        y = (w * 1.5) + 0.5       # (add saves nothing: the in-place ops are allowed)
        y.mul_(2.0)
        y[0].add_(1.0)            # through a view: the same storage
        return (y.sin() * F.gelu(y)).sum()
    fn().backward()
    expected, w.grad = w.grad.numpy().copy(), None
    plan = _anywhere_plan(fn, budget=10**9)
    plan._recompute = frozenset(v.index for v in plan.profile.values)   # recompute all
    with plan:
        loss = fn()
    _backward(loss, backend)
    if backend == "c":
        np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-5, atol=1e-6)
    else:
        assert np.array_equal(w.grad.numpy(), expected)


# ------------------------------------------------- recipes and what the forward does
# (found by the plan variant of the random programs, tests/fuzz_programs.py)

def _forced_plan(fn, keep=()):
    """A plan for ``fn`` that recomputes every value but those made by the prims
    named in ``keep`` (whatever its peak)."""
    profile = profile_for_planning(fn, (), {}, "python")
    recompute = frozenset(v.index for v in profile.values if v.prim not in keep)
    simulation = simulate(profile, recompute)
    plan = MemoryPlan(profile, simulation, simulation.peak, 1.0, "knapsack", 0.0,
                      len(profile.values))
    plan._recompute = recompute
    return plan


def _leaf_grads(fn, leaves, plan=None, backend="eager", inside=False):
    """The leaves' gradients of ``fn()``'s backward (under ``plan``; ``inside``:
    the backward too runs inside ``with plan:``), or the error it raised."""
    for t in leaves:
        t.grad = None
    try:
        if plan is None:
            _backward(fn(), backend)
        else:
            with plan:
                loss = fn()
                if inside:
                    _backward(loss, backend)
            if not inside:
                _backward(loss, backend)
    except RuntimeError as e:
        return str(e)
    return [t.grad.numpy().copy() for t in leaves]


def _assert_same(got, want, backend):
    assert type(got) is type(want), (got, want)
    if isinstance(want, str):
        assert got == want
        return
    for g, e in zip(got, want):
        if backend == "c":
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-12)
        else:
            assert np.array_equal(g, e)


def _parts():
    rng = np.random.default_rng(1)
    w = ca.tensor(rng.standard_normal((4, 4)), requires_grad=True, dtype=np.float64)
    x = ca.tensor(rng.standard_normal((3, 4)), dtype=np.float64)
    return w, x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("write", ["base", "view", "mask"])
def test_a_value_written_in_place_is_saved_as_it_is_not_as_its_recipe(backend, write):
    # The recipe of a value makes the value its prim made. Written in place since
    # (b.mul_, b[0].mul_, b[mask] = 0), the value saved later (by b * w[0]) is
    # another: recomputing it from the recipe gave a wrong gradient, silently.
    w, x = _parts()
    mask = ca.from_numpy(np.arange(12).reshape(3, 4) % 3 == 0)

    def fn():
        b = F.linear(x, w).clone()
        if write == "base":
            b.mul_(3.0)
        elif write == "view":
            b[0].mul_(3.0)
        else:
            b[mask] = 0.0
        return (b * w[0]).sum()
    want = _leaf_grads(fn, [w])
    _assert_same(_leaf_grads(fn, [w], _forced_plan(fn), backend), want, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_saved_value_modified_in_place_fails_as_without_a_plan(backend):
    # A value saved as its recipe and then modified in place: without a plan the
    # backward fails (the value it saved changed); with one it used to give the
    # gradient of the value before the change instead.
    w, x = _parts()

    def fn(modify=True):
        h = F.linear(x, w)
        y = h.sin()              # saves h (as its recipe, under the plan)
        if modify:
            h.add_(1.0)
        return (y + h).sum()
    plan = _forced_plan(lambda: fn(modify=False))   # (add_ is no prim call of the plan's)
    got = _leaf_grads(fn, [w], plan, backend)
    assert isinstance(got, str) and got.startswith(
        "one of the variables needed for gradient computation has been modified by an "
        "inplace operation: [ca.DoubleTensor [3, 4]]")
    assert "is at version 1; expected version 0 instead. Hint: the backward of SinBackward " \
           "needs this value" in got
    assert got.replace(", which is output 0 of AddBackward,", "") == \
        _leaf_grads(fn, [w], None, backend).replace(", which is output 0 of AddBackward,", "")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kept_value_written_in_place_during_the_forward_is_copied_for_its_recipes(backend):
    # h is kept, the recipe of exp(h * 2) reads it; the forward then writes h in
    # place. Without a plan nothing saved h: the backward runs. The plan must not
    # make it fail: the recipe keeps a copy of what it read (it used to fail the
    # version check in the backward).
    w, x = _parts()

    def fn():
        h = F.linear(x, w)
        y = (h * 2.0).exp()
        h.mul_(3.0)
        return (y + h).sum()
    plan = _forced_plan(fn, keep=("linear",))
    _assert_same(_leaf_grads(fn, [w], plan, backend), _leaf_grads(fn, [w]), backend)


class _Square(ca.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * a

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return g * 2.0 * a


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inside", ["function", "hook", "checkpoint"])
def test_a_backward_inside_the_plans_context(backend, inside):
    # ``with plan: loss = fn(); loss.backward()``: the prims the backward calls
    # (a custom Function's backward, a tensor hook, a checkpoint's recomputation)
    # are not the forward's; they were taken for a forward other than the
    # plan's ("its prim call #4 is mul ..., the profiled forward called nothing").
    w, x = _parts()

    def fn():
        h = F.linear(x, w).tanh()
        if inside == "function":
            return _Square.apply(h).sum()
        if inside == "hook":
            h.register_hook(lambda g: g * 0.5)
            return (h * h).sum()
        h = ca.utils.checkpoint.checkpoint(lambda a: (a * w[0]).exp(), h, use_reentrant=False)
        return (h * h).sum()
    plan = _forced_plan(fn)
    want = _leaf_grads(fn, [w], None, backend)
    _assert_same(_leaf_grads(fn, [w], plan, backend, inside=True), want, backend)


def test_dropout_of_a_0d_tensor_under_memory_accounting():
    # Its mask was a numpy scalar, not an array: ca.memory.profile() (and so
    # plan_checkpoints, which profiles) raised "cannot create weak reference to
    # 'numpy.float32' object".
    x = ca.tensor(2.0, requires_grad=True)
    with ca.memory.profile(tracemalloc_witness=False):
        y = F.dropout(x * 1.0, 0.3)
    assert type(y._data) is np.ndarray and y.shape == ()
    y.backward()
    assert x.grad.item() in (0.0, np.float32(1 / 0.7))

def test_values_saved_as_they_are_are_freed_after_their_last_use_in_the_prediction():
    # A value written in place is saved as it is, and the forward's own
    # saved-tensor hooks hold what they pack: the backward frees both after
    # their last use. The prediction kept them to the end of the backward, above
    # the peak without a plan: budget=1.0 raised "no plan fits".
    rng = np.random.default_rng(2)
    w = ca.tensor(rng.standard_normal((64, 64)), requires_grad=True)
    x = ca.tensor(rng.standard_normal((32, 64)))

    def fn():
        with ca.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            h = F.linear(x, w).tanh()
        b = F.gelu(F.linear(x, w))
        b.mul_(2.0)
        return (F.linear(h, w).tanh() * b).sum()
    plan = _anywhere_plan(fn, budget=1.0)
    assert plan.predicted_peak_bytes <= plan.baseline_peak_bytes
    w.grad = None
    for _ in range(2):
        with ca.memory.profile(tracemalloc_witness=False) as prof:
            with plan:
                loss = fn()
            _backward(loss, "python")
            del loss
        w.grad = None
    assert prof.peak_bytes == plan.predicted_peak_bytes


def test_a_plan_in_one_thread_leaves_other_threads_forwards_alone():
    import threading
    ex = build("mlp", **SMALL_MLP)
    other = build("mlp", **dict(SMALL_MLP, batch=SMALL_MLP["batch"] + 3))
    plan = _anywhere_plan(ex.loss, budget=10**9)
    entered, done, errors = threading.Event(), threading.Event(), []

    def elsewhere():
        entered.wait()
        try:
            other.loss().backward()     # not the planned forward: no plan here
        except Exception as e:          # noqa: BLE001 (reported below)
            errors.append(e)
        done.set()
    t = threading.Thread(target=elsewhere)
    t.start()
    with plan:
        entered.set()
        done.wait()
        loss = ex.loss()
    t.join()
    assert not errors and all(p.grad is not None for p in other.parameters())
    loss.backward()


@pytest.mark.parametrize("backend", MODES)
def test_what_a_plan_keeps_goes_through_the_hooks_around_it(backend):
    ex = build("mlp", **SMALL_MLP)
    _backward(ex.loss(), "engine")
    expected = _grads(ex)
    plan = _anywhere_plan(ex.loss, budget=0.8)
    with ca.autograd.graph.save_on_disk():
        with plan:
            loss = ex.loss()
    kinds, stack = set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None:
            continue
        for item in getattr(fn, "saved", ()):
            for sv in item if isinstance(item, tuple) else (item,):
                if hasattr(sv, "packed_kind"):
                    kinds.add(sv.packed_kind)
        stack.extend(f for f, _ in fn.next_functions)
    assert kinds == {"recipe", "offload"}
    _backward(loss, backend)
    for g, e in zip(_grads(ex), expected):
        if backend == "c":
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
        else:
            assert np.array_equal(g, e)


# ------------------------------------------------- the bundled models, more ways

def _run(ex, plan, backend, how="backward"):
    """The parameters' gradients of one forward (under ``plan`` unless None) and
    backward: "backward", "twice" (retain_graph=True, then again: accumulated)
    or "grad" (ca.autograd.grad of the loss, .grad untouched)."""
    ex.zero_grad()
    params = ex.parameters()
    with plan if plan is not None else contextlib.nullcontext():
        loss = ex.loss()
    with ca.compiled_backward(backend=backend) if backend != "eager" \
            else contextlib.nullcontext():
        if how == "grad":
            grads = ca.autograd.grad(loss, params)
            assert all(p.grad is None for p in params)
            return [g.numpy().copy() for g in grads]
        if how == "twice":
            loss.backward(retain_graph=True)
        loss.backward()
    return _grads(ex)


def _assert_grads_equal(got, want, backend):
    for g, e in zip(got, want):
        if backend == "c":
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
        else:
            assert np.array_equal(g, e)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["twice", "grad"])
def test_a_second_backward_and_autograd_grad_under_a_plan(backend, how):
    ex = build("mlp", **SMALL_MLP)
    want = _run(ex, None, backend, how)
    plan = _anywhere_plan(ex.loss, budget=0.75)
    assert plan.recomputed
    _assert_grads_equal(_run(ex, plan, backend, how), want, backend)


@pytest.mark.parametrize("sizes", [dict(checkpoint="layer"), dict(checkpoint="selective"),
                                   dict(offload=True)], ids=["layer", "selective", "offload"])
def test_plans_over_checkpointed_and_offloaded_models(sizes):
    # A budget of 1.0 fits (recomputing nothing is the run without a plan): the
    # simulation, blind to a checkpoint's saved inputs and a selective
    # checkpoint's cache, put the peak of keeping everything at 1.03 and 1.49 of
    # the measured one, and plan_checkpoints raised "no plan fits".
    ex = build("transformer", **SMALL_TRANSFORMER, **sizes)
    plan = _anywhere_plan(ex.loss, budget=1.0)
    assert plan.predicted_peak_bytes <= plan.baseline_peak_bytes
    forced = _anywhere_plan(ex.loss, budget=1.0)
    forced._recompute = frozenset(v.index for v in forced.profile.values)
    for backend in ("eager", "python"):   # ("c": in the random programs, for time)
        want = _run(ex, None, backend)
        for p in (plan, forced):
            _assert_grads_equal(_run(ex, p, backend), want, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("retain", [False, True])
def test_a_plans_recipes_and_kept_arrays_are_freed_with_the_graph(backend, retain):
    # No reference cycle (the collector is off): after a backward without
    # retain_graph, or once the loss is dropped, every recipe and every kept
    # array that is not a parameter or an input is freed.
    from fuzz_programs import _watching_recipes
    ex = build("mlp", **SMALL_MLP)
    plan = _anywhere_plan(ex.loss, budget=0.75)
    forced = _forced_plan(ex.loss, keep=("linear",))   # (the activations read them)
    outside = {id(t._data) for t in ex.parameters() + list(ex.inputs.values())}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for p in (plan, forced):
            ex.zero_grad()
            with _watching_recipes() as made:
                with p:
                    loss = ex.loss()
            kept = [weakref.ref(k.data) for r in made if r() is not None for k in r().inputs
                    if type(k) is Kept and id(k.data) not in outside]
            assert made and (kept or p is plan)
            _backward_retaining(loss, backend, retain)
            if retain:
                assert any(r() is not None for r in made)   # (the graph is alive)
                del loss
            assert not [r for r in made if r() is not None]
            assert not [k for k in kept if k() is not None]
            if not retain:
                del loss
    finally:
        if enabled:
            gc.enable()


def _backward_retaining(loss, backend, retain):
    with ca.compiled_backward(backend=backend) if backend != "eager" \
            else contextlib.nullcontext():
        loss.backward(retain_graph=retain)


def test_hooks_around_a_plan_get_the_values_it_keeps():
    # Saved-tensor hooks around ``with plan:`` (save_on_disk, a user's): the
    # values the plan does not recompute are theirs, as without the plan. The
    # plan's pack saved them as they are instead, past the hooks.
    w, x = _parts()

    def fn():
        return F.linear(x, w).tanh().exp().sum()
    calls = []

    def hooks():
        return ca.autograd.graph.saved_tensors_hooks(
            lambda t: calls.append("pack") or t, lambda t: calls.append("unpack") or t)
    with hooks():
        loss = fn()
    loss.backward()
    want, calls[:] = list(calls), []
    keep_all = _anywhere_plan(fn, budget=1.0)
    assert not keep_all.recomputed
    with hooks():
        with keep_all:
            loss = fn()
    loss.backward()
    assert calls == want == ["pack"] * 3 + ["unpack"] * 3
    calls[:] = []
    forced = _forced_plan(fn, keep=("linear",))   # (tanh and exp: recipes, not packed)
    with hooks():
        with forced:
            loss = fn()
    loss.backward()
    assert calls == ["pack", "unpack"]
    for backend in BACKENDS:
        want = _leaf_grads(fn, [w], None, backend)
        with ca.autograd.graph.save_on_disk():
            _assert_same(_leaf_grads(fn, [w], forced, backend), want, backend)


def test_disabled_saved_tensor_hooks_inside_a_plan():
    # A forward that disables saved-tensor hooks for a stretch (against a user's
    # hooks) runs under a plan: a plan's recipes are not a user's hooks. It
    # raised the forward's own message, in plan_checkpoints.
    w, x = _parts()

    def fn():
        h = F.linear(x, w)
        with ca.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
            h = h.tanh().exp()
        return h.sum()
    want = _leaf_grads(fn, [w])
    plan = _anywhere_plan(fn, budget=1.0)
    _assert_same(_leaf_grads(fn, [w], plan), want, "eager")
    _assert_same(_leaf_grads(fn, [w], _forced_plan(fn)), want, "eager")
    with pytest.raises(RuntimeError, match="no hooks here"):   # (a user's still fail)
        with ca.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            fn()


def test_a_plan_does_not_record_another_threads_prims():
    # Prim calls are intercepted process-wide: another thread's forward, while a
    # plan's runs, was taken for the plan's ("this forward is not the one the
    # plan was made for: its prim call #1 is mul on shapes [5, 5]").
    import threading
    w, x = _parts()

    def fn():
        return F.linear(x, w).tanh().exp().sum()
    want = _leaf_grads(fn, [w])
    plan = _forced_plan(fn)
    v = ca.tensor(np.linspace(0, 1, 25).reshape(5, 5), requires_grad=True)
    inside, done, errors = threading.Event(), threading.Event(), []

    def other():
        inside.wait()
        try:
            (v * 2.0).sin().sum().backward()
        except Exception as e:   # noqa: BLE001
            errors.append(e)
        done.set()
    thread = threading.Thread(target=other)
    thread.start()
    w.grad = None
    with plan:
        h = F.linear(x, w)
        inside.set()
        done.wait(30)
        loss = h.tanh().exp().sum()
    loss.backward()
    thread.join()
    assert not errors
    np.testing.assert_allclose(v.grad.numpy(), 2.0 * np.cos(2.0 * v.detach().numpy()), rtol=1e-6)
    _assert_same([w.grad.numpy()], want, "eager")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_amax_is_recomputed_with_its_input(backend):
    # amax's backward finds the maxima by comparing its input with its output.
    # Input recomputed, output kept: on "c" the input comes from C's tanh, the
    # output from the forward's numpy tanh; where they differed by a rounding no
    # element matched and the gradient was 0 / 0 (NaN). The output is now
    # recomputed with its input (found by the plan variant of the random
    # programs, program 1636 in float32).
    rng = np.random.default_rng(3)
    w = ca.tensor(rng.standard_normal((64, 64)) * 0.3, requires_grad=True, dtype=np.float64)
    x = ca.tensor(rng.standard_normal((64, 64)), dtype=np.float64)

    def fn():
        h = F.linear(x, w).tanh()
        return (h.amax(1) * h.sum(1)).sum()
    plan = _forced_plan(fn, keep=("amax",))
    assert any(r.prim == "amax" for r in plan.recomputed)   # (the planner knows it too)
    with plan:
        loss = fn()
    assert "amax" in {n.target for n in ca.trace_backward(loss).graph.nodes
                      if "recipe" in n.meta}
    _assert_same(_leaf_grads(fn, [w], plan, backend), _leaf_grads(fn, [w], None, backend),
                 backend)
