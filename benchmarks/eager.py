"""Eager backward cost: time per backward and per autograd node, for the small MLP
(8 Linear layers of width 64, tanh, batch 32) and a 200-op elementwise chain on 16
elements, with torch's eager autograd on the same inputs in the same run when
torch is installed. Prints one table; medians of many repetitions.

    python benchmarks/eager.py [--reps N]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

import compiled_autograd as ca
from compiled_autograd.examples import build

try:
    import torch
except ImportError:
    torch = None


def count_nodes(root):
    seen, stack = set(), [root]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return len(seen)


def time_backward(make_loss, reps, warmup=5):
    """Median wall time of loss.backward() (the forward is rebuilt untimed)."""
    times, nodes = [], 0
    for i in range(warmup + reps):
        loss = make_loss()
        if i == 0:
            nodes = count_nodes(loss.grad_fn)
        start = time.perf_counter()
        loss.backward()
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times), nodes


def mlp_case(lib):
    ex = build("mlp", layers=8, width=64, batch=32)
    if lib is ca:
        return ex.loss
    P = {n: torch.tensor(p.detach().numpy(), requires_grad=True)
         for n, p in ex.model.named_parameters()}
    x = torch.from_numpy(ex.inputs["x"].numpy())
    target = torch.from_numpy(ex.inputs["target"].numpy())
    F = torch.nn.functional

    def loss():
        h = x
        for i in range(8):
            h = F.linear(h, P[f"net.{2 * i}.weight"], P[f"net.{2 * i}.bias"])
            if i < 7:
                h = torch.tanh(h)
        return F.mse_loss(h, target)
    return loss


CHAIN_OPS = (lambda x: x * 1.001, lambda x: x.sin(), lambda x: x + 0.1, lambda x: x.tanh())


def chain_case(lib):
    x0 = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    x = lib.tensor(x0, requires_grad=True)

    def loss():
        h = x
        for i in range(200):
            h = CHAIN_OPS[i % 4](h)
        return h.sum()
    return loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, numpy {np.__version__}"
          + (f", torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else
             ", torch not installed"))
    print(f"median of {args.reps} backward passes each\n")
    header = f"{'case':<28} {'nodes':>6} {'ca backward':>12} {'ca us/node':>11}"
    if torch:
        header += f" {'torch backward':>15} {'torch us/node':>14} {'ca/torch':>9}"
    print(header)
    for name, case in (("mlp 8x64, batch 32", mlp_case), ("chain 200 ops, 16 elements",
                                                         chain_case)):
        t_ca, n_ca = time_backward(case(ca), args.reps)
        row = f"{name:<28} {n_ca:>6} {t_ca * 1e6:>10.0f}us {t_ca * 1e6 / n_ca:>11.2f}"
        if torch:
            t_t, n_t = time_backward(case(torch), args.reps)
            row += f" {t_t * 1e6:>13.0f}us {t_t * 1e6 / n_t:>14.2f} {t_ca / t_t:>9.2f}"
        print(row)


if __name__ == "__main__":
    main()
