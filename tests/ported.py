"""Running a test ported from PyTorch's own suite eagerly and under every backend.

A ported test takes the ``mode`` fixture and runs its backward inside
``under(mode)``: "engine" is plain eager autograd (no compiled_backward), the
others are ``ca.compiled_backward(backend=mode)`` for every compiled backend
("eager", "python", and "c" where there is a compiler). Each ported test names
the PyTorch test it comes from in a comment (``# torch: test_autograd.py::TestAutograd::test_x``).
"""
from __future__ import annotations

import contextlib

import pytest

import compiled_autograd as ca
from helpers import BACKENDS

MODES = ("engine",) + tuple(BACKENDS)


@pytest.fixture(params=MODES)
def mode(request):
    ca.reset_compiled_autograd()
    yield request.param
    ca.reset_compiled_autograd()


def under(mode):
    """The context a ported test runs its backward in."""
    if mode == "engine":
        return contextlib.nullcontext()
    return ca.compiled_backward(backend=mode)
