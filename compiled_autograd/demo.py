"""The demo behind ``compiled-autograd demo``: train the bundled MLP for a few SGD
steps, then check its backward against central differences in float64."""
from __future__ import annotations

import numpy as np

import compiled_autograd as ca
from compiled_autograd.examples import build


def _finite_difference(example, param, index, eps=1e-6):
    flat = param._data.reshape(-1)
    orig = flat[index]
    with ca.no_grad():
        flat[index] = orig + eps
        plus = example.loss().item()
        flat[index] = orig - eps
        minus = example.loss().item()
    flat[index] = orig
    return (plus - minus) / (2 * eps)


def run(steps=5, lr=0.1, checks=8, seed=0, out=print):
    example = build("mlp", layers=4, width=32, batch=16, dtype=np.float64, seed=seed)
    out(f"MLP: 4 Linear layers of width 32 with tanh, batch 16, "
        f"{example.num_parameters()} parameters (float64)")
    out("")
    out("step   loss")
    optimizer = ca.optim.SGD(example.parameters(), lr=lr)
    for step in range(steps):
        loss = example.loss()
        loss.backward()
        out(f"{step:>4}   {loss.item():.6f}")
        optimizer.step()
        optimizer.zero_grad()

    loss = example.loss()
    loss.backward()
    rng = np.random.default_rng(seed)
    named = list(example.model.named_parameters())
    out("")
    out("gradient check against central differences (eps 1e-6):")
    out(f"{'parameter':<16} {'index':>6} {'autograd':>14} {'finite diff':>14} {'rel error':>10}")
    worst = 0.0
    for _ in range(checks):
        name, p = named[rng.integers(len(named))]
        i = int(rng.integers(p.numel()))
        analytic = float(p.grad._data.reshape(-1)[i])
        numeric = _finite_difference(example, p, i)
        rel = abs(analytic - numeric) / max(abs(analytic), abs(numeric), 1e-12)
        worst = max(worst, rel)
        out(f"{name:<16} {i:>6} {analytic:>14.8f} {numeric:>14.8f} {rel:>10.2e}")
    out("")
    out(f"max relative error {worst:.2e}: " + ("gradients agree" if worst < 1e-5 else
                                               "GRADIENTS DISAGREE"))
    return worst
