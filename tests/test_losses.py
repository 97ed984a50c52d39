"""The loss modules and functional losses against torch (value and gradients of the
input, and of the target where torch differentiates it, every option), gradcheck in
float64, every backend, and torch's errors."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import compiled_autograd as ca
from helpers import BACKENDS, needs_torch, torch

RNG = np.random.default_rng(0)
N, C = 5, 4


def _x(shape=(N, C)):
    return RNG.standard_normal(shape)


def _prob(shape=(N, C)):
    return RNG.uniform(0.05, 0.95, shape)


def _idx(shape=(N,), ignore=False, classes=C):
    t = RNG.integers(0, classes, shape)
    if ignore:
        t.reshape(-1)[::3] = -100
    return t


def _probs_target(shape=(N, C)):
    p = RNG.uniform(0.0, 1.0, shape)
    return p / p.sum(1, keepdims=True)


W = RNG.uniform(0.2, 2.0, C)
PW = RNG.uniform(0.5, 3.0, C)

# name, module name, kwargs (arrays become tensors), input, target, target differentiable
CASES = []
for red in ("mean", "sum", "none"):
    CASES += [
        ("mse", "MSELoss", dict(reduction=red), _x(), _x(), True),
        ("l1", "L1Loss", dict(reduction=red), _x(), _x(), True),
        ("smooth_l1", "SmoothL1Loss", dict(reduction=red), _x(), _x(), True),
        ("smooth_l1_beta", "SmoothL1Loss", dict(reduction=red, beta=0.3), _x(), _x(), True),
        ("smooth_l1_beta0", "SmoothL1Loss", dict(reduction=red, beta=0.0), _x(), _x(), True),
        ("huber", "HuberLoss", dict(reduction=red), _x(), _x(), True),
        ("huber_delta", "HuberLoss", dict(reduction=red, delta=0.4), _x(), _x(), True),
        ("nll", "NLLLoss", dict(reduction=red), _x(), _idx(), False),
        ("nll_w_ignore", "NLLLoss", dict(reduction=red, weight=W, ignore_index=-100), _x(),
         _idx(ignore=True), False),
        ("nll_ignore2", "NLLLoss", dict(reduction=red, ignore_index=2), _x(), _idx(), False),
        ("ce", "CrossEntropyLoss", dict(reduction=red), _x(), _idx(), False),
        ("ce_w", "CrossEntropyLoss", dict(reduction=red, weight=W), _x(), _idx(), False),
        ("ce_ignore", "CrossEntropyLoss", dict(reduction=red), _x(), _idx(ignore=True), False),
        ("ce_smooth", "CrossEntropyLoss", dict(reduction=red, label_smoothing=0.2), _x(),
         _idx(), False),
        ("ce_all", "CrossEntropyLoss", dict(reduction=red, weight=W, label_smoothing=0.1,
                                            ignore_index=-100), _x(), _idx(ignore=True), False),
        ("ce_3d", "CrossEntropyLoss", dict(reduction=red, weight=W, label_smoothing=0.1),
         _x((2, C, 3)), _idx((2, 3), ignore=True), False),
        ("ce_unbatched", "CrossEntropyLoss", dict(reduction=red, label_smoothing=0.1),
         _x((C,)), np.array(2), False),
        ("ce_probs", "CrossEntropyLoss", dict(reduction=red), _x(), _probs_target(), True),
        ("ce_probs_all", "CrossEntropyLoss", dict(reduction=red, weight=W,
                                                  label_smoothing=0.3), _x(),
         _probs_target(), True),
        ("bce", "BCELoss", dict(reduction=red), _prob(), _prob(), True),
        ("bce_w", "BCELoss", dict(reduction=red, weight=W), _prob(), _prob(), True),
        ("bce_logits", "BCEWithLogitsLoss", dict(reduction=red), _x() * 3, _prob(), True),
        ("bce_logits_w", "BCEWithLogitsLoss", dict(reduction=red, weight=W, pos_weight=PW),
         _x() * 3, _prob(), True),
        ("bce_logits_pw", "BCEWithLogitsLoss", dict(reduction=red, pos_weight=PW),
         np.concatenate([_x((N - 1, C)) * 40, np.zeros((1, C))]), _prob(), True),
    ]
IDS = [f"{c[0]}-{c[2]['reduction']}" for c in CASES]
FUNCTIONAL = {"MSELoss": "mse_loss", "L1Loss": "l1_loss", "SmoothL1Loss": "smooth_l1_loss",
              "HuberLoss": "huber_loss", "NLLLoss": "nll_loss",
              "CrossEntropyLoss": "cross_entropy", "BCELoss": "binary_cross_entropy",
              "BCEWithLogitsLoss": "binary_cross_entropy_with_logits"}


def _kwargs(lib, kwargs, dtype):
    def conv(v):
        if not isinstance(v, np.ndarray):
            return v
        return ca.from_numpy(v.astype(dtype)) if lib is ca else torch.from_numpy(v.astype(dtype))
    return {k: conv(v) for k, v in kwargs.items()}


def _inputs(lib, x, t, t_grad, dtype):
    mk = ca.from_numpy if lib is ca else torch.from_numpy
    xi = mk(x.astype(dtype)).requires_grad_()
    ti = mk(t.astype(dtype) if t.dtype.kind == "f" else t.astype(np.int64))
    if t_grad:
        ti.requires_grad_()
    return xi, ti


def _run(lib, module, kwargs, x, t, t_grad, dtype, functional=False, backend="eager"):
    xi, ti = _inputs(lib, x, t, t_grad, dtype)
    kw = _kwargs(lib, kwargs, dtype)
    if functional:
        out = getattr(lib.nn.functional, FUNCTIONAL[module])(xi, ti, **kw)
    else:
        out = getattr(lib.nn, module)(**kw)(xi, ti)
    seed = np.linspace(0.5, 1.5, int(np.prod(out.shape))).reshape(out.shape).astype(dtype)
    seeded = (out * (ca.from_numpy(seed) if lib is ca else torch.from_numpy(seed))).sum()
    ctx = (contextlib.nullcontext() if lib is torch or backend == "eager"
           else ca.compiled_backward(backend=backend))
    with ctx:
        seeded.backward()
    grads = [xi.grad.numpy()] + ([ti.grad.numpy()] if t_grad else [])
    return out.detach().numpy(), grads


@needs_torch
@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
@pytest.mark.parametrize("name,module,kwargs,x,t,t_grad", CASES, ids=IDS)
def test_follows_torch(name, module, kwargs, x, t, t_grad, functional):
    if functional and module == "HuberLoss" and "weight" in kwargs:
        pytest.skip("no weight")
    ours, our_grads = _run(ca, module, kwargs, x, t, t_grad, np.float32, functional)
    theirs, their_grads = _run(torch, module, kwargs, x, t, t_grad, np.float32, functional)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    for a, b in zip(our_grads, their_grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("name,module,kwargs,x,t,t_grad", CASES, ids=IDS)
def test_follows_torch_float64(name, module, kwargs, x, t, t_grad):
    ours, our_grads = _run(ca, module, kwargs, x, t, t_grad, np.float64)
    theirs, their_grads = _run(torch, module, kwargs, x, t, t_grad, np.float64)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    for a, b in zip(our_grads, their_grads):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,module,kwargs,x,t,t_grad",
                         [c for c in CASES if c[2]["reduction"] == "mean"],
                         ids=[i for i, c in zip(IDS, CASES) if c[2]["reduction"] == "mean"])
def test_gradcheck(name, module, kwargs, x, t, t_grad):
    if name == "bce_logits_pw":   # (the logits of +-40: central differences lose it)
        x = np.clip(x, -3, 3)
    xi, ti = _inputs(ca, x, t, t_grad, np.float64)
    loss = getattr(ca.nn, module)(**_kwargs(ca, kwargs, np.float64))
    inputs = (xi, ti)
    assert ca.autograd.gradcheck(lambda a, b: loss(a, b), inputs)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "eager"])
@pytest.mark.parametrize("name,module,kwargs,x,t,t_grad",
                         [c for c in CASES if c[2]["reduction"] == "mean"],
                         ids=[i for i, c in zip(IDS, CASES) if c[2]["reduction"] == "mean"])
def test_backends_match_eager(name, module, kwargs, x, t, t_grad, backend):
    _, eager = _run(ca, module, kwargs, x, t, t_grad, np.float32)
    _, compiled = _run(ca, module, kwargs, x, t, t_grad, np.float32, backend=backend)
    for a, b in zip(eager, compiled):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


@needs_torch
def test_all_ignored_is_nan_as_torch():
    x = _x()
    t = np.full(N, -100)
    for lib in (ca, torch):
        xi, ti = _inputs(lib, x, t, False, np.float32)
        assert np.isnan(lib.nn.CrossEntropyLoss(label_smoothing=0.1)(xi, ti).item())
        assert np.isnan(lib.nn.NLLLoss()(xi, ti).item())


def test_errors():
    x = ca.randn(N, C, requires_grad=True)
    t = ca.from_numpy(_idx())
    F = ca.nn.functional
    with pytest.raises(ValueError, match="mean_ is not a valid value for reduction"):
        F.cross_entropy(x, t, reduction="mean_")
    with pytest.raises(ValueError, match="nonsense is not a valid value for reduction"):
        ca.nn.MSELoss(reduction="nonsense")(x, x)
    with pytest.raises(IndexError, match="Target 7 is out of bounds"):
        F.cross_entropy(x, ca.from_numpy(np.array([0, 1, 7, 1, 1])))
    with pytest.raises(ValueError, match=r"Expected input batch_size \(5\) to match target "
                                         r"batch_size \(3\)"):
        F.nll_loss(x, ca.from_numpy(np.array([0, 1, 1])))
    with pytest.raises(RuntimeError, match="weight tensor should be defined either for all 4 "
                                           "classes or no classes"):
        F.cross_entropy(x, t, weight=ca.ones(3))
    with pytest.raises(RuntimeError, match="label_smoothing must be between 0.0 and 1.0"):
        F.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(RuntimeError, match="expected scalar type Long but found float32"):
        F.nll_loss(x, ca.ones(N))
    with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
        F.binary_cross_entropy(x, ca.rand(N, C))
    with pytest.raises(ValueError, match="that is different to the input size"):
        F.binary_cross_entropy(ca.rand(N, C), ca.rand(N, 1))
    with pytest.raises(ValueError, match=r"Target size \(\(5, 1\)\) must be the same as input "
                                         r"size \(\(5, 4\)\)"):
        F.binary_cross_entropy_with_logits(x, ca.rand(N, 1))
    with pytest.raises(RuntimeError, match="smooth_l1_loss does not support negative values "
                                           "for beta"):
        F.smooth_l1_loss(x, x, beta=-1)
    with pytest.raises(RuntimeError, match="huber_loss does not support non-positive values "
                                           "for delta"):
        F.huber_loss(x, x, delta=0)
    with pytest.raises(RuntimeError, match="ignore_index is not supported for floating point"):
        F.cross_entropy(x, ca.rand(N, C), ignore_index=1)
    with pytest.warns(UserWarning, match="Using a target size"):
        F.mse_loss(x, ca.randn(1, C))
    with pytest.warns(UserWarning, match="size_average and reduce args will be deprecated"):
        assert ca.nn.L1Loss(reduce=False).reduction == "none"
    assert x.grad is None


def test_repr():
    assert repr(ca.nn.CrossEntropyLoss()) == "CrossEntropyLoss()"
