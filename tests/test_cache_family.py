"""A structure's Family and its entries: what the verbose miss log names for a
custom Function's node, and that dropping the cache frees its graphs without
waiting for the cycle collector (an entry reaches its Family, which holds it)."""
import gc
import logging
import weakref

import numpy as np

import compiled_autograd as ca
from compiled_autograd.compiled import cache


class Twice(ca.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x)
        return x * y

    @staticmethod
    def backward(ctx, g):
        return g, g


def _miss_log(monkeypatch, caplog, first, second):
    """The verbose log's messages of two compiled backwards: ``first(w, v)`` and
    ``second(w, v)`` give the losses."""
    monkeypatch.setenv("CA_LOGS", "verbose")
    w = ca.tensor(np.arange(3.0), requires_grad=True)
    v = ca.tensor(np.ones(3), requires_grad=True)
    with caplog.at_level(logging.INFO, logger="compiled_autograd"):
        with ca.compiled_backward(backend="eager"):
            first(w, v).sum().backward()
            second(w, v).sum().backward()
    return [r.getMessage() for r in caplog.records]


def test_a_custom_function_new_at_a_position_is_named_by_the_miss_log(
        monkeypatch, caplog, fresh_compiled_cache):
    # one node fewer: the custom Function's node is where a MulBackward was
    log = _miss_log(monkeypatch, caplog, lambda w, v: Twice.apply(w * 1.0, v * 1.0),
                    lambda w, v: Twice.apply(w * 1.0, v.detach() * 1.0))
    misses = [m for m in log if "cache miss" in m]
    assert misses == ["cache miss: empty cache",
                      "cache miss: new autograd node Twice (NodeCall 1)"]


def test_a_changed_flag_of_a_custom_function_is_named_by_its_class(
        monkeypatch, caplog, fresh_compiled_cache):
    log = _miss_log(monkeypatch, caplog, lambda w, v: Twice.apply(w, v),
                    lambda w, v: Twice.apply(w, v.detach()))   # needs_input_grad changed
    (miss,) = [m for m in log if m.startswith("cache miss: changed")]
    assert miss.startswith("cache miss: changed args of Twice (NodeCall 0): ")


def test_reset_frees_a_family_and_its_graphs_without_the_cycle_collector(
        fresh_compiled_cache):
    w = ca.tensor(np.arange(3.0), requires_grad=True)
    with ca.compiled_backward(backend="python"):
        for _ in range(2):    # (the first runs eagerly to learn the Nones; both cached)
            Twice.apply(w * 1.0, w * 2.0).sum().backward()
        (w * 3.0).tanh().sum().backward()
    families = [weakref.ref(f) for f in cache.families.values()]
    entries = [weakref.ref(e) for f in cache.families.values() for *_, e in f.entries]
    assert len(families) == 2 and len(entries) == 2
    was = gc.isenabled()
    gc.disable()
    try:
        ca.reset_compiled_autograd()
        assert [r() for r in families + entries] == [None] * 4
    finally:
        if was:
            gc.enable()
