"""The compiled cache is bounded (issue 29, item 4): one structure compiles at
most ``cache.recompile_limit`` (8, torch's recompile_limit) graphs; past it its
backwards run on the eager engine with one warning naming the values that
changed, and a lookup checks at most that many entries."""
import warnings

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.compiled import cache


def _layer_norm(width):
    x = ca.tensor(np.linspace(-1, 1, 4 * width).reshape(4, width), requires_grad=True)
    return x, (ca.nn.functional.layer_norm(x, (width,)) * x).sum()


def _eager_grad(width):
    x, loss = _layer_norm(width)
    loss.backward()
    return x.grad.numpy()


@pytest.mark.parametrize("backend", ["python", "eager"])
def test_past_the_recompile_limit_a_structure_runs_eagerly_with_one_warning(
        backend, fresh_compiled_cache):
    assert cache.recompile_limit == 8
    widths = range(8, 8 + 14)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for width in widths:
            x, loss = _layer_norm(width)
            with ca.compiled_backward(backend=backend):
                loss.backward()
            np.testing.assert_allclose(x.grad.numpy(), _eager_grad(width), rtol=1e-5)
    stats = ca.compiled_autograd_stats()
    assert stats["compiles"] == 8
    assert [len(f.entries) for f in cache.families.values()] == [8]
    limit = [w for w in caught if "recompile limit" in str(w.message)]
    assert len(limit) == 1, [str(w.message) for w in caught]
    message = str(limit[0].message)
    assert "(8 graphs" in message and "15 -> 16" in message     # the changing width
    assert limit[0].filename == __file__           # the user's backward() is named
    # A width compiled before the limit is still a hit.
    x, loss = _layer_norm(9)
    with ca.compiled_backward(backend=backend):
        loss.backward()
    assert ca.compiled_autograd_stats()["cache_hits"] == stats["cache_hits"] + 1


def test_the_limit_is_a_setting(monkeypatch, fresh_compiled_cache):
    monkeypatch.setattr(cache, "recompile_limit", 2)
    with pytest.warns(RuntimeWarning, match=r"recompile limit \(2 graphs"):
        for width in (8, 9, 10, 11):
            with ca.compiled_backward(backend="python"):
                _layer_norm(width)[1].backward()
    assert ca.compiled_autograd_stats()["compiles"] == 2
