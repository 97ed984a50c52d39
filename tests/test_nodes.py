"""The Node contract on every Node type: name, next_functions, metadata,
compiled_args (a deterministic key), and apply_with_saved == apply."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.compiled.compiled_args import CompiledNodeArgs, SwapSavedVariables
from compiled_autograd.autograd.node import AccumulateGrad, CopySlices, Node
from op_cases import CASES, make_inputs


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_node_type_implements_the_contract():
    classes = list(_all_subclasses(Node))
    assert AccumulateGrad in classes and CopySlices in classes
    concrete = [c for c in classes if getattr(c, "prim", True) is not None]
    assert len(concrete) >= 40
    for cls in concrete:
        for method in ("apply", "compiled_args", "apply_with_saved"):
            assert getattr(cls, method) is not getattr(Node, method), (cls, method)


def _walk(root):
    seen, order, stack = set(), [], [root]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        order.append(fn)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return order


def _upstream(node, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape, dtype in node.input_metadata]


@pytest.mark.parametrize("name,fn,specs", CASES, ids=[c[0] for c in CASES])
def test_apply_with_saved_equals_apply(name, fn, specs):
    arrays, grads = make_inputs(specs, seed=2)
    inputs = [ca.tensor(a, requires_grad=True) if g else ca.from_numpy(a)
              for a, g in zip(arrays, grads)]
    out = fn(ca, *inputs)
    seen_types = set()
    for i, node in enumerate(_walk(out.grad_fn)):
        if isinstance(node, AccumulateGrad):
            continue
        seen_types.add(type(node))
        g = _upstream(node, i)
        eager = node.apply(g)
        traced = node.apply_with_saved(g, SwapSavedVariables())
        assert len(eager) == len(traced) == len(node.next_functions)
        for e, t in zip(eager, traced):
            assert (e is None) == (t is None)
            if e is not None:
                np.testing.assert_array_equal(np.asarray(e), np.asarray(t))
    assert seen_types


def test_compiled_args_is_deterministic_and_sensitive():
    def key_of(shape, dim, scale=2.0, keepdim=False):
        x = ca.randn(*shape, requires_grad=True)
        out = (x.exp() * scale).sum(dim, keepdim=keepdim)
        args = CompiledNodeArgs()
        for node in _walk(out.grad_fn):
            node.compiled_args(args)
        return args.freeze(), tuple(args.sizes), tuple(args.scalars)

    assert key_of((3, 4), 1) == key_of((3, 4), 1)
    # Sizes and saved Python floats are runtime values the cache compares, not
    # structure: a new size may become dynamic, a new scalar is just a new input.
    assert key_of((3, 4), 1)[0] == key_of((3, 5), 1)[0]
    assert key_of((3, 4), 1)[1] != key_of((3, 5), 1)[1]
    assert key_of((3, 4), 1)[0] == key_of((3, 4), 1, 3.0)[0]
    assert key_of((3, 4), 1)[2] == (2.0,) and key_of((3, 4), 1, 3.0)[2] == (3.0,)
    # Dims that index (dim, dims, perm) and flags are keys; shape-like ints in
    # params are compared like sizes.
    assert key_of((3, 4), 1)[0] != key_of((3, 4), 0)[0]
    assert key_of((3, 4), 1)[0] != key_of((3, 4), 1, keepdim=True)[0]


def test_compiled_args_collects_saved_variables():
    x = ca.randn(3, requires_grad=True)
    y = x.tanh()
    args = CompiledNodeArgs()
    y.grad_fn.compiled_args(args)
    assert len(args.saved) == 1 and args.saved[0].shape == (3,)


def test_node_api():
    a = ca.randn(2, 3, requires_grad=True)
    b = ca.randn(3, requires_grad=True)
    out = (a * b).sum()
    fn = out.grad_fn
    assert fn.name() == "SumBackward"
    mul = fn.next_functions[0][0]
    assert mul.name() == "MulBackward"
    acc_a, acc_b = mul.next_functions[0][0], mul.next_functions[1][0]
    assert isinstance(acc_a, AccumulateGrad) and acc_a.variable is a and acc_b.variable is b
    assert a.grad_fn is None and a.is_leaf
    mul.metadata["tag"] = 1
    assert mul.metadata == {"tag": 1}
    # One AccumulateGrad per leaf while the graph lives.
    c = a * 3
    assert c.grad_fn.next_functions[0][0] is acc_a


def _collect_both_ways(loss, inputs=None):
    from compiled_autograd.autograd import engine
    from compiled_autograd.compiled import collection
    roots = engine.make_root_grads([loss], None, False)
    edges = None if inputs is None else engine.edges_of(inputs, "inputs")
    out = []
    for record in (True, False):
        task = engine.make_task(roots, keep_graph=True, create_graph=False, input_edges=edges,
                                accumulate=inputs is None)
        out.append(collection.collect(task, roots, record=record))
    return out


@pytest.mark.parametrize("case", ["mlp", "checkpointed", "hooked", "partial"])
def test_cache_hit_collection_equals_the_recording_one(case):
    """A cache hit collects without noting positions (record=False); it must
    collect exactly what the recording collection (the one traced) does."""
    from compiled_autograd.examples import build
    inputs = None
    if case in ("mlp", "checkpointed"):
        ex = build("mlp", layers=3, width=8, batch=4,
                   checkpoint="layer" if case == "checkpointed" else "none")
        loss = ex.loss()
    else:
        a = ca.randn(3, requires_grad=True)
        b = ca.randn(3, requires_grad=True)
        x = a * b
        x.register_hook(lambda g: g * 2)
        x.grad_fn.register_prehook(lambda gs: None)
        loss = (x.exp() * 1.5).sum()
        inputs = [a] if case == "partial" else None
    recorded, fast = _collect_both_ways(loss, inputs)
    assert recorded.freeze() == fast.freeze()
    assert recorded.sizes == fast.sizes and recorded.scalars == fast.scalars
    assert [id(v) for v in recorded.inputs] == [id(v) for v in fast.inputs]
    assert [id(v) for v in recorded.plain] == [id(v) for v in fast.plain]
    assert recorded.hooks == fast.hooks and recorded.packed_data == fast.packed_data
    assert recorded.saved == fast.saved and recorded.release_nodes == fast.release_nodes
    assert not fast.slot and not fast.size_pos and recorded.slot and recorded.size_pos


def test_a_removed_hook_leaves_the_key_of_an_unhooked_graph():
    def key(hook):
        x = ca.randn(3, requires_grad=True)
        y = x.exp()
        if hook:
            y.register_hook(lambda g: g).remove()
            y.grad_fn.register_prehook(lambda gs: None).remove()
        return _collect_both_ways(y.sum())[1].freeze()
    assert key(True) == key(False)


def test_a_node_that_holds_only_what_it_collects_holds_nothing_else():
    """``Node.holds_only_collected``: a compiled backward asks no such node to
    release anything, since it releases the saved values collected itself; so
    each saved value such a node holds is collected. The others (CopySlices
    here) are asked."""
    from compiled_autograd.autograd import Function

    class Cube(Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, None, y)
            return x * x * x + y

        @staticmethod
        def backward(ctx, g):
            x, _, y = ctx.saved_tensors
            return g * 3 * x * x, g
    a = ca.randn(4, requires_grad=True)
    b = ca.randn(4, requires_grad=True)
    h = Cube.apply(a.tanh(), b * 2)
    h = h * 1.0
    h[1:3].mul_(2.0)           # (a CopySlices node)
    loss = (h.exp() * b).sum()
    recorded, fast = _collect_both_ways(loss)
    nodes, stack = [], [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is not None and fn not in nodes:
            nodes.append(fn)
            stack += [nxt for nxt, _ in fn.next_functions]
    kinds = {type(fn).__name__ for fn in nodes}
    assert {"CubeBackward", "CopySlices", "AccumulateGrad", "TanhBackward"} <= kinds
    for collected in (recorded, fast):
        saved = {id(sv) for sv in collected.saved}
        for fn in nodes:
            if fn.holds_only_collected:
                assert all(id(sv) in saved for sv in fn.saved_variables()), fn.name()
        assert {id(fn) for fn in collected.release_nodes} == {
            id(fn) for fn in nodes if not fn.holds_only_collected}
        assert [fn.name() for fn in collected.release_nodes] == ["CopySlices"]
