"""What a non-reentrant checkpoint's recomputation leaves alive after the backward:
nothing, without the garbage collector's help (as torch)."""
import contextlib
import gc
import weakref

import pytest

import compiled_autograd as ca
from compiled_autograd.autograd.function import Function
from compiled_autograd.autograd.graph import saved_tensors_hooks
from compiled_autograd.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from helpers import needs_torch, torch


@contextlib.contextmanager
def no_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _save_clone(lib, made):
    class SaveClone(lib.autograd.Function):
        """Saves ``y = x.clone()``, which it returns."""

        @staticmethod
        def forward(ctx, x):
            y = x.clone()
            made.append(weakref.ref(y))
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * 2
    return SaveClone


def _alive_after_backward(lib, early_stop, pre):
    """[forward's y alive, recomputed y alive] right after the backward."""
    made = []
    fn = _save_clone(lib, made)
    ckpt = lib.utils.checkpoint
    with no_gc(), ckpt.set_checkpoint_early_stop(early_stop):
        x = lib.randn(4, requires_grad=True)
        out = ckpt.checkpoint(lambda a: fn.apply(pre(a)), x, use_reentrant=False)
        out.sum().backward()
        assert len(made) == 2           # the forward, the recomputation
        return [ref() is not None for ref in made], x.grad


@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("pre", ["direct", "mul"])
def test_recomputed_saved_output_freed_by_the_backward(early_stop, pre):
    # Early stop raises from the pack hook of the Function's last save: that once
    # left ctx -> its to-save list -> the recomputed y -> ctx, freed only by gc.
    prep = (lambda a: a) if pre == "direct" else (lambda a: a * 1)
    alive, grad = _alive_after_backward(ca, early_stop, prep)
    assert alive == [True, False]       # out still holds the forward's y
    assert grad.numpy().tolist() == [2.0] * 4


@needs_torch
def test_recomputed_saved_output_freed_as_torch():
    assert _alive_after_backward(ca, True, lambda a: a)[0] == \
        _alive_after_backward(torch, True, lambda a: a)[0] == [True, False]


def test_no_cycle_left_by_a_checkpointed_function():
    class SaveOut(Function):
        @staticmethod
        def forward(ctx, x):
            out = x.clone()
            ctx.save_for_backward(x, out)
            return out

        @staticmethod
        def backward(ctx, g):
            return g * 1

    with no_gc(), set_checkpoint_early_stop(True):
        x = ca.randn(4, requires_grad=True)
        out = checkpoint(lambda a: checkpoint(lambda b: SaveOut.apply(b.exp()), a,
                                              use_reentrant=False).sin(), x,
                         use_reentrant=False)
        out.sum().backward()
        del out, x
        assert gc.collect() == 0


def test_pack_hook_error_in_a_function_leaves_no_cycle():
    made = []
    fn = _save_clone(ca, made)

    def pack(t):
        raise ValueError("pack refused")

    with no_gc():
        x = ca.randn(3, requires_grad=True)
        with saved_tensors_hooks(pack, lambda t: t), \
                pytest.raises(ValueError, match="pack refused"):
            fn.apply(x)
        assert made[0]() is None
