"""The prim table: complete entries, and shape rules that agree with the kernels."""
import inspect
from pathlib import Path

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen.c_ops import EMITTERS, LAYOUTS
from compiled_autograd.codegen.c_run import compile_graph
from compiled_autograd.autograd.node import NODE_CLASSES, PrimBackward
from helpers import needs_cc
from op_cases import CASES, make_inputs
from compiled_autograd.runtime.lowering import Elementwise, Lowering
from compiled_autograd.runtime.prims import PRIMS, elementwise_meta, ops, prim, same_meta

TEMPLATES = Path(__file__).resolve().parent.parent / "codegen" / "templates" / "c"

FIELDS = ("name", "kernel", "meta", "save", "vjp", "view", "differentiable", "c",
          "index_params")


@pytest.mark.parametrize("name", sorted(PRIMS))
def test_every_prim_has_every_field(name):
    p = PRIMS[name]
    for field in FIELDS:
        assert hasattr(p, field), f"prim {name} lacks {field}"
    assert p.name == name and callable(p.kernel) and callable(p.meta)
    if p.differentiable:
        assert callable(p.vjp), f"differentiable prim {name} has no derivative"
        assert name in NODE_CLASSES and issubclass(NODE_CLASSES[name], PrimBackward)
    else:
        assert p.vjp is None and p.save == ()
    assert p.kernel.__doc__ or p.name, "kernels are documented where not obvious"
    # its C lowering: a record of a kind the C backend emits, a view exactly
    # when the prim is one, naming a template that exists
    assert isinstance(p.c, Lowering), f"prim {name} declares no C lowering (c=)"
    assert p.c.kind in EMITTERS, f"prim {name}: no C emitter for kind {p.c.kind!r}"
    assert (p.c.kind == "view") == p.view, name
    if p.view:
        assert p.c.options["layout"] in LAYOUTS, (name, p.c)
    templates = [p.c.template, p.c.options.get("rows_template")]
    for t in filter(None, templates):
        assert (TEMPLATES / t).is_file(), f"prim {name}: no template {t}"
    kernel_params = inspect.signature(p.kernel).parameters
    assert set(p.index_params) <= set(kernel_params), (name, p.index_params)


def test_a_prim_without_a_lowering_is_refused():
    with pytest.raises(TypeError, match="'c'"):
        prim("no_lowering", meta=same_meta)(lambda x: x)
    assert "no_lowering" not in PRIMS


@needs_cc
@pytest.mark.usefixtures("fresh_compiled_cache")
def test_a_new_elementwise_prim_lowers_from_its_entry_alone():
    """One block in the table is all a new elementwise prim needs: the C backend
    emits it from its record, with no change in codegen/. (The backward's mul
    node is retargeted to the new prim before the C backend compiles it.)"""
    @prim("mul_add_one", meta=elementwise_meta, differentiable=False,
          c=Elementwise("{{ a }} * {{ b }} + 1"))
    def mul_add_one(a, b):
        return np.asarray(a * b + 1)

    sources = []

    def backend(gm):
        graph = gm.graph
        for n in graph.nodes:
            if n.target == "mul":
                n.target = "mul_add_one"
        graph.lint()
        compiled = compile_graph(graph)
        sources.append(compiled.prog.source)
        return compiled
    try:
        x = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = ca.tensor([0.5, -1.0, 4.0])
        with ca.compiled_backward(backend=backend):
            (x * y).sum().backward()
    finally:
        del PRIMS["mul_add_one"]
        delattr(ops, "mul_add_one")
    assert "+ 1)" in sources[0]
    np.testing.assert_allclose(x.grad.numpy(), y.numpy() + 1)


@pytest.fixture
def meta_checked(monkeypatch):
    """Wrap every kernel so each call also checks meta(args) == result."""
    calls = {}

    def wrap(p, kernel):
        def checked(*args, **params):
            out = kernel(*args, **params)
            shape, dtype = p.meta(*args, **params)
            assert tuple(np.shape(out)) == tuple(shape), (p.name, np.shape(out), shape)
            assert np.asarray(out).dtype == dtype, (p.name, np.asarray(out).dtype, dtype)
            calls[p.name] = calls.get(p.name, 0) + 1
            return out
        return checked

    for p in PRIMS.values():
        monkeypatch.setattr(p, "kernel", wrap(p, p.kernel))
    return calls


def test_meta_rules_agree_with_kernels(meta_checked):
    for name, fn, specs in CASES:
        for dtype in (np.float32, np.float64):
            arrays, grads = make_inputs(specs, seed=1)
            inputs = [ca.tensor(a, dtype=dtype, requires_grad=True) if g else ca.from_numpy(a)
                      for a, g in zip(arrays, grads)]
            out = fn(ca, *inputs)
            diff = [t for t, g in zip(inputs, grads) if g]
            # create_graph: derivative formulas run as ops, so their prims are checked
            # too, and second derivatives exercise the derivatives' derivatives.
            gs = ca.autograd.grad(out.sum(), diff, create_graph=True)
            total = sum((g * g).sum() for g in gs if g is not None and g.requires_grad)
            if isinstance(total, ca.Tensor):
                ca.autograd.grad(total, diff, allow_unused=True)
    unused = sorted(set(PRIMS) - set(meta_checked))
    assert not unused, f"prims never exercised by the op table: {unused}"
