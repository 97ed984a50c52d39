"""The prim table: complete entries, and shape rules that agree with the kernels."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.autograd.node import NODE_CLASSES, PrimBackward
from op_cases import CASES, make_inputs
from runtime.prims import PRIMS

FIELDS = ("name", "kernel", "meta", "save", "vjp", "view", "differentiable", "c_template")


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


def test_prim_set_is_small():
    assert 30 <= len(PRIMS) <= 50, len(PRIMS)


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
