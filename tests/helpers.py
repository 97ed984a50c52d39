"""Shared test helpers: run one op case in ca and in torch, and compare."""
from __future__ import annotations

import numpy as np
import pytest

import compiled_autograd as ca

try:
    import torch
except ImportError:  # torch is an optional oracle
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle) is not installed")


def _has_cc():
    import shutil

    from compiled_autograd.runtime import cbuild
    return shutil.which(cbuild.compiler().split()[0]) is not None


needs_cc = pytest.mark.skipif(not _has_cc(), reason="no C compiler")

# Every compiled backend ("c" where there is a compiler), for parametrizing.
BACKENDS = ("eager", "python") + (("c",) if _has_cc() else ())


def assert_backend_matches(backend, eager, compiled):
    """A backend's result against eager autograd's: bit for bit on "eager" and
    "python" (same kernels, same order); on "c" within rtol 1e-5 (float32) or
    1e-10 (float64), since its loops and fused expressions round differently."""
    eager, compiled = np.asarray(eager), np.asarray(compiled)
    if backend == "c":
        rtol = 1e-10 if eager.dtype == np.float64 else 1e-5
        np.testing.assert_allclose(compiled, eager, rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(eager, compiled)


# Small bundled models for the C backend's tests.
MLP = dict(layers=2, width=8, batch=4)
TRANSFORMER = dict(layers=2, d_model=16, heads=2, seq=4, batch=2, vocab=20)


def profile_backward(loss, backend=None, unpack="progressive"):
    """The memory profile of ``loss.backward()``: eager (``backend=None``) or
    compiled with ``backend`` and ``unpack``."""
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        if backend is None:
            loss.backward()
        else:
            with ca.compiled_backward(backend=backend, unpack=unpack):
                loss.backward()
    return prof


def on_c(fn):
    """Run ``fn`` (a backward) under the C backend."""
    with ca.compiled_backward(backend="c"):
        return fn()


def run_ca(fn, arrays, grads, dtype=np.float32, upstream_seed=0):
    """Forward and backward in ca with a random upstream gradient. Returns
    (output array, [input grad arrays or None])."""
    inputs = [ca.tensor(a, dtype=dtype, requires_grad=True) if g else ca.from_numpy(a)
              for a, g in zip(arrays, grads)]
    out = fn(ca, *inputs)
    up = np.random.default_rng(upstream_seed).standard_normal(out.shape).astype(dtype)
    out.backward(ca.tensor(up, dtype=dtype))
    return out.detach().numpy(), [t.grad.numpy() if g and t.grad is not None else None
                                  for t, g in zip(inputs, grads)]


def run_torch(fn, arrays, grads, dtype=np.float32, upstream_seed=0):
    tdtype = torch.float32 if dtype == np.float32 else torch.float64
    inputs = [torch.tensor(a, dtype=tdtype, requires_grad=True) if g else torch.from_numpy(a)
              for a, g in zip(arrays, grads)]
    out = fn(torch, *inputs)
    up = np.random.default_rng(upstream_seed).standard_normal(tuple(out.shape)).astype(dtype)
    out.backward(torch.from_numpy(up))
    return out.detach().numpy(), [t.grad.numpy() if g and t.grad is not None else None
                                  for t, g in zip(inputs, grads)]


def assert_close(ours, theirs, rtol=1e-4, atol=1e-5, what=""):
    assert ours is not None and theirs is not None, f"{what}: missing gradient"
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} vs {theirs.shape}"
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol, err_msg=what)


def status_with(env_var, module, name):
    """``<name>.module()`` and ``.status()`` printed by a fresh interpreter that has
    ``<env_var>=0`` (an extension's switch is read once, at import)."""
    import os
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", f"from {module} import {name}; "
                           f"print({name}.module(), {name}.status())"],
                          env=dict(os.environ, **{env_var: "0"}), capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()
