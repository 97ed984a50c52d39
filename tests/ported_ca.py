"""torch's ``check_output_and_recompiles`` (test/inductor/test_compiled_autograd.py)
for the tests ported from that file.

``check_output_and_recompiles(fn, count, backend)`` runs the generator ``fn``
eagerly, then again under ``ca.compiled_backward(backend=...)``, both from
``ca.manual_seed(123)``; every value ``fn`` yields is compared (tensors as numpy
copies taken when yielded), and the compiled run must have captured ``count``
graphs (``[captures, compiles]`` when they differ), as torch counts
``counters["compiled_autograd"]``.

``backend`` is a compiled backend's name, or "user": a user compiler
``lambda gm: gm`` (torch's tests pass their own ``compiler_fn``).
"""
from __future__ import annotations

import numpy as np

import compiled_autograd as ca
from helpers import BACKENDS, assert_backend_matches

# Every compiled backend, and a user compiler function.
CA_BACKENDS = tuple(BACKENDS) + ("user",)


def compiler(backend):
    if backend == "user":
        return lambda gm: gm
    return backend


def snapshot(value):
    if isinstance(value, ca.Tensor):
        return np.array(value.detach().numpy(), copy=True)
    return value


def assert_same(backend, expected, actual):
    assert len(expected) == len(actual), (len(expected), len(actual))
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e is None or a is None:
            assert e is None and a is None, f"item {i}: {e!r} vs {a!r}"
        elif isinstance(e, np.ndarray):
            assert isinstance(a, np.ndarray), f"item {i}: {a!r}"
            assert e.dtype == a.dtype and e.shape == a.shape, (i, e.dtype, a.dtype, e.shape, a.shape)
            assert_backend_matches(backend, e, a)
        else:
            assert e == a, f"item {i}: {e!r} vs {a!r}"


def check_output_and_recompiles(fn, count=1, backend="python"):
    captures, compiles = count if isinstance(count, list) else (count, count)
    ca.reset_compiled_autograd()
    ca.manual_seed(123)
    expected = [snapshot(v) for v in fn()]
    assert ca.compiled_autograd_stats()["captures"] == 0
    ca.manual_seed(123)
    with ca.compiled_backward(backend=compiler(backend)):
        actual = [snapshot(v) for v in fn()]
    assert_same(backend, expected, actual)
    stats = ca.compiled_autograd_stats()
    assert (stats["captures"], stats["compiles"]) == (captures, compiles), stats
    return expected
