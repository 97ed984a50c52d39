"""matmul's ``tri``: block-triangular products (runtime/prims_reduce.py), which
causal attention's products take. The rule (``tri_blocks``, ``ca_tri_block``): the
C kernel (kernels.c's ``matmul_tri``) against the numpy reference over shapes,
layouts, broadcasts and dtypes, and the cases the kernel leaves to numpy; the
meaning (the masked product, by blocks of 16; what is outside a triangle is never
read); the derivatives of all six variants against central differences (double
backward too) and the closure TRI_VJP states; every backend against eager; causal
scaled_dot_product_attention against torch on every backend, the graph it records,
and an infinity in the values."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.compiled.api import stats
from compiled_autograd.runtime import kernels
from compiled_autograd.runtime.prims import ops
from compiled_autograd.runtime.prims_reduce import TRI, TRI_BLOCK, TRI_VJP, matmul_tri_numpy
from helpers import BACKENDS, assert_backend_matches, needs_torch, torch

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")
F = ca.nn.functional


def _mask(rows, cols, lower):
    """The block-granular triangle of a rows x cols matrix."""
    i = np.arange(rows)[:, None] // TRI_BLOCK
    j = np.arange(cols)[None, :] // TRI_BLOCK
    return i >= j if lower else i <= j


def _formula(a, b, tri):
    """What ``tri`` means, for finite inputs: the masked product."""
    side, part = tri.split("_")
    lower = part == "lower"
    if side == "a":
        return np.matmul(np.where(_mask(*a.shape[-2:], lower), a, 0), b)
    if side == "b":
        return np.matmul(a, np.where(_mask(*b.shape[-2:], lower), b, 0))
    out = np.matmul(a, b)
    return np.where(_mask(*out.shape[-2:], lower), out, 0)


def _kernel():
    k = kernels.native("matmul_tri")
    if k is None:
        pytest.skip("the forward's C kernels are off or not built")
    return k


SIZES = [(0, 3, 4), (1, 1, 1), (5, 3, 17), (16, 16, 16), (17, 5, 33), (33, 40, 16),
         (64, 32, 64), (64, 0, 64), (20, 64, 45)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tri", TRI)
def test_the_kernel_is_its_reference_over_shapes_layouts_and_broadcasts(tri, dtype):
    kernel, rng = _kernel(), np.random.default_rng(0)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    for M, K, N in SIZES:
        for a_batch, b_batch in [((), ()), ((2, 3), (3,)), ((3,), (2, 1)), ((1,), (4,))]:
            a = rng.standard_normal(a_batch + (M, K)).astype(dtype)
            b = rng.standard_normal(b_batch + (K, N)).astype(dtype)
            views = [(a, b),
                     # transposed views (column-major last two dims)
                     (np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2),
                      np.swapaxes(np.ascontiguousarray(np.swapaxes(b, -1, -2)), -1, -2)),
                     # a window of a wider matrix (q in attention's qkv)
                     (np.concatenate([a, a, a], -1)[..., K:2 * K], b)]
            want = matmul_tri_numpy(a, b, tri)
            np.testing.assert_allclose(want, _formula(a, b, tri), rtol=tol, atol=tol)
            for x, y in views:
                got = kernel(x, y, TRI.index(tri) + 1)
                assert got is not NotImplemented and got.dtype == dtype
                assert got.shape == want.shape and got.flags.c_contiguous
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
                # what the blocks leave out is exactly 0
                assert np.all(got[_formula(np.ones_like(x), np.ones_like(y), tri) == 0] == 0)


def test_what_the_kernel_leaves_to_numpy_and_bad_codes():
    kernel, rng = _kernel(), np.random.default_rng(1)
    a, b = rng.standard_normal((20, 8)), rng.standard_normal((8, 20))
    code = TRI.index("a_lower") + 1
    for x, y in [(a.astype(np.int64), b.astype(np.int64)),      # integers
                 (a.astype(np.float32), b),                       # mixed dtypes
                 (np.broadcast_to(a[:1], (20, 8)), b)]:           # rows of stride 0
        assert kernel(x, y, code) is NotImplemented
        got = ops.matmul(x, y, tri="a_lower")                     # the numpy reference
        np.testing.assert_allclose(got, _formula(x.astype(np.float64), y, "a_lower"), rtol=1e-6)
    with pytest.raises(ValueError, match="tri must be 1..6"):
        kernel(a, b, 7)
    with pytest.raises(ValueError, match="tri must be None or one of"):
        ops.matmul(a, b, tri="lower")


@pytest.mark.parametrize("tri", [t for t in TRI if not t.startswith("out_")])
def test_entries_outside_the_triangle_are_never_read(tri):
    """An infinity outside the kept triangle of an operand does not reach the
    product; one inside does (as the reference's)."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((40, 40)), rng.standard_normal((40, 40))
    side, part = tri.split("_")
    target = a if side == "a" else b
    outside = ~_mask(40, 40, part == "lower")
    r, c = np.argwhere(outside)[len(np.argwhere(outside)) // 2]
    target[r, c] = np.inf
    got = ops.matmul(a, b, tri=tri)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, matmul_tri_numpy(a, b, tri), rtol=1e-12)
    inside = np.argwhere(~outside)[5]
    target[tuple(inside)] = np.inf
    assert not np.isfinite(ops.matmul(a, b, tri=tri)).all()


def _central(f, arrays, eps=1e-6):
    """d sum(f * w) / d each array, by central differences (float64)."""
    grads = []
    for x in arrays:
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            hi = f()
            x[idx] = old - eps
            lo = f()
            x[idx] = old
            g[idx] = (hi - lo) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("tri", TRI)
def test_each_variant_s_gradients_against_central_differences(tri):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 19, 18)), rng.standard_normal((2, 18, 21))
    w = rng.standard_normal((2, 19, 21))
    num = _central(lambda: float((_formula(a, b, tri) * w).sum()), [a, b])
    ta, tb = (ca.tensor(x, dtype=np.float64, requires_grad=True) for x in (a, b))
    out = ops.matmul(ta, tb, tri=tri)
    (out * ca.tensor(w, dtype=np.float64)).sum().backward()
    for got, want in zip((ta.grad.numpy(), tb.grad.numpy()), num):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # the gradient is zero outside the kept triangle of an operand
    side, part = tri.split("_")
    if side in ("a", "b"):
        g = (ta if side == "a" else tb).grad.numpy()
        rows, cols = g.shape[-2:]
        assert np.all(g[..., ~_mask(rows, cols, part == "lower")] == 0)


@pytest.mark.parametrize("tri", TRI)
def test_the_backward_s_products_are_the_variants_tri_vjp_names(tri):
    a = ca.tensor(np.ones((3, 20, 20)), requires_grad=True)
    b = ca.tensor(np.ones((3, 20, 20)), requires_grad=True)
    graph = ca.trace_backward(ops.matmul(a, b, tri=tri).sum()).graph
    got = sorted(str(n.kwargs.get("tri")) for n in graph.nodes if n.target == "matmul")
    assert got == sorted(map(str, TRI_VJP[tri]))


@pytest.mark.parametrize("tri, M, K, N", [("a_lower", 17, 18, 3), ("out_lower", 17, 3, 18),
                                          ("b_lower", 3, 5, 18)])
def test_double_backward_against_central_differences_of_the_gradient(tri, M, K, N):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    w, v = rng.standard_normal((M, N)), rng.standard_normal((M, K))

    def grad_a_dot_v():
        ta = ca.tensor(a, dtype=np.float64, requires_grad=True)
        tb = ca.tensor(b, dtype=np.float64, requires_grad=True)
        loss = (ops.matmul(ta * ta, tb, tri=tri) * ca.tensor(w, dtype=np.float64)).sum()
        (ga,) = ca.autograd.grad(loss, [ta], create_graph=True)
        return ta, tb, (ga * ca.tensor(v, dtype=np.float64)).sum()
    ta, tb, second = grad_a_dot_v()
    second.backward()
    num = _central(lambda: float(grad_a_dot_v()[2].detach().numpy()), [a, b])
    np.testing.assert_allclose(ta.grad.numpy(), num[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tb.grad.numpy(), num[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_backend_against_eager_with_a_cache_hit(backend, dtype):
    """All six variants in one loss, batched, 37 rows (not a multiple of 16);
    twice, the second backward a cache hit with new values."""
    def grads(seed):
        rng = np.random.default_rng(seed)
        a = ca.tensor(rng.standard_normal((2, 37, 29)), dtype=dtype, requires_grad=True)
        b = ca.tensor(rng.standard_normal((2, 29, 37)), dtype=dtype, requires_grad=True)
        loss = sum((ops.matmul(a, b, tri=t) * float(k + 1)).tanh().sum()
                   for k, t in enumerate(TRI))
        if backend == "eager":
            loss.backward()
        else:
            with ca.compiled_backward(backend=backend):
                loss.backward()
        return a.grad.numpy(), b.grad.numpy()

    hits = stats["cache_hits"]
    for seed in (5, 6):
        want = _eager_grads(dtype, seed)
        for got, w in zip(grads(seed), want):
            assert_backend_matches(backend, w, got)
    if backend != "eager":
        assert stats["cache_hits"] == hits + 1       # the second backward


def _eager_grads(dtype, seed):
    rng = np.random.default_rng(seed)
    a = ca.tensor(rng.standard_normal((2, 37, 29)), dtype=dtype, requires_grad=True)
    b = ca.tensor(rng.standard_normal((2, 29, 37)), dtype=dtype, requires_grad=True)
    sum((ops.matmul(a, b, tri=t) * float(k + 1)).tanh().sum()
        for k, t in enumerate(TRI)).backward()
    return a.grad.numpy(), b.grad.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_sizes_run_the_blocks_on_symbolic_sizes(backend):
    """A sequence length that changes: the C backend's blocks are taken at run
    time (ca_tri_block on symbolic sizes)."""
    for n in (20, 37, 50):
        rng = np.random.default_rng(n)
        q, k, v = (ca.tensor(rng.standard_normal((2, n, 8)), dtype=np.float64,
                             requires_grad=True) for _ in range(3))
        loss = (F.scaled_dot_product_attention(q, k, v, is_causal=True) ** 2).sum()
        if backend == "eager":
            loss.backward()
        else:
            with ca.compiled_backward(backend=backend, dynamic=True):
                loss.backward()
        want = _sdpa_reference_grads(n)
        for t, w in zip((q, k, v), want):
            np.testing.assert_allclose(t.grad.numpy(), w, rtol=1e-10, atol=1e-12)


def _sdpa_reference_grads(n):
    """Gradients of sum(sdpa(q, k, v) ** 2) for the same q, k, v, by eager autograd
    on the plain (masked_fill) formula."""
    rng = np.random.default_rng(n)
    q, k, v = (ca.tensor(rng.standard_normal((2, n, 8)), dtype=np.float64, requires_grad=True)
               for _ in range(3))
    mask = ca.from_numpy(np.tril(np.ones((n, n), dtype=bool)))
    scores = (q @ k.transpose(-2, -1)) * (1 / np.sqrt(8))
    y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    (y ** 2).sum().backward()
    return q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


SDPA_SHAPES = [(2, 3, 64, 64, 32), (1, 2, 37, 37, 8), (2, 1, 20, 45, 16), (1, 1, 50, 18, 4),
               (1, 2, 1, 1, 1)]


@needs_torch
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_causal_attention_against_torch_on_every_backend(backend, dtype):
    rng = np.random.default_rng(7)
    tol = 1e-10 if dtype == np.float64 else 1e-4
    for b, h, L, S, d in SDPA_SHAPES:
        arrays = [rng.standard_normal((b, h, n, d)).astype(dtype) for n in (L, S, S)]
        w = rng.standard_normal((b, h, L, d)).astype(dtype)
        tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in arrays)
        ty = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        (ty * torch.tensor(w)).sum().backward()
        cq, ck, cv = (ca.tensor(x, dtype=dtype, requires_grad=True) for x in arrays)
        cy = F.scaled_dot_product_attention(cq, ck, cv, is_causal=True)
        loss = (cy * ca.tensor(w, dtype=dtype)).sum()
        if backend == "eager":
            loss.backward()
        else:
            with ca.compiled_backward(backend=backend):
                loss.backward()
        np.testing.assert_allclose(cy.detach().numpy(), ty.detach().numpy(), rtol=tol, atol=tol)
        for c, t in ((cq, tq), (ck, tk), (cv, tv)):
            np.testing.assert_allclose(c.grad.numpy(), t.grad.numpy(), rtol=tol, atol=tol)


def test_only_causal_attention_without_a_mask_records_tri():
    rng = np.random.default_rng(8)
    q, k, v = (ca.tensor(rng.standard_normal((1, 2, 20, 8)), requires_grad=True)
               for _ in range(3))

    def tris(**kw):
        y = F.scaled_dot_product_attention(q, k, v, **kw)
        graph = ca.trace_backward(y.sum()).graph
        return sorted(str(n.kwargs.get("tri")) for n in graph.nodes if n.target == "matmul")
    assert tris(is_causal=True) == sorted(map(str, TRI_VJP["out_lower"] + TRI_VJP["a_lower"]))
    assert tris() == ["None"] * 4
    mask = ca.from_numpy(np.tril(np.ones((20, 20), dtype=bool)))
    assert tris(attn_mask=mask) == ["None"] * 4


@needs_torch
def test_an_infinity_in_the_values_reaches_only_the_rows_of_its_block():
    """v holds an infinity at key 40: rows 0..31 (earlier blocks of 16) never
    read it and stay finite, the exact causal result; rows 32..39 of its block
    are NaN (their zero weight times infinity); from row 40 on it is attended to
    (infinite). torch 2.13's CPU attention takes keys by blocks longer than 64:
    every row before 40 is NaN there (the values compared where it is finite)."""
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, 1, 64, 8)) for _ in range(3))
    v[0, 0, 40, 3] = np.inf
    ours = F.scaled_dot_product_attention(*(ca.tensor(x, dtype=np.float64) for x in (q, k, v)),
                                          is_causal=True).numpy()[0, 0, :, 3]
    assert np.isfinite(ours[:32]).all()
    assert np.isnan(ours[32:40]).all() and np.isinf(ours[40:]).all()
    theirs = torch.nn.functional.scaled_dot_product_attention(
        *(torch.tensor(x) for x in (q, k, v)), is_causal=True).numpy()[0, 0, :, 3]
    assert np.isinf(theirs[40:]).all()
    np.testing.assert_allclose(ours[:32][np.isfinite(theirs[:32])],
                               theirs[:32][np.isfinite(theirs[:32])], rtol=1e-12)
