"""The Python code generator: golden sources, tracebacks into generated lines, no
user string in the code, generated code cached with its graph."""
import os
import traceback
from collections import Counter

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.examples import build

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _check_golden(request, name, text):
    path = os.path.join(GOLDEN, name)
    if request.config.getoption("--update-golden") or not os.path.exists(path):
        if not request.config.getoption("--update-golden"):
            pytest.fail(f"golden file {name} is missing: run pytest --update-golden and "
                        "review the diff")
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        expected = f.read()
    assert text == expected, f"generated code changed; if intended: pytest --update-golden"


def test_golden_two_layer_mlp(request):
    ex = build("mlp", layers=2, width=4, batch=3)
    g = ca.trace_backward(ex.loss())
    _check_golden(request, "mlp2_backward.py", g.code)
    _check_golden(request, "mlp2_graph.txt", str(g.graph) + "\n")


def test_golden_checkpointed_graph(request):
    ex = build("mlp", layers=2, width=4, batch=3, checkpoint="layer")
    g = ca.trace_backward(ex.loss())
    _check_golden(request, "mlp2_checkpointed_backward.py", g.code)


def test_default_backend_is_python_and_code_is_cached():
    ca.reset_compiled_autograd()
    x = ca.randn(3, 4, requires_grad=True)
    with ca.compiled_backward() as opts:
        (x.tanh() * 2).sum().backward()
        (x.tanh() * 2).sum().backward()
    assert opts.backend == "python"
    stats = ca.compiled_autograd_stats()
    assert stats["compiles"] == 1 and stats["cache_hits"] == 1
    (entry,) = [e for fam in ca.compiled.cache.families.values() for _, _, e in fam.entries]
    assert "def compiled_backward(inputs, sizes, scalars, hooks, packed_data):" in entry.fn.code


def test_traceback_shows_the_generated_line():
    x = ca.randn(3, requires_grad=True)

    def bad_hook(g):
        raise ValueError("boom")

    h = x * 2
    h.register_hook(bad_hook)
    with pytest.raises(ValueError) as err:
        with ca.compiled_backward(backend="python"):
            h.sum().backward()
    text = "".join(traceback.format_exception(err.value))
    assert "<compiled_autograd backward" in text
    assert "_h_tensor_pre_hook(hook, " in text  # the generated source line itself


def test_user_strings_never_reach_the_code():
    name = "Evil\nimport_os; os.system('x')#"
    cls = type(name, (ca.autograd.Function,), {
        "forward": staticmethod(lambda ctx, x: x * 2),
        "backward": staticmethod(lambda ctx, g: g * 2)})
    x = ca.randn(3, requires_grad=True)
    g = ca.trace_backward(cls.apply(x).sum())
    code = g.code
    assert "os.system" not in code and "\nimport_os" not in code
    assert "# Evil_import_os__os_system__x___Backward" in code
    compile(code, "<check>", "exec")  # still valid Python


def test_constants_go_through_globals():
    x = ca.randn(3, requires_grad=True)
    out = (x.double() * float("inf")).sum()
    code = ca.trace_backward(out).code
    assert "inf" not in code.replace("_c", "")  # non-finite floats are globals
    assert "astype(" in code and "dtype=_c" in code


def test_dynamic_sizes_in_generated_code():
    ca.reset_compiled_autograd()
    for batch in (3, 4, 5):
        ex = build("mlp", layers=2, width=8, batch=batch)
        ex.loss().backward()
        expected = [p.grad.numpy().copy() for p in ex.parameters()]
        ex.zero_grad()
        with ca.compiled_backward(backend="python"):
            ex.loss().backward()
        for e, p in zip(expected, ex.parameters()):
            np.testing.assert_array_equal(e, p.grad.numpy())
    (fam,) = ca.compiled.cache.families.values()
    code = fam.entries[-1][2].fn.code
    assert "sizes[" in code


def test_a_memory_plans_recomputation_is_accounted_as_recomputed():
    """Prim nodes that recompute a saved value (meta "recipe") call their kernel as
    ``_r_<prim>``: the same kernel, accounted as "recomputed" while profiling, as
    the planned schedule counts them."""
    ex = build("transformer", layers=2, d_model=32, heads=2, seq=16, batch=4, vocab=50)
    plan = ca.memory.plan_checkpoints(ex.loss, budget=0.7)
    for _ in range(2):      # the first backward captures and compiles: the second is measured
        ex.zero_grad()
        with plan:
            loss = ex.loss()
        g = ca.trace_backward(loss)
        with ca.memory.profile(tracemalloc_witness=False) as prof:
            with ca.compiled_backward(backend="python"):
                loss.backward()
    recipes = [n for n in g.graph.nodes if "recipe" in n.meta and n.target != "getitem"]
    assert recipes and all(f"{n.name} = _r_{n.target}(" in g.code for n in recipes)
    assert "_r_" not in ca.trace_backward(ex.loss()).code
    planned = Counter((s.target, s.allocated) for s in g.memory_schedule().steps
                      if s.recipe is not None and s.allocated)
    measured = Counter((e.name, e.bytes) for e in prof.timeline
                       if e.action == "alloc" and e.category == "recomputed")
    # (a reshape of a non-contiguous value copies: the plan counts it as a view)
    assert planned and not planned - measured
    assert {name for name, _ in measured} <= {n.target for n in recipes}
