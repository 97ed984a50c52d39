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
from compiled_autograd.runtime import forward as c_forward

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
    dispatch.use_forward_path(path)
    try:
        return fn()
    finally:
        dispatch.use_forward_path("c")


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
    """Saved-tensor hooks and memory accounting run the reference."""
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
        assert calls == []          # a view is made in C too
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


# ---------------------------------------------------------------- what a review broke
# (each crashed the interpreter or differed from the reference before its fix)

def _in_fresh_process(script):
    """``script`` in a fresh interpreter, on the C path then on the reference:
    the two outputs (a crash is a non-zero return code)."""
    import subprocess
    import sys
    import textwrap
    outs = []
    for path in ("c", "reference"):
        head = ("from compiled_autograd.autograd import dispatch\n"
                + f"dispatch.use_forward_path({path!r})\n")
        done = subprocess.run([sys.executable, "-c", head + textwrap.dedent(script)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (path, done.returncode, done.stderr[-2000:])
        outs.append(done.stdout)
    return outs


def test_a_tensor_over_a_numpy_scalar_goes_to_the_reference(fast):
    """``Tensor._make`` of a 0-d comparison holds a numpy scalar (the losses make
    such masks): its shape and dtype are Python's to read."""
    c, ref = _in_fresh_process("""
        import numpy as np, compiled_autograd as ca
        import compiled_autograd.nn.functional as F
        x = ca.tensor(0.3, requires_grad=True)
        for loss in (F.smooth_l1_loss(x, ca.tensor(1.0)), F.huber_loss(x, ca.tensor(1.0)),
                     F.logsigmoid(x), x + ca.Tensor._make(np.float32(3.0))):
            x.grad = None
            loss.backward()
            print(float(loss), x.grad)
    """)
    assert c == ref and len(c.splitlines()) == 4


def test_no_half_made_tuple_is_seen_by_a_garbage_collection(fast):
    """A collection (its callbacks see every object) may run at any allocation
    while a node and its saved values are made: no tuple of theirs has a hole."""
    c, ref = _in_fresh_process("""
        import gc, numpy as np, compiled_autograd as ca
        seen = [0]
        def look(phase, info):
            if phase == "start":
                for o in gc.get_objects(info["generation"]):
                    if type(o).__name__ == "MulBackward":
                        seen[0] += 1
                        for part in (o.next_functions, o.saved, o.shapes, o.dtypes):
                            [type(item) for item in part]
        a = ca.tensor(np.ones((3, 300)), requires_grad=True)
        b = ca.tensor(np.ones((3, 300)), requires_grad=True)
        gc.callbacks.append(look)
        gc.set_threshold(1)
        for _ in range(200):
            y = a * b
        gc.callbacks.remove(look)
        print("seen", seen[0] > 0)
    """)
    assert c == ref == "seen True\n"


def test_an_operand_given_by_keyword_fails_as_the_reference(fast):
    """A save spec reads an argument the call did not give positionally."""
    x = ca.tensor(np.ones((2, 3)), requires_grad=True)
    from compiled_autograd.runtime.prims import ops
    errors = []
    for path in ("c", "reference"):
        with pytest.raises(Exception) as info:
            on_path(path, lambda: ops.linear(x, w=np.ones((4, 3))))
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_an_ndarray_subclass_is_saved_as_the_reference_saves_it(fast, tmp_path):
    m = np.memmap(tmp_path / "m.dat", dtype=np.float64, mode="w+", shape=(3,))
    m[:] = [1.0, 2.0, 3.0]
    grads = []
    for path in ("c", "reference"):
        w = ca.from_numpy(m).requires_grad_()
        on_path(path, lambda: (w * w).sum()).backward()
        grads.append(w.grad.numpy())
    np.testing.assert_array_equal(grads[0], [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(grads[0], grads[1])


def test_a_config_the_c_cannot_write_safely_is_refused(fast):
    """forward.c writes a node's fields at the offsets of the slots it was given and
    reads a prim's kernel at an offset: a node class of another kind, or a key that
    is not a prim, is a TypeError when it is made, not memory written wrongly."""
    from compiled_autograd.autograd.tensor import Tensor
    from compiled_autograd.runtime.prims import PRIMS
    config = list(dispatch.forward_config(Tensor))
    at = next(i for i, c in enumerate(config) if isinstance(c, dict) and PRIMS["mul"] in c)
    for plans, message in (({PRIMS["mul"]: (int, False, True, ())}, "subclass"),
                           ({"mul": (None, False, True, ())}, "not a prim")):
        config[at] = plans
        with pytest.raises(TypeError, match=message):
            c_forward.forward(*config)


def test_use_forward_path_sets_what_tensor_ops_call(fast):
    """``dispatch.use_forward_path``: on "c" a Tensor op calls the C forward itself
    (Tensor.__prim_call__ is it); on "reference" the Python reference, which then
    records the same graph; anything else is refused and changes nothing."""
    from compiled_autograd.autograd.tensor import Tensor
    assert Tensor.__dict__["__prim_call__"].__func__ is fast
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    dispatch.use_forward_path("reference")
    try:
        assert Tensor.__dict__["__prim_call__"].__func__ is not fast
        assert dispatch._fast[0] is None
        y = x * 3.0
        assert y.grad_fn.name() == "MulBackward"
    finally:
        dispatch.use_forward_path("c")
    assert Tensor.__dict__["__prim_call__"].__func__ is fast
    with pytest.raises(ValueError, match="path must be 'c' or 'reference'"):
        dispatch.use_forward_path("fast")
    assert Tensor.__dict__["__prim_call__"].__func__ is fast
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_views_share_their_bases_counter_as_the_reference_makes_them(fast):
    """A view made in C: the base's version counter object itself, the version it
    was made at, its creation ("no_grad" in no-grad mode, else its source's), a
    view of a view based on the first base; a reshape that must copy is no view."""
    def run():
        x = ca.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
        a = x * 1.0
        a.add_(1.0)                                   # version 1
        v = a.t()
        w = v[1:]                                     # a view of a view
        with ca.no_grad():
            n = a.reshape(12)
        c = v.reshape(12)                              # not contiguous: a copy
        return x, a, v, w, n, c

    for path in ("c", "reference"):
        x, a, v, w, n, c = on_path(path, run)
        assert v._base is a and w._base is a and n._base is a and c._base is None, path
        assert v._version_counter is a._version_counter is w._version_counter, path
        assert v._view_version == 1 and c._version_counter is not a._version_counter, path
        assert n._creation == "no_grad" and v._creation is None, path
        assert np.shares_memory(w._data, a._data) and c._data.flags.c_contiguous, path
        w.mul_(2.0)                                    # through the view: the base's version
        assert a._version_counter.value == 2, path
        (v.sum() + w.sum() + c.sum()).backward()
        # v: 1, doubled where w doubled a (columns 1-3); w: 2 there; c: 1
        np.testing.assert_array_equal(x.grad.numpy(), [[2, 5, 5, 5]] * 3)


def test_tensor_make_is_the_c_paths_and_makes_the_references_tensor(fast):
    """On "c", ``Tensor._make`` is the C forward's ``make``; on "reference",
    tensor.py's ``_make``: both make a Tensor with the same fields, over the very
    object they are given (a numpy scalar too), each with its own version counter."""
    from compiled_autograd.autograd import tensor as tensor_module
    from compiled_autograd.autograd.tensor import Tensor

    def made():
        a, s = np.arange(3.0, dtype=np.float32), np.float32(2.0)
        ts = [Tensor._make(a), Tensor._make(a), Tensor._make(s)]
        assert ts[0]._data is a and ts[2]._data is s
        assert ts[0]._version_counter is not ts[1]._version_counter
        return [(type(t),) + tuple(getattr(t, k) for k in c_forward.TENSOR_SLOTS
                                   if k not in ("_data", "_version_counter"))
                + (t._version_counter.value,) for t in ts]
    assert Tensor._make == fast.make
    c = made()
    assert on_path("reference", lambda: Tensor.__dict__["_make"].__func__) is tensor_module._make
    assert c == on_path("reference", made)
    assert Tensor._make == fast.make
    with pytest.raises(RuntimeError, match="not initialised"):
        type(fast).__new__(type(fast)).make(np.zeros(1))


@pytest.mark.parametrize("op", ["mul", "slice"])
def test_an_op_on_a_no_grad_view_of_a_tensor_needing_grad_has_a_grad_fn(fast, op):
    """A view made in no-grad mode of a tensor that needs grad has requires_grad
    (its base's) but no grad_fn and no _requires_grad of its own: an op on it with
    grad mode on makes a node (torch: MulBackward0 / SliceBackward0, whose edge to
    the view is empty), so backward through the result runs and leaves x.grad None.
    The C path looked at grad_fn and _requires_grad only: no node, and backward
    raised 'element 0 of tensors does not require grad'."""
    def run():
        x = ca.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
        y = x * 1.0
        with ca.no_grad():
            v = y[1]
        w = v * 2.0 if op == "mul" else v[1:]
        name = type(w.grad_fn).__name__
        w.sum().backward()
        return name, w.requires_grad, x.grad

    ref = on_path("reference", run)
    assert ref == (("MulBackward" if op == "mul" else "SliceBackward"), True, None)
    assert on_path("c", run) == ref
