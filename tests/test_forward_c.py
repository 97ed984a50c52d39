"""runtime/forward.c: the forward's common case in C, against its reference
(dispatch.apply_prim_reference). The same code runs twice, once on each path, and
everything it leaves behind is compared field by field: the result tensors, every
autograd node reachable from them (type, edges, metadata, params, shapes, dtypes,
order of creation) and every saved value (all its slots)."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.autograd import dispatch
from compiled_autograd.autograd.node import Node, SavedVariable
from compiled_autograd.autograd.tensor_base import TensorBase
from runtime import forward as c_forward

from fuzz_programs import Replay, generate
from op_cases import CASES, make_inputs


@pytest.fixture(scope="module")
def fast():
    if not c_forward.FORWARD.enabled():
        pytest.skip("CA_C_FORWARD=0")
    assert dispatch._fast[0] is not None, c_forward.FORWARD.status()
    return dispatch._fast[0]


def on_path(path, fn):
    """``fn()`` with the forward on ``path`` ("c" or "reference")."""
    saved = dispatch._fast[0]
    dispatch._fast[0] = saved if path == "c" else None
    try:
        return fn()
    finally:
        dispatch._fast[0] = saved


class Describer:
    """A plain description of a graph: objects named by the order they are met,
    inputs by their position (the same objects on both paths)."""

    def __init__(self, inputs):
        self.names = {id(t): ("input", i) for i, t in enumerate(inputs)}
        self.nodes = []
        self.out = []

    def __call__(self, obj):
        if obj is None or isinstance(obj, (bool, int, float, str, np.dtype)):
            return obj
        if isinstance(obj, np.ndarray):
            return ("array", obj.dtype, obj.shape, obj.strides, obj.tobytes())
        if isinstance(obj, tuple):
            return tuple(self(x) for x in obj)
        if isinstance(obj, dict):
            return tuple(sorted((k, repr(v)) for k, v in obj.items()))
        name = self.names.get(id(obj))
        if name is not None:
            return name
        self.names[id(obj)] = name = (type(obj).__name__, len(self.names))
        if isinstance(obj, TensorBase):
            self.out.append((name, self(obj._data), obj._requires_grad, self(obj._grad_fn),
                             obj._output_nr, obj._version_counter.value, self(obj._base),
                             obj._view_version, obj._grad, obj._grad_acc_ref,
                             obj._retains_grad, obj._creation))
        elif isinstance(obj, Node):
            self.nodes.append(obj)
            fields = [obj.next_functions, obj.input_metadata, obj._metadata]
            fields += [getattr(obj, f, None) for f in ("saved", "params", "shapes", "dtypes")]
            self.out.append((name, [self(f) for f in fields]))
        elif isinstance(obj, SavedVariable):
            fields = [getattr(obj, f, "<unset>") for f in SavedVariable.__slots__]
            counter = obj._version_counter
            fields[SavedVariable.__slots__.index("_version_counter")] = (
                None if counter is None else counter.value)
            self.out.append((name, [self(f) for f in fields]))
        else:
            return ("object", type(obj).__name__)
        return name

    def describe(self, results):
        self(tuple(results))
        order = sorted(range(len(self.nodes)), key=lambda i: self.nodes[i]._sequence_nr)
        return self.out, order


def describe_run(path, make, inputs):
    def run():
        results = make()
        return Describer(inputs).describe(results if isinstance(results, tuple) else (results,))
    return on_path(path, run)


@pytest.mark.parametrize("name,fn,specs", CASES, ids=[c[0] for c in CASES])
def test_op_cases_leave_what_the_reference_leaves(fast, name, fn, specs):
    arrays, grads = make_inputs(specs, 0)
    for dtype in (np.float64, np.float32):
        inputs = [ca.tensor(a.astype(dtype) if a.dtype.kind == "f" else a, requires_grad=g)
                  if a.dtype.kind == "f" else ca.from_numpy(a) for a, g in zip(arrays, grads)]
        make = lambda: fn(ca, *[x.clone() if not x.requires_grad else x  # noqa: E731
                                for x in inputs])
        assert describe_run("c", make, inputs) == describe_run("reference", make, inputs)


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_leave_what_the_reference_leaves(fast, seed):
    prog = generate(seed)
    variant = ("plain", "hooks", "checkpoint", "retain")[seed % 4]
    c_replay = Replay(prog, "ca", np.float64, variant)
    ref_replay = Replay(prog, "ca", np.float64, variant)
    # Both replays' leaves are made from the same arrays; name them by position.
    c = on_path("c", lambda: Describer(c_replay.leaves).describe((c_replay.forward(),)))
    ref = on_path("reference",
                  lambda: Describer(ref_replay.leaves).describe((ref_replay.forward(),)))
    assert c == ref


def test_the_fast_path_is_the_default(fast):
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    calls = []
    reference = dispatch.apply_prim_reference
    try:
        dispatch.apply_prim_reference = lambda *a: calls.append(a) or reference(*a)
        y = (x * 2.0).sin()
    finally:
        dispatch.apply_prim_reference = reference
    assert calls == [] and y.grad_fn.name() == "SinBackward"


def test_uncommon_cases_go_to_the_reference(fast):
    """A view prim, saved-tensor hooks and memory accounting run the reference."""
    x = ca.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    calls = []
    reference = dispatch.apply_prim_reference

    def counting(*a):
        calls.append(a[0].name)
        return reference(*a)
    try:
        dispatch.apply_prim_reference = counting
        # (the config's lambda looks the reference up by name at every call)
        x.t()
        assert calls == ["permute"]
        with ca.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            x.sin()
        assert calls[-1] == "sin"
        with ca.memory.profile():
            x.cos()
        assert calls[-1] == "cos"
        calls.clear()
        x.exp()
        assert calls == []
    finally:
        dispatch.apply_prim_reference = reference


def test_errors_leave_no_half_made_result(fast):
    """A kernel that raises (shapes that do not broadcast) raises the same error on
    both paths."""
    x, y = ca.tensor(np.ones((2, 3)), requires_grad=True), ca.tensor(np.ones((4,)))
    errors = []
    for path in ("c", "reference"):
        with pytest.raises(RuntimeError) as info:
            on_path(path, lambda: x * y)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
