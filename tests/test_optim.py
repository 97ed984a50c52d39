"""ca.optim against torch.optim: 30 steps of a small MLP, every option, on the eager
engine and with the backward compiled to C; state_dict round trips; errors."""
from __future__ import annotations

import contextlib
import pickle

import numpy as np
import pytest

import compiled_autograd as ca
from helpers import BACKENDS, needs_torch, torch

STEPS = 30
# float32: rtol 2e-4, and an atol for the elements that pass near zero (1e-5, in
# parameters of size ~1: rounding that 1/sqrt(v) amplifies in the first steps).
RTOL, ATOL = 2e-4, 1e-5
BACKWARDS = ("eager",) + (("c",) if "c" in BACKENDS else ())


def _data(seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return dict(w1=(rng.standard_normal((8, 4)) * 0.5).astype(dtype),
                b1=(rng.standard_normal(8) * 0.1).astype(dtype),
                w2=(rng.standard_normal((3, 8)) * 0.5).astype(dtype),
                b2=(rng.standard_normal(3) * 0.1).astype(dtype),
                x=rng.standard_normal((16, 4)).astype(dtype),
                y=rng.standard_normal((16, 3)).astype(dtype))


def _loss(lib, p, x, y):
    h = (x @ p[0].t() + p[1]).tanh()
    out = h @ p[2].t() + p[3]
    return ((out - y) ** 2).mean()


def _ca_params(d):
    return [ca.nn.Parameter(ca.from_numpy(d[k])) for k in ("w1", "b1", "w2", "b2")]


def _torch_params(d):
    return [torch.nn.Parameter(torch.from_numpy(d[k].copy())) for k in ("w1", "b1", "w2",
                                                                           "b2")]


def _backward(loss, backend):
    ctx = (contextlib.nullcontext() if backend == "eager"
           else ca.compiled_backward(backend=backend))
    with ctx:
        loss.backward()


def _groups(params, split):
    return [{"params": params[:2]}, {"params": params[2:], "lr": 0.003}] if split else params


def _train(ca_cls, torch_cls, kwargs, backend, split=False, sched=None, steps=STEPS,
           dtype=np.float32):
    """Train both for ``steps`` steps; compare the parameters after every step (float64:
    to 1e-9, which only the same formula in the same order reaches)."""
    rtol, atol = (RTOL, ATOL) if dtype == np.float32 else (1e-9, 1e-12)
    d = _data(dtype=dtype)
    cp, tp = _ca_params(d), _torch_params(d)
    copt = ca_cls(_groups(cp, split), **kwargs)
    topt = torch_cls(_groups(tp, split), foreach=True, **kwargs)
    if sched is not None:
        cs, ts = getattr(ca.optim.lr_scheduler, sched[0])(copt, **sched[1]), \
            getattr(torch.optim.lr_scheduler, sched[0])(topt, **sched[1])
    cx, cy = ca.from_numpy(d["x"]), ca.from_numpy(d["y"])
    tx, ty = torch.from_numpy(d["x"]), torch.from_numpy(d["y"])
    for step in range(steps):
        copt.zero_grad()
        topt.zero_grad()
        _backward(_loss(ca, cp, cx, cy), backend)
        _loss(torch, tp, tx, ty).backward()
        copt.step()
        topt.step()
        if sched is not None:
            cs.step()
            ts.step()
            np.testing.assert_allclose(cs.get_last_lr(), ts.get_last_lr(), rtol=1e-12)
        for c, t in zip(cp, tp):
            np.testing.assert_allclose(c.detach().numpy(), t.detach().numpy(), rtol=rtol,
                                       atol=atol, err_msg=f"step {step}")
    return copt, topt


SGD_OPTIONS = [dict(lr=0.1), dict(lr=0.1, momentum=0.9), dict(lr=0.1, momentum=0.9,
               dampening=0.5), dict(lr=0.1, momentum=0.9, nesterov=True),
               dict(lr=0.1, weight_decay=0.1), dict(lr=0.01, momentum=0.5, weight_decay=0.1,
               maximize=True), dict(lr=0.01, maximize=True),
               dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)]
ADAM_OPTIONS = [dict(lr=0.01), dict(lr=0.01, betas=(0.8, 0.99)), dict(lr=0.01, eps=1e-3),
                dict(lr=0.01, weight_decay=0.1), dict(lr=0.01, amsgrad=True),
                dict(lr=0.002, maximize=True), dict(lr=0.01, betas=(0.3, 0.9)),
                dict(lr=0.002, amsgrad=True, weight_decay=0.05, maximize=True)]
RMSPROP_OPTIONS = [dict(lr=0.01), dict(lr=0.01, alpha=0.9), dict(lr=0.01, eps=1e-4),
                   dict(lr=0.01, weight_decay=0.1), dict(lr=0.01, momentum=0.9),
                   dict(lr=0.01, centered=True), dict(lr=0.002, maximize=True),
                   dict(lr=0.002, centered=True, momentum=0.5, weight_decay=0.05,
                        maximize=True)]
ADAGRAD_OPTIONS = [dict(lr=0.1), dict(lr=0.1, lr_decay=0.05), dict(lr=0.1, weight_decay=0.1),
                   dict(lr=0.1, initial_accumulator_value=0.5), dict(lr=0.1, eps=1e-3),
                   dict(lr=0.01, maximize=True),
                   dict(lr=0.01, lr_decay=0.01, weight_decay=0.05, maximize=True)]
CASES = ([("SGD", o) for o in SGD_OPTIONS] + [("Adam", o) for o in ADAM_OPTIONS]
         + [("AdamW", o) for o in ADAM_OPTIONS] + [("AdamW", dict(lr=0.01))]
         + [("RMSprop", o) for o in RMSPROP_OPTIONS] + [("Adagrad", o) for o in ADAGRAD_OPTIONS])


@needs_torch
@pytest.mark.parametrize("backend", BACKWARDS)
@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_follows_torch(name, kwargs, backend):
    _train(getattr(ca.optim, name), getattr(torch.optim, name), kwargs, backend)


@needs_torch
@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_same_formula_as_torch_float64(name, kwargs):
    _train(getattr(ca.optim, name), getattr(torch.optim, name), kwargs, "eager",
           dtype=np.float64)


@needs_torch
@pytest.mark.parametrize("name,kwargs", [("SGD", dict(lr=0.1, momentum=0.9)),
                                         ("Adam", dict(lr=0.01)), ("RMSprop", dict(lr=0.01)),
                                         ("Adagrad", dict(lr=0.1))])
def test_param_groups_follow_torch(name, kwargs):
    copt, topt = _train(getattr(ca.optim, name), getattr(torch.optim, name), kwargs, "eager",
                        split=True)
    assert [g["lr"] for g in copt.param_groups] == [g["lr"] for g in topt.param_groups]


SCHEDULERS = [("StepLR", dict(step_size=4, gamma=0.5)),
              ("MultiStepLR", dict(milestones=[3, 7, 7, 20], gamma=0.5)),
              ("ExponentialLR", dict(gamma=0.9)),
              ("CosineAnnealingLR", dict(T_max=10, eta_min=0.001)),
              ("LinearLR", dict(start_factor=0.25, end_factor=1.0, total_iters=8)),
              ("LambdaLR", dict(lr_lambda=lambda e: 1.0 / (1 + e))),
              ("OneCycleLR", dict(max_lr=0.2, total_steps=STEPS)),
              ("OneCycleLR", dict(max_lr=[0.2, 0.1], total_steps=STEPS, three_phase=True,
                                  anneal_strategy="linear"))]


@needs_torch
@pytest.mark.parametrize("backend", BACKWARDS)
@pytest.mark.parametrize("sched", SCHEDULERS, ids=[f"{s[0]}{i}" for i, s in
                                                    enumerate(SCHEDULERS)])
@pytest.mark.parametrize("name,kwargs", [("SGD", dict(lr=0.1, momentum=0.9)),
                                         ("Adam", dict(lr=0.01))])
def test_schedulers_follow_torch(name, kwargs, sched, backend):
    _train(getattr(ca.optim, name), getattr(torch.optim, name), kwargs, backend,
           split=True, sched=sched)


@needs_torch
def test_scheduler_state_dict_and_epoch_follow_torch():
    d = _data()
    copt = ca.optim.SGD(_ca_params(d), lr=0.1)
    topt = torch.optim.SGD(_torch_params(d), lr=0.1)
    cs = ca.optim.lr_scheduler.StepLR(copt, 3, 0.5)
    ts = torch.optim.lr_scheduler.StepLR(topt, 3, 0.5)
    for _ in range(5):
        copt.step(), topt.step(), cs.step(), ts.step()
    assert cs.last_epoch == ts.last_epoch == 5
    theirs = ts.state_dict()
    ours = cs.state_dict()
    assert {k: v for k, v in theirs.items() if k in ours} == ours
    with pytest.warns(UserWarning, match="epoch parameter"):
        cs.step(9)
    with pytest.warns(UserWarning):
        ts.step(9)
    assert cs.get_last_lr() == ts.get_last_lr()
    cs2 = ca.optim.lr_scheduler.StepLR(copt, 3, 0.5)
    cs2.load_state_dict(cs.state_dict())
    assert cs2.last_epoch == 9 and cs2.get_last_lr() == cs.get_last_lr()


def test_scheduler_before_step_warns():
    p = ca.nn.Parameter(np.ones(2, np.float32))
    opt = ca.optim.SGD([p], lr=0.1)
    s = ca.optim.lr_scheduler.ExponentialLR(opt, 0.5)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        s.step()


def test_scheduler_errors():
    opt = ca.optim.SGD([ca.nn.Parameter(np.ones(2, np.float32))], lr=0.1)
    with pytest.raises(TypeError, match="is not an Optimizer"):
        ca.optim.lr_scheduler.StepLR(object(), 3)
    with pytest.raises(KeyError, match="initial_lr"):
        ca.optim.lr_scheduler.StepLR(opt, 3, last_epoch=4)
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        ca.optim.lr_scheduler.LinearLR(opt, start_factor=0)
    with pytest.raises(ValueError, match="You must define either total_steps"):
        ca.optim.lr_scheduler.OneCycleLR(opt, 0.1)
    s = ca.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=2)
    opt.step(), s.step(), opt.step(), s.step()
    with pytest.raises(ValueError, match="Tried to step 3 times"):
        s.step()
    with pytest.raises(ValueError, match="Expected 1 lr_lambdas, but got 2"):
        ca.optim.lr_scheduler.LambdaLR(opt, [lambda e: 1, lambda e: 2])


def _run(opt, params, d, steps):
    x, y = ca.tensor(d["x"]), ca.tensor(d["y"])
    for _ in range(steps):
        opt.zero_grad()
        _loss(ca, params, x, y).backward()
        opt.step()


@pytest.mark.parametrize("name,kwargs", [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
                                         ("Adam", dict(lr=0.01, amsgrad=True)),
                                         ("AdamW", dict(lr=0.01)),
                                         ("RMSprop", dict(lr=0.01, centered=True,
                                                          momentum=0.5)),
                                         ("Adagrad", dict(lr=0.1, lr_decay=0.01))])
def test_state_dict_round_trip_is_bitwise(name, kwargs):
    """A restored optimizer (through pickle, as torch.save would) continues exactly
    like the original."""
    d = _data()
    cls = getattr(ca.optim, name)
    params = _ca_params(d)
    opt = cls(params, **kwargs)
    _run(opt, params, d, 5)
    saved = pickle.loads(pickle.dumps(opt.state_dict()))
    snapshot = [p.detach().numpy().copy() for p in params]
    _run(opt, params, d, 5)
    params2 = [ca.nn.Parameter(a) for a in snapshot]
    opt2 = cls(params2, lr=123.0)
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["lr"] == kwargs["lr"]
    _run(opt2, params2, d, 5)
    for a, b in zip(params, params2):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


@needs_torch
@pytest.mark.parametrize("name,kwargs", [("SGD", dict(lr=0.1, momentum=0.9)),
                                         ("Adam", dict(lr=0.01, amsgrad=True)),
                                         ("RMSprop", dict(lr=0.01, momentum=0.5,
                                                          centered=True)),
                                         ("Adagrad", dict(lr=0.1))])
def test_state_dict_format_is_torchs(name, kwargs):
    copt, topt = _train(getattr(ca.optim, name), getattr(torch.optim, name), kwargs, "eager",
                        split=True, steps=3)
    cs, ts = copt.state_dict(), topt.state_dict()
    assert cs["param_groups"] == [dict(g, foreach=None) for g in ts["param_groups"]]
    assert sorted(cs["state"]) == sorted(ts["state"])
    for i, st in ts["state"].items():
        assert sorted(cs["state"][i]) == sorted(st)
        for key, value in st.items():
            np.testing.assert_allclose(cs["state"][i][key].numpy(), value.numpy(), rtol=1e-4,
                                       atol=1e-7)
            assert cs["state"][i][key].dtype == value.numpy().dtype


@needs_torch
def test_loads_a_torch_state_dict():
    """A torch state_dict (tensors turned into ca tensors) continues as torch does."""
    d = _data()
    copt, topt = _train(ca.optim.Adam, torch.optim.Adam, dict(lr=0.01), "eager", steps=3)
    ts = topt.state_dict()
    converted = {"param_groups": ts["param_groups"],
                 "state": {i: {k: ca.tensor(v.numpy(), dtype=v.numpy().dtype)
                               for k, v in st.items()} for i, st in ts["state"].items()}}
    params = _ca_params(d)
    opt = ca.optim.Adam(params)
    opt.load_state_dict(converted)
    assert opt.param_groups[0]["lr"] == 0.01
    assert opt.state[params[0]]["step"].item() == 3.0


def test_zero_grad():
    p = ca.nn.Parameter(np.ones(3, np.float32))
    opt = ca.optim.SGD([p], lr=0.1)
    (p * 2).sum().backward()
    g = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is g and not g.numpy().any()
    opt.zero_grad()
    assert p.grad is None


def test_step_closure_and_skips_params_without_grad():
    a, b = ca.nn.Parameter(np.ones(2, np.float32)), ca.nn.Parameter(np.ones(2, np.float32))
    opt = ca.optim.SGD([a, b], lr=0.5, momentum=0.9)

    def closure():
        opt.zero_grad()
        loss = (a * 3).sum()
        loss.backward()
        return loss

    v0 = a._version
    loss = opt.step(closure)
    assert loss.item() == 6.0
    np.testing.assert_array_equal(a.detach().numpy(), [-0.5, -0.5])
    np.testing.assert_array_equal(b.detach().numpy(), [1, 1])
    assert a._version == v0 + 1   # an in-place update, as torch's
    assert b not in opt.state and len(opt.state_dict()["state"]) == 1


def test_sgd_without_momentum_keeps_no_state():
    p = ca.nn.Parameter(np.ones(2, np.float32))
    opt = ca.optim.SGD([p], lr=0.1)
    (p * 1).sum().backward()
    opt.step()
    assert opt.state_dict()["state"] == {}


def test_no_new_array_per_step():
    """After the first step (state and scratch made), a step allocates nothing."""
    d = _data()
    params = _ca_params(d)
    opt = ca.optim.Adam(params, lr=0.01, amsgrad=True, weight_decay=0.1, maximize=True)
    _loss(ca, params, ca.tensor(d["x"]), ca.tensor(d["y"])).backward()
    opt.step()
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        opt.step()
    assert prof.peak_bytes == 0
    import tracemalloc
    tracemalloc.start()
    opt.step()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    opt.step()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert peak < 2048, peak    # Python objects only; the smallest parameter is 12 bytes x 8


def test_add_param_group_and_errors():
    a = ca.nn.Parameter(np.ones(2, np.float32))
    b = ca.nn.Parameter(np.ones(2, np.float32))
    opt = ca.optim.Adam([a], lr=0.1)
    opt.add_param_group({"params": b, "lr": 0.5})
    assert opt.param_groups[1]["lr"] == 0.5 and opt.param_groups[1]["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter "
                                         "group"):
        opt.add_param_group({"params": [a]})
    with pytest.raises(TypeError, match="param_group must be a dict"):
        opt.add_param_group([a])
    with pytest.raises(TypeError, match="need to be organized in ordered collections"):
        opt.add_param_group({"params": {b}})
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        ca.optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts"):
        ca.optim.SGD(a, lr=0.1)
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
        ca.optim.SGD([a * 2], lr=0.1)
    with pytest.raises(TypeError, match="optimizer can only optimize Tensors"):
        ca.optim.SGD([1.0], lr=0.1)
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        ca.optim.SGD([a], lr=-1)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero "
                                         "dampening"):
        ca.optim.SGD([a], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        ca.optim.Adam([a], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid alpha value"):
        ca.optim.RMSprop([a], alpha=-1)
    with pytest.raises(ValueError, match="Invalid lr_decay value"):
        ca.optim.Adagrad([a], lr_decay=-1)
    with pytest.raises(RuntimeError, match="fused=True` is not supported"):
        ca.optim.Adam([a], fused=True)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        ca.optim.Adam([a]).load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        ca.optim.Adam([{"params": [a, b]}, {"params": []}]).load_state_dict(opt.state_dict())
    with pytest.warns(UserWarning, match="duplicate parameters"):
        ca.optim.SGD([a, a], lr=0.1)
    assert "Parameter Group 1" in repr(opt) and "lr: 0.5" in repr(opt)


# Ported from torch's test/test_optim.py (the parts that apply to a CPU numpy library).

@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_step_is_noop_when_params_have_no_grad(name):
    params = [ca.nn.Parameter(np.ones((2, 3), np.float32)) for _ in range(2)]
    opt = getattr(ca.optim, name)(params, lr=0.1)
    before = {k: dict(v) for k, v in opt.state.items()}
    opt.step()
    for p in params:
        np.testing.assert_array_equal(p.detach().numpy(), np.ones((2, 3)))
    assert {k: dict(v) for k, v in opt.state.items()} == before


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_step_is_noop_for_zero_grads(name):
    """With zero gradients and no weight decay, no parameter moves (torch's
    test_step_is_noop_for_zero_grads, for the options that keep it so)."""
    params = [ca.nn.Parameter(np.full((2, 3), 0.5, np.float32))]
    opt = getattr(ca.optim, name)(params, lr=0.1, **({"weight_decay": 0.0}
                                                     if name == "AdamW" else {}))
    for _ in range(3):
        params[0].grad = ca.zeros(2, 3)
        opt.step()
    np.testing.assert_array_equal(params[0].detach().numpy(), np.full((2, 3), 0.5))


@pytest.mark.parametrize("name,kwargs,missing", [("Adam", dict(lr=0.01), "maximize"),
                                                 ("SGD", dict(lr=0.1, momentum=0.9),
                                                  "nesterov"),
                                                 ("RMSprop", dict(lr=0.01), "centered")])
def test_can_load_older_state_dict(name, kwargs, missing):
    """A state_dict saved before an option existed (torch's
    test_can_load_older_state_dict): the option takes its default; a step saved as
    a number becomes the float32 tensor."""
    d = _data()
    params = _ca_params(d)
    opt = getattr(ca.optim, name)(params, **kwargs)
    _run(opt, params, d, 2)
    old = pickle.loads(pickle.dumps(opt.state_dict()))
    for group in old["param_groups"]:
        del group[missing]
    for st in old["state"].values():
        if "step" in st:
            st["step"] = float(st["step"].item())
    opt2 = getattr(ca.optim, name)(params, **kwargs)
    opt2.load_state_dict(old)
    assert opt2.param_groups[0][missing] == opt.defaults[missing]
    _run(opt2, params, d, 1)
    for st in opt2.state.values():
        if "step" in st:
            assert st["step"].dtype == np.float32 and st["step"].item() == 3.0


def test_optimizer_can_be_printed():
    params = [ca.nn.Parameter(np.ones(2, np.float32))]
    text = repr(ca.optim.Adam(params, lr=0.5))
    assert text.startswith("Adam (\nParameter Group 0\n") and "    lr: 0.5\n" in text
    assert repr(ca.optim.in_backward(ca.optim.SGD(params, lr=0.1))).startswith(
        "in_backward(SGD (")


@needs_torch
@pytest.mark.parametrize("sched", [("StepLR", dict(step_size=3, gamma=0.5)),
                                   ("MultiStepLR", dict(milestones=[2, 9], gamma=0.3)),
                                   ("ExponentialLR", dict(gamma=0.8)),
                                   ("CosineAnnealingLR", dict(T_max=6, eta_min=0.01)),
                                   ("LinearLR", dict(start_factor=0.5, total_iters=7))],
                         ids=lambda s: s[0])
def test_resumed_scheduler_follows_torch(sched):
    """A scheduler made with ``last_epoch=k`` (resuming) and ``step(epoch)`` (the
    closed form), as torch's."""
    d = _data()
    lrs = []
    for lib, params in ((ca, _ca_params(d)), (torch, _torch_params(d))):
        opt = lib.optim.SGD(params, lr=0.1)
        for group in opt.param_groups:
            group["initial_lr"] = 0.2
        s = getattr(lib.optim.lr_scheduler, sched[0])(opt, last_epoch=4, **sched[1])
        seen = [s.get_last_lr()[0]]
        for _ in range(12):
            opt.step()
            s.step()
            seen.append(s.get_last_lr()[0])
        with pytest.warns(UserWarning):
            s.step(3)
        seen.append(s.get_last_lr()[0])
        lrs.append(seen)
    np.testing.assert_allclose(lrs[0], lrs[1], rtol=1e-12)


@needs_torch
def test_hooks_follow_torch():
    """Step, state_dict and load_state_dict hooks: called as torch's, in the same
    order (prepend), with the same arguments, and removable."""
    logs = []
    for lib in (ca, torch):
        d = _data()
        params = _ca_params(d) if lib is ca else _torch_params(d)
        opt = lib.optim.SGD(params, lr=0.1, momentum=0.9)
        log = []

        def pre(o, args, kwargs):
            log.append(("pre", len(args), sorted(kwargs)))
            if kwargs.get("closure") is None:
                return args, {"closure": lambda: 5.0}

        opt.register_step_pre_hook(pre)
        h = opt.register_step_post_hook(lambda o, a, k: log.append(("post", len(a))))
        for p in params:
            p.grad = (ca.ones_like(p) if lib is ca else torch.ones_like(p))
        log.append(("loss", opt.step()))
        h.remove()
        opt.step()
        opt.register_state_dict_pre_hook(lambda o: log.append("sd pre a"))
        opt.register_state_dict_pre_hook(lambda o: log.append("sd pre b"), prepend=True)
        opt.register_state_dict_post_hook(lambda o, sd: dict(sd, extra=1))
        sd = opt.state_dict()
        log.append(("extra", sd["extra"]))
        opt.register_load_state_dict_pre_hook(
            lambda o, sd: log.append(("load pre", sorted(sd))) or
            {k: v for k, v in sd.items() if k != "extra"})
        opt.register_load_state_dict_post_hook(lambda o: log.append("load post"))
        opt.load_state_dict(sd)
        logs.append(log)
    assert logs[0] == logs[1]
    with pytest.raises(RuntimeError, match="must return None or a tuple"):
        opt = ca.optim.SGD(_ca_params(_data()), lr=0.1)
        opt.register_step_pre_hook(lambda o, a, k: 3)
        opt.step()


def test_in_backward_shares_hooks():
    params = _ca_params(_data())
    inner = ca.optim.SGD(params, lr=0.1)
    opt = ca.optim.in_backward(inner)
    seen = []
    opt.register_step_post_hook(lambda o, a, k: seen.append(o))
    opt.step()
    assert seen == [inner]
