"""checkpoint(..., use_reentrant=False, debug=True) explains a non-deterministic
recomputation with the operators of both runs and where they were called from
(torch.utils.checkpoint's _get_debug_context_and_cb)."""
import functools
import inspect

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.utils.checkpoint import (CheckpointError, checkpoint,
                                                create_selective_checkpoint_contexts,
                                                set_checkpoint_debug_enabled,
                                                set_checkpoint_early_stop)
from helpers import needs_torch, torch

SLICE_LINE = None


def _nondeterministic():
    """sin, then (only when recomputing) a slice, then exp: the recomputed exp saves
    a tensor of another shape."""
    calls = [0]

    def fn(x):
        global SLICE_LINE
        calls[0] += 1
        y = x.sin()
        if calls[0] > 1:
            SLICE_LINE = inspect.currentframe().f_lineno + 1
            y = y[:2]
        return y.exp()
    return fn


def _error(lib, **kwargs):
    x = lib.randn(4, requires_grad=True)
    out = lib.utils.checkpoint.checkpoint(_nondeterministic(), x, use_reentrant=False,
                                          **kwargs)
    with pytest.raises(lib.utils.checkpoint.CheckpointError) as info:
        out.sum().backward()
    return info.value


def test_debug_lists_the_operators_of_both_runs():
    e = _error(ca, debug=True)
    msg = str(e)
    assert msg.startswith(" An error happened while unpacking tensors; dumping logs of "
                          "latest computation\nbecause you passed `debug=True`")
    assert ("Operations executed during the original forward:\n\n"
            "$1: f32[4] = sin($0)\n$2: f32[4] = exp($1)\n\n") in msg
    assert ("Operations executed during recomputation:\n\n"
            "$1: f32[4] = sin($0)\n$2: f32[2] = slice($1, dim=0, start=0, stop=2, step=1)\n"
            "$3: f32[2] = exp($2)\n") in msg
    assert ("The runs diverge at operator 2:\n"
            "  original forward: $2: f32[4] = exp($1)\n"
            "  recomputation:    $2: f32[2] = slice($1, dim=0, start=0, stop=2, step=1)\n"
            ) in msg
    assert " ERROR: Detected non-determinism while running activation checkpointing" in msg
    # each op with the user's frames that called it (the library's left out)
    assert f"(2 of 3 in recompute)\n\n{__file__}:{SLICE_LINE}:fn\n" in msg
    assert "(1 of 2 in original)\n\n" + __file__ in msg
    assert "checkpoint.py" not in msg and "dispatch.py" not in msg
    # the error it explains is its cause, as torch
    cause = e.__cause__
    assert isinstance(cause, CheckpointError)
    assert str(cause).startswith("torch.utils.checkpoint: Recomputed values for the following "
                                 "tensors have different metadata than during the forward "
                                 "pass.\ntensor at position 1:")


def test_without_debug_the_error_tells_how_to_get_more():
    msg = str(_error(ca))
    assert msg.startswith("torch.utils.checkpoint: Recomputed values for the following")
    assert "recomputed metadata: {'shape': (2,), 'dtype': 'float32'}\n.\n" in msg
    assert "Tip: To see a more detailed error message, either pass `debug=True`" in msg
    assert "Operations executed" not in msg


@needs_torch
def test_debug_message_has_torchs_structure():
    ours, theirs = str(_error(ca, debug=True)), str(_error(torch, debug=True))
    headers = [line for line in theirs.splitlines()
               if line.startswith(("|", "+", " ERROR", "Operations executed", " 4. Error"))]
    assert len(headers) >= 12
    at = 0
    for header in headers:          # each of torch's headers, in torch's order
        at = ours.index(header, at) + len(header)
    assert type(_error(torch, debug=True).__cause__).__name__ == "CheckpointError"


def test_set_checkpoint_debug_enabled_overrides_the_argument():
    with set_checkpoint_debug_enabled(True):
        assert "Operations executed during recomputation" in str(_error(ca))
    with set_checkpoint_debug_enabled(False):
        assert "Operations executed" not in str(_error(ca, debug=True))
    with set_checkpoint_debug_enabled(None):
        assert "Operations executed" in str(_error(ca, debug=True))


def test_debug_explains_more_saved_tensors():
    calls = [0]

    def fn(x):
        calls[0] += 1
        y = x.sin()
        for _ in range(calls[0]):      # one more exp when recomputing
            y = y.exp()
        return y * 2

    x = ca.randn(3, requires_grad=True)
    with set_checkpoint_early_stop(False):
        out = checkpoint(fn, x, use_reentrant=False, debug=True)
    with pytest.raises(CheckpointError) as info:
        out.sum().backward()
    msg = str(info.value)
    assert ("The runs diverge at operator 3:\n  original forward: $3: f32[3] = mul($2, 2)\n"
            "  recomputation:    $3: f32[3] = exp($2)\n") in msg
    assert str(info.value.__cause__).startswith(      # (as torch, for this program)
        "torch.utils.checkpoint: trying to save more tensors during recomputation than "
        "during the original forward pass.\n\nTip: To see a more detailed error message")


def test_debug_is_not_for_a_custom_context_fn():
    x = ca.randn(3, requires_grad=True)
    ctx = functools.partial(create_selective_checkpoint_contexts, ["exp"])
    with pytest.raises(ValueError, match="^debug=True is incompatible with non-default "
                                         "context_fn$"):
        checkpoint(lambda a: a.exp(), x, use_reentrant=False, debug=True, context_fn=ctx)


def test_debug_changes_nothing_when_the_runs_agree():
    x = ca.randn(3, requires_grad=True)
    outer = checkpoint(lambda a: checkpoint(lambda b: b.sin().exp(), a, use_reentrant=False,
                                            debug=True).cos(), x, use_reentrant=False,
                       debug=True)
    outer.sum().backward()
    plain = x.detach().requires_grad_()
    plain.sin().exp().cos().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), plain.grad.numpy(), rtol=1e-6)
