"""Backend "c": a sum of slice gradients whose windows are disjoint along one dim
(``x.chunk(3, -1)``'s backward) is written as one concatenation (codegen/c_concat.py):
each gradient copied into its window, zeros only in a gap, no zero fill of the
whole and no add. Gradients against eager, torch and central differences; the
cases that keep the old code (overlap, step 2, a symbolic size, another user)
against eager; the generated C counted."""
import contextlib
import re

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen import c_concat
from compiled_autograd.codegen.c import generate
from helpers import BACKENDS, assert_backend_matches, needs_cc, needs_torch, run_torch

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")

# A loop statement writing a zero: slice_backward's fill of its whole result,
# or the fill of a gap in a concatenation.
ZERO_FILL = re.compile(r"^\s*(\w+)\[[^\]]*\] = \(\((?:float|double)\)0\);$", re.M)


def _chunk3_last(lib, x):
    a, b, c = x.chunk(3, -1)
    return a * b.sin() + c.exp() * a


def _split_dim0(lib, x):
    a, b = x.split([2, 4], 0)            # uneven, along dim 0
    return a.tanh().sum(0) + (b * b).sum(0)


def _split_middle_3d(lib, x):
    p, q, r = x.split([2, 4, 1], dim=1)  # dim 1 of 3
    return p.exp().sum(1) + (q * q).sum(1) + r.sin().sum(1)


def _narrow_and_index(lib, x):
    a, b, c = x.narrow(1, 0, 2), x[:, 2:5], x[:, 5:]
    return a.sum(1) * b.cos().sum(1) + c.sum(1)


def _split_five_with_empty(lib, x):
    ps = x.split([1, 2, 0, 3, 2], 1)     # one window empty; a chain of four adds
    out = ps[0].sum(1)
    for k, p in enumerate(ps[1:]):
        out = out + (p * (k + 1.0)).exp().sum(1)
    return out


def _attention(lib, x):
    qkv = x * 0.5 + 1.0
    q, k, v = qkv.chunk(3, -1)
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v


# name -> (function, x's shape, the windows' dim, their starts, the gaps)
TILED = {
    "chunk3_last": (_chunk3_last, (4, 6), 1, (0, 2, 4), ()),
    "split_dim0": (_split_dim0, (6, 5), 0, (0, 2), ()),
    "split_middle_3d": (_split_middle_3d, (2, 7, 3), 1, (0, 2, 6), ()),
    "narrow_and_index": (_narrow_and_index, (3, 7), 1, (0, 2, 5), ()),
    "attention": (_attention, (2, 5, 12), 2, (0, 4, 8), ()),
    "split_five_with_empty": (_split_five_with_empty, (3, 8), 1, (0, 1, 3, 6), ()),
}


def _gap(lib, x):
    return x[:, :2].exp() * x[:, 3:].sum(1, keepdim=True)   # column 2 unread


def _overlap(lib, x):
    return x[:, :3].sin().sum(1) * x[:, 2:].sum(1)         # column 2 in both


def _step2(lib, x):
    return x[:, ::2] * x[:, 1::2].exp()                    # interleaved


def _also_used_whole(lib, x):
    a, b = x.chunk(2, -1)
    return (a * b).sum(1) + x.exp().sum(1)


FALLBACK = {"overlap": (_overlap, (3, 5)), "step2": (_step2, (3, 6)),
            "also_used_whole": (_also_used_whole, (3, 6))}


def _x(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _grad(fn, x_np, backend=None, dtype=np.float32):
    """x's gradient of fn(x) against a fixed random upstream gradient, eager
    (``backend=None``) or compiled."""
    x = ca.tensor(x_np, dtype=dtype, requires_grad=True)
    out = fn(ca, x)
    up = ca.tensor(_x(out.shape, dtype, seed=1), dtype=dtype)
    _backward(out, backend, up)
    return x.grad.numpy()


def _backward(out, backend, grad=None):
    """out.backward(grad), eagerly (``backend=None``) or compiled."""
    with ca.compiled_backward(backend=backend) if backend else contextlib.nullcontext():
        out.backward(grad)


def _traced(fn, shape, dtype=np.float32):
    x = ca.tensor(_x(shape, dtype), dtype=dtype, requires_grad=True)
    out = fn(ca, x)
    return ca.trace_backward(out, grad_outputs=ca.tensor(_x(out.shape, dtype, seed=1),
                                                         dtype=dtype))


def _slice_grads(graph):
    return [n for n in graph.nodes if n.target == "slice_backward"]


# ---------------------------------------------------------------- the plan

@pytest.mark.parametrize("name", sorted(TILED))
def test_a_tiled_sum_is_planned_with_its_windows(name):
    fn, shape, d, starts, gaps = TILED[name]
    graph = _traced(fn, shape).graph
    plans = c_concat.tiled_sums(graph)
    assert len(plans) == 1
    (root, tiling), = plans.items()
    assert root.target == "add" and tiling.dim == d and tiling.gaps == gaps
    assert tuple(s for s, _ in tiling.pieces) == starts
    # every slice gradient and every inner add of the sum is absorbed, nothing else
    inner, stack = set(), [root]
    while stack:
        stack += [a for a in stack.pop().args
                  if getattr(a, "target", None) == "add" and a not in inner]
        inner |= set(stack)
    assert tiling.members == set(_slice_grads(graph)) | inner


@pytest.mark.parametrize("name", ["overlap", "step2"])
def test_windows_that_overlap_or_step_are_not_planned(name):
    fn, shape = FALLBACK[name]
    assert c_concat.tiled_sums(_traced(fn, shape).graph) == {}


def test_a_gap_is_planned_as_zeros_in_the_gap_only():
    graph = _traced(_gap, (3, 6)).graph
    (tiling,) = c_concat.tiled_sums(graph).values()
    assert tiling.gaps == ((2, 3),) and [s for s, _ in tiling.pieces] == [0, 3]


def test_a_slice_gradient_read_elsewhere_too_is_not_absorbed():
    graph = _traced(_chunk3_last, (4, 6)).graph
    assert c_concat.tiled_sums(graph)
    sb = _slice_grads(graph)[0]
    out = graph.output_node
    graph.nodes.remove(out)
    extra = graph.create_node("call_function", "neg", (sb,), meta=dict(sb.meta))
    graph.nodes.append(out)
    out.args = ((extra,),)
    extra.users[out] = None
    sb.users[extra] = None
    graph.lint()
    assert c_concat.tiled_sums(graph) == {}
    # the old code: every slice gradient fills its whole buffer with zeros
    assert len(ZERO_FILL.findall(generate(graph).source)) == len(_slice_grads(graph))


def test_the_sum_of_a_symbolic_size_is_not_planned():
    graphs = []
    for n in (6, 9):
        x = ca.tensor(_x((2, n), np.float32), requires_grad=True)
        with ca.compiled_backward(backend=lambda gm: graphs.append(gm.graph) or gm,
                                  dynamic=True):
            _chunk3_last(ca, x).sum().backward()
    assert _slice_grads(graphs[-1]) and c_concat.tiled_sums(graphs[-1]) == {}


def _nested(lib, x):
    a, b = x.chunk(2, -1)
    a1, a2 = a.chunk(2, -1)
    return (a1 * a2.exp() + a1).sum(1) + b.sin().sum(1)


@needs_cc
def test_a_chunk_of_a_chunk_is_two_concatenations():
    # a's gradient (the inner sum) is a window gradient of x's (the outer sum)
    graph = _traced(_nested, (3, 8)).graph
    plans = c_concat.tiled_sums(graph)
    assert sorted(t.dim for t in plans.values()) == [1, 1]
    inner, outer = sorted(plans, key=graph.nodes.index)
    assert outer.args[0].args[0] is inner or outer.args[1].args[0] is inner
    assert ZERO_FILL.findall(generate(graph).source) == []
    for dtype in (np.float32, np.float64):
        x = _x((3, 8), dtype)
        assert_backend_matches("c", _grad(_nested, x, dtype=dtype), _grad(_nested, x, "c", dtype))


# ---------------------------------------------------------------- the C

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_tiled_sum_has_no_zero_fill_and_no_add(dtype):
    graph = _traced(_chunk3_last, (4, 6), dtype).graph
    source = generate(graph).source
    assert ZERO_FILL.findall(source) == []
    # one copy loop per window, each writing a 4 x 2 block of the 4 x 6 result
    block = source[source.index("/* SliceBackward */"):]
    block = block[:block.index("/*", 3)] if "/*" in block[3:] else block
    copies = re.findall(r"^\s*(\w+)\[([^\]]*)\] = (\w+)\[[^\]]*\];$", block, re.M)
    assert len(copies) == 3 and len({dst for dst, _, _ in copies}) == 1
    assert " + " not in "".join(src for _, _, src in copies)


def test_the_old_code_fills_each_slice_gradient_and_adds():
    source = generate(_traced(_overlap, (3, 5)).graph).source
    assert len(ZERO_FILL.findall(source)) == 2


def test_a_gap_is_the_only_zero_fill():
    source = generate(_traced(_gap, (3, 6)).graph).source
    fills = ZERO_FILL.findall(source)
    assert len(fills) == 1
    # a loop over the 3 rows of column 2, not over the 18 elements
    fill = next(m for m in re.finditer(r"for \(int64_t i0 = 0; i0 < (\d+);[^\n]*\n\s*(\w+)\[",
                                       source) if m.group(2) == fills[0]
                and re.search(rf"{fills[0]}\[[^\]]*\] = \(\(float\)0\)",
                              source[m.start():m.start() + 200]))
    assert fill.group(1) == "3"


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(TILED) + ["gap"])
def test_tiled_gradients_match_eager(name, dtype, backend):
    fn, shape = (_gap, (3, 6)) if name == "gap" else TILED[name][:2]
    x = _x(shape, dtype)
    eager = _grad(fn, x, dtype=dtype)
    assert_backend_matches(backend, eager, _grad(fn, x, backend, dtype))
    if name == "gap":
        assert np.all(eager[:, 2] == 0)


@needs_cc
@needs_torch
@pytest.mark.parametrize("name", sorted(TILED) + ["gap"])
def test_tiled_gradients_match_torch(name):
    fn, shape = (_gap, (3, 6)) if name == "gap" else TILED[name][:2]
    x = _x(shape, np.float64)
    _, (expected,) = run_torch(fn, [x], [True], dtype=np.float64, upstream_seed=7)
    xt = ca.tensor(x, dtype=np.float64, requires_grad=True)
    out = fn(ca, xt)
    up = np.random.default_rng(7).standard_normal(out.shape)
    with ca.compiled_backward(backend="c"):
        out.backward(ca.tensor(up, dtype=np.float64))
    np.testing.assert_allclose(xt.grad.numpy(), expected, rtol=1e-10, atol=1e-12)


@needs_cc
def test_tiled_gradient_matches_central_differences():
    x = _x((3, 7), np.float64)
    up = _x((3,), np.float64, seed=1)

    def f(v):
        return float((_narrow_and_index(ca, ca.tensor(v, dtype=np.float64)).numpy()
                      * up).sum())
    grad = _grad(_narrow_and_index, x, "c", np.float64)
    eps, numeric = 1e-6, np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        numeric[i] = (f(x + d) - f(x - d)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FALLBACK))
def test_fallback_gradients_match_eager(name, backend):
    fn, shape = FALLBACK[name]
    for dtype in (np.float32, np.float64):
        x = _x(shape, dtype)
        assert_backend_matches(backend, _grad(fn, x, dtype=dtype),
                               _grad(fn, x, backend, dtype))


@needs_cc
def test_a_leaf_chunked_gets_its_grad_accumulated():
    # the sum is x's gradient itself: written straight into the array .grad gets,
    # and added to a gradient x already has
    def run(backend):
        x = ca.tensor(_x((4, 6), np.float32), requires_grad=True)
        for _ in range(2):
            out = _chunk3_last(ca, x).sum()
            _backward(out, backend)
        return x.grad.numpy()
    np.testing.assert_allclose(run("c"), run(None), rtol=1e-5, atol=1e-6)


@needs_cc
def test_a_hook_on_the_chunked_tensor_sees_the_whole_gradient():
    seen = {}

    def run(backend):
        w = ca.tensor(_x((4, 6), np.float32), requires_grad=True)
        x = w * 2.0
        x.register_hook(lambda g: (seen.setdefault(backend, g.numpy().copy()), g * 3.0)[1])
        out = _chunk3_last(ca, x).sum()
        _backward(out, backend)
        return w.grad.numpy()
    np.testing.assert_allclose(run("c"), run(None), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(seen["c"], seen[None], rtol=1e-5, atol=1e-6)


def _heads(lib, x):
    """Attention on heads split from one projection (a transformer's q, k, v):
    each piece's gradient is a reshape of a transposed product, which copies."""
    b, n, width = x.shape
    q, k, v = (z.reshape(b, n, 2, width // 6).transpose(1, 2) for z in x.chunk(3, -1))
    y = lib.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return y.transpose(1, 2).reshape(b, n, width // 3)


def _copy_loops(source):
    """Loop statements that copy one array into another, element for element."""
    return re.findall(r"^\s*\w+\[[^\]]*\] = \w+\[[^\]]*\];$", source, re.M)


@needs_cc
def test_a_piece_that_is_a_reshape_is_copied_once(monkeypatch):
    """The heads' gradients, transposed back, are reshapes that copy: each one's
    input is copied straight into its window seen in its shape, one copy where
    the reshape's own copy and then the window's made two."""
    graph = _traced(_heads, (2, 5, 24)).graph
    (tiling,) = c_concat.tiled_sums(graph).values()
    assert len(tiling.reshapes) == 3 and tiling.reshapes <= tiling.members
    assert all(g.target == "reshape" for _, g in tiling.pieces)
    once = _copy_loops(generate(graph).source)
    monkeypatch.setattr(c_concat, "_is_sole_reshape", lambda n: False)
    twice = _copy_loops(generate(graph).source)
    assert len(twice) - len(once) == 3
    monkeypatch.undo()
    for dtype in (np.float32, np.float64):
        x = _x((2, 5, 24), dtype)
        assert_backend_matches("c", _grad(_heads, x, dtype=dtype), _grad(_heads, x, "c", dtype))


def test_a_strided_window_is_reshaped_as_numpy_reshapes_it_without_a_copy():
    from compiled_autograd.codegen.c_layout import Storage, Val, strided_reshape
    base = np.zeros((4, 6, 8, 10), np.float32)
    f32 = np.dtype(np.float32)
    cases = [(base[:, :, :, 2:6], (4, 6, 8, 2, 2)), (base[:, :, 1:5, :], (4, 6, 40)),
             (base[:, :, 1:5, :], (24, 4, 10)), (base.transpose(0, 2, 1, 3), (4, 8, 60)),
             (base.transpose(0, 2, 1, 3), (32, 6, 10)), (base[:, 1:3], (8, 8, 10)),
             (base[:, :, :, ::2], (4, 6, 40)), (base[:1, :, :, 3:7], (6, 8, 2, 2)),
             (base[:, :, :, 2:6], (1, 4, 6, 8, 4, 1)), (base, (24, 80))]
    for arr, shape in cases:
        offset = (arr.ctypes.data - base.ctypes.data) // 4
        v = Val(Storage("arena", 0, f32, base.shape, 0), f32, arr.shape,
                tuple(s // 4 for s in arr.strides), offset)
        got = strided_reshape(v, shape)
        try:
            view = arr.view()
            view.shape = shape          # numpy's reshape without a copy, or an error
        except AttributeError:
            assert got is None, (arr.strides, shape)
            continue
        assert got is not None and got.offset == offset and tuple(got.shape) == shape
        assert [s for s, n in zip(got.strides, shape) if n != 1] == \
            [s // 4 for s, n in zip(view.strides, shape) if n != 1]
