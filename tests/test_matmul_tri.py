"""matmul's ``tri`` (runtime/prims_reduce.py): block-triangular products by blocks
of TRI_BLOCK = 16.

- the rule: ``tri_blocks`` covers each output entry once (a_*, b_*) or exactly the
  kept ones (out_*), and each block reads exactly its operand's kept triangle; the
  C kernel (kernels.c's matmul_tri) against ``matmul_tri_numpy`` over shapes,
  broadcast batches, transposed and strided views, float32 and float64; where the
  kernel declines (NotImplemented) and the prim falls back; bad ``tri`` values;
- the meaning: each variant equals the masked product written with np.where, and
  an inf/NaN outside the kept triangle never reaches the result;
- gradients of the six variants and double backward against central differences
  and the masked formula; every backend against eager (cache hit, dynamic sizes);
- causal scaled_dot_product_attention (which runs on ``tri``) against torch, the
  traced backward's tri params, and an inf in v that a query cannot see;
- the backward's products are the variants ``TRI_VJP`` names.
"""
import itertools
import re

import numpy as np
import pytest

import compiled_autograd as ca
import compiled_autograd.nn.functional as F
from compiled_autograd.runtime import kernels
from compiled_autograd.runtime.prims import ops
from compiled_autograd.runtime.prims_reduce import (TRI, TRI_BLOCK, TRI_VJP, matmul,
                                                    matmul_tri_numpy, tri_blocks)
from helpers import BACKENDS, assert_backend_matches, needs_torch, torch

KERNEL = kernels.native("matmul_tri")
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="kernels.c's matmul_tri not built")
SIZES = (0, 1, 5, 16, 17, 33, 64)
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def mask(tri, rows, cols):
    """The kept triangle of a rows x cols matrix, by blocks of 16."""
    i = np.arange(rows)[:, None] // TRI_BLOCK
    j = np.arange(cols)[None, :] // TRI_BLOCK
    return i >= j if tri.endswith("lower") else i <= j


def masked(a, b, tri):
    """What each variant means, written with np.where on the whole matrices."""
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    if tri.startswith("a_"):
        return np.matmul(np.where(mask(tri, M, K), a, 0), b)
    if tri.startswith("b_"):
        return np.matmul(a, np.where(mask(tri, K, N), b, 0))
    return np.where(mask(tri, M, N), np.matmul(a, b), 0)


def rand(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def assert_product(got, want, tri, K, dtype):
    """Close to ``want``; out_*'s dropped entries exactly 0."""
    tol = TOL[dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1, K))
    if tri.startswith("out_"):
        assert not np.any(got[..., ~mask(tri, *got.shape[-2:])])


# ---------------------------------------------------------------- the rule


@pytest.mark.parametrize("tri", TRI)
def test_tri_blocks_cover_the_product_and_read_the_kept_triangle(tri):
    for M, N, K in itertools.product(SIZES, repeat=3):
        count = np.zeros((M, N), int)
        for r0, r1, c0, c1, k0, k1 in tri_blocks(tri, M, N, K):
            count[r0:r1, c0:c1] += 1
            ks = set(range(k0, k1))
            if tri.startswith("a_"):      # the block's rows read a's kept columns
                for r in range(r0, r1):
                    assert ks == set(np.flatnonzero(mask(tri, M, K)[r])), (M, N, K, r)
            elif tri.startswith("b_"):    # the block's columns read b's kept rows
                for c in range(c0, c1):
                    assert ks == set(np.flatnonzero(mask(tri, K, N)[:, c])), (M, N, K, c)
            else:
                assert (k0, k1) == (0, K)
        want = mask(tri, M, N) if tri.startswith("out_") else np.ones((M, N), bool)
        np.testing.assert_array_equal(count, want.astype(int), err_msg=str((M, N, K)))


def _layouts(rng, a_shape, b_shape, dtype):
    """(name, a, b): contiguous, transposed views (a swapaxes of a contiguous
    array) and column slices of a wider matrix (q out of a qkv output)."""
    def t(shape):
        return np.swapaxes(rand(rng, shape[:-2] + (shape[-1], shape[-2]), dtype), -1, -2)

    def cols(shape):
        return rand(rng, shape[:-1] + (3 * shape[-1] + 1,), dtype)[..., shape[-1]:2 * shape[-1]]
    a, b = rand(rng, a_shape, dtype), rand(rng, b_shape, dtype)
    yield "contiguous", a, b
    yield "a transposed", t(a_shape), b
    yield "b transposed", a, t(b_shape)
    yield "both transposed", t(a_shape), t(b_shape)
    yield "column slices", cols(a_shape), cols(b_shape)


@needs_kernel
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tri", TRI)
def test_kernel_matches_the_reference(tri, dtype):
    rng = np.random.default_rng(TRI.index(tri))
    shapes = [((M, K), (K, N)) for M, N, K in itertools.product(SIZES, repeat=3) if M != N]
    shapes += [((2, 3, M, K), (3, K, N)) for M, N, K in [(17, 33, 40), (50, 18, 5), (33, 5, 50)]]
    shapes += [((2, 3, 17, 40), (1, 40, 20)), ((3, 18, 35), (35, 20)), ((18, 35), (2, 35, 20)),
               ((16, 16), (16, 16))]
    for a_shape, b_shape in shapes:
        for name, a, b in _layouts(rng, a_shape, b_shape, dtype):
            got = KERNEL(a, b, TRI.index(tri) + 1)
            assert got is not NotImplemented, (name, a_shape, b_shape)
            assert_product(got, matmul_tri_numpy(a, b, tri), tri, a_shape[-1], dtype)


def _declined(rng):
    a, b = rand(rng, (20, 18)), rand(rng, (18, 21))
    yield "int64", a.astype(np.int64), b.astype(np.int64)
    yield "mixed dtypes", a.astype(np.float32), b
    yield "stride-0 rows", np.broadcast_to(a[:1], (20, 18)), b
    yield "stride-0 columns", a, np.broadcast_to(b[:, :1], (18, 21))


@needs_kernel
@pytest.mark.parametrize("tri", TRI)
def test_kernel_declines_and_the_prim_falls_back(tri):
    for name, a, b in _declined(np.random.default_rng(1)):
        assert KERNEL(a, b, TRI.index(tri) + 1) is NotImplemented, name
        got = matmul.kernel(a, b, tri=tri)
        np.testing.assert_array_equal(got, matmul_tri_numpy(a, b, tri), err_msg=name)
        np.testing.assert_allclose(got, masked(a, b, tri), rtol=1e-6, atol=1e-5, err_msg=name)


@needs_kernel
def test_bad_tri_codes_raise():
    a = np.ones((3, 3))
    for code in (0, 7, -1):
        with pytest.raises(ValueError, match="tri must be 1..6"):
            KERNEL(a, a, code)


def test_bad_tri_names_raise_with_the_list():
    a = ca.tensor(np.ones((3, 3)), requires_grad=True)
    with pytest.raises(ValueError, match=r"tri must be None or one of .*'a_lower'.*'bogus'"):
        ops.matmul(a, a, tri="bogus")


# ---------------------------------------------------------------- the meaning


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tri", TRI)
def test_each_variant_is_the_masked_product(tri, dtype):
    rng = np.random.default_rng(7)
    for M, N, K in [(18, 20, 35), (37, 5, 50), (5, 37, 50), (33, 40, 17), (64, 64, 64),
                    (1, 17, 40), (40, 1, 17), (17, 33, 1), (0, 5, 17), (18, 20, 0)]:
        a, b = rand(rng, (2, M, K), dtype), rand(rng, (K, N), dtype)
        got = ops.matmul(ca.tensor(a, dtype=dtype), ca.tensor(b, dtype=dtype), tri=tri).numpy()
        assert_product(got, masked(a, b, tri), tri, K, dtype)


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("tri", TRI)
def test_non_finite_entries_outside_the_triangle_are_never_read(tri, value):
    rng = np.random.default_rng(3)
    M, N, K = 37, 35, 50
    a, b = rand(rng, (M, K)), rand(rng, (K, N))
    side = "b" if tri.startswith("b_") else "a"     # out_*: the product's triangle of a@b
    x = b if side == "b" else a
    keep = mask(tri, *x.shape) if not tri.startswith("out_") else np.ones(x.shape, bool)
    for inside, nth in itertools.product((False, True), (5, -1)):   # -1: the last block's
        if not inside and keep.all():
            continue
        pos = tuple(np.argwhere(keep if inside else ~keep)[nth])
        xs = x.copy()
        xs[pos] = value
        aa, bb = (a, xs) if side == "b" else (xs, b)
        for fn in (lambda: ops.matmul(ca.tensor(aa, dtype=np.float64),
                                      ca.tensor(bb, dtype=np.float64), tri=tri).numpy(),
                   lambda: matmul_tri_numpy(aa, bb, tri)):
            got = fn()
            if inside:   # the same non-finite entries as the masked product's
                np.testing.assert_array_equal(np.isfinite(got), np.isfinite(masked(aa, bb, tri)))
                assert not np.isfinite(got).all()
            else:
                assert np.isfinite(got).all(), (tri, pos)
                assert_product(got, masked(aa, bb, tri), tri, K, np.float64)


# ---------------------------------------------------------------- gradients


def _masked_grads(a, b, tri, g):
    """d sum(g * masked(a, b)) / da, db in numpy (batch dims summed away)."""
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    am = np.where(mask(tri, M, K), a, 0) if tri.startswith("a_") else a
    bm = np.where(mask(tri, K, N), b, 0) if tri.startswith("b_") else b
    gm = np.where(mask(tri, M, N), g, 0) if tri.startswith("out_") else g
    ga, gb = gm @ np.swapaxes(bm, -1, -2), np.swapaxes(am, -1, -2) @ gm
    ga = np.where(mask(tri, M, K), ga, 0) if tri.startswith("a_") else ga
    gb = np.where(mask(tri, K, N), gb, 0) if tri.startswith("b_") else gb
    return ga.reshape((-1,) + a.shape).sum(0), gb.reshape((-1,) + b.shape).sum(0)


def _central(f, xs, eps=1e-6):
    """Central differences of the scalar f(*xs) w.r.t. every entry of every x."""
    grads = []
    for x in xs:
        d = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            hi = f(*xs)
            x[idx] = old - eps
            d[idx] = (hi - f(*xs)) / (2 * eps)
            x[idx] = old
        grads.append(d)
    return grads


@pytest.mark.parametrize("tri", TRI)
def test_gradients_against_central_differences_and_the_formula(tri):
    rng = np.random.default_rng(11)
    a, b, w = rand(rng, (2, 18, 35)), rand(rng, (35, 20)), rand(rng, (2, 18, 20))
    at, bt = (ca.tensor(x, dtype=np.float64, requires_grad=True) for x in (a, b))
    (ops.matmul(at, bt, tri=tri) * ca.tensor(w, dtype=np.float64)).sum().backward()
    ga, gb = at.grad.numpy(), bt.grad.numpy()

    def f(a, b):
        return float((ops.matmul(ca.tensor(a, dtype=np.float64),
                                 ca.tensor(b, dtype=np.float64), tri=tri).numpy() * w).sum())
    na, nb = _central(f, [a.copy(), b.copy()])
    np.testing.assert_allclose(ga, na, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(gb, nb, rtol=1e-7, atol=1e-7)
    want_a, want_b = _masked_grads(a, b, tri, w)
    np.testing.assert_allclose(ga, want_a, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gb, want_b, rtol=1e-12, atol=1e-12)
    if not tri.startswith("out_"):        # entries never read: exactly 0 both ways
        side, num, x = (ga, na, a) if tri.startswith("a_") else (gb, nb, b)
        outside = ~mask(tri, *x.shape[-2:])
        assert outside.any() and not side[..., outside].any() and not num[..., outside].any()


@pytest.mark.parametrize("tri", ["a_lower", "out_lower", "b_upper"])
def test_double_backward_against_central_differences(tri):
    rng = np.random.default_rng(5)
    a, b = rand(rng, (18, 21)), rand(rng, (21, 20))
    w, wa, wb = rand(rng, (18, 20)), rand(rng, a.shape), rand(rng, b.shape)

    def first(a, b, create_graph):
        at, bt = (ca.tensor(x, dtype=np.float64, requires_grad=True) for x in (a, b))
        out = ops.matmul(at, bt, tri=tri)
        loss = (out * out * ca.tensor(w, dtype=np.float64)).sum()
        ga, gb = ca.autograd.grad(loss, [at, bt], create_graph=create_graph)
        s = ((ga * ca.tensor(wa, dtype=np.float64)).sum()
             + (gb * ca.tensor(wb, dtype=np.float64)).sum())
        return at, bt, s

    at, bt, s = first(a, b, True)
    gga, ggb = (g.numpy() for g in ca.autograd.grad(s, [at, bt]))
    na, nb = _central(lambda a, b: float(first(a, b, False)[2].numpy()), [a.copy(), b.copy()])
    np.testing.assert_allclose(gga, na, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ggb, nb, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- backends


def _tri_losses(tensors, w):
    a, b = tensors
    total = 0
    for tri in TRI:
        total = total + (ops.matmul(a, b, tri=tri).tanh() * w).sum()
    return total


def _backward(backend, loss, **kw):
    if backend == "eager":
        loss.backward()
    else:
        with ca.compiled_backward(backend=backend, **kw):
            loss.backward()


def _grads(backend, fn, arrays, dtype, **kw):
    ts = [ca.tensor(x, dtype=dtype, requires_grad=True) for x in arrays]
    _backward(backend, fn(ts), **kw)
    return [t.grad.numpy() for t in ts]


@pytest.mark.usefixtures("fresh_compiled_cache")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_match_eager_with_a_cache_hit(backend, dtype):
    rng = np.random.default_rng(2)
    w = ca.tensor(rand(rng, (2, 3, 18, 20)), dtype=dtype)
    for step in range(2):                  # the second: new values, same shapes
        arrays = [rand(rng, (2, 3, 18, 35)), rand(rng, (3, 35, 20))]
        want = _grads("eager", lambda ts: _tri_losses(ts, w), arrays, dtype)
        got = _grads(backend, lambda ts: _tri_losses(ts, w), arrays, dtype)
        for e, c in zip(want, got):
            assert_backend_matches(backend, e, c)
    if backend != "eager":
        assert ca.compiled_autograd_stats()["cache_hits"] >= 1


def _attention_like(ts):
    q, k, v = ts
    p = ops.matmul(q, k.transpose(-2, -1), tri="out_lower").tanh()
    return (ops.matmul(p, v, tri="a_lower") ** 2).sum()


@pytest.mark.usefixtures("fresh_compiled_cache")
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "eager"])
def test_dynamic_sequence_lengths(backend):
    rng = np.random.default_rng(4)
    for L in (18, 37, 50):
        arrays = [rand(rng, (2, L, 8)) for _ in range(3)]
        want = _grads("eager", _attention_like, arrays, np.float64)
        got = _grads(backend, _attention_like, arrays, np.float64, dynamic=True)
        for e, c in zip(want, got):
            assert_backend_matches(backend, e, c)
    assert ca.compiled_autograd_stats()["compiles"] == 1   # one program, symbolic L
    if backend == "c":   # its four products by ca_tri_block on runtime sizes
        (family,) = ca.compiled.cache.families.values()
        code = family.entries[0][2].c_code
        calls = re.findall(r"ca_tri_block\((\d), blk, (sizes\[\d+\]), ", code)
        assert sorted(int(t) for t, _ in calls) == [TRI.index(t) + 1 for t in
                                                    ("a_lower", "a_upper", "b_lower", "out_lower")]


# ---------------------------------------------------------------- attention


def _sdpa_ours(backend, q, k, v, g, dtype):
    ts = [ca.tensor(x, dtype=dtype, requires_grad=True) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*ts, is_causal=True)
    _backward(backend, (out * ca.tensor(g, dtype=dtype)).sum())
    return [out.detach().numpy()] + [t.grad.numpy() for t in ts]


def _sdpa_torch(q, k, v, g):
    ts = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=True)
    out.backward(torch.tensor(g))
    return [out.detach().numpy()] + [t.grad.numpy() for t in ts]


@needs_torch
@pytest.mark.usefixtures("fresh_compiled_cache")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-4)])
@pytest.mark.parametrize("L,S,E", [(37, 37, 8), (50, 18, 32), (18, 50, 1), (1, 1, 4),
                                   (1, 17, 3), (33, 5, 16), (16, 16, 2)])
def test_causal_attention_against_torch(backend, dtype, tol, L, S, E):
    rng = np.random.default_rng(L * 100 + S)
    q, g = rand(rng, (2, 2, L, E), dtype), rand(rng, (2, 2, L, E), dtype)
    k, v = rand(rng, (2, 2, S, E), dtype), rand(rng, (2, 2, S, E), dtype)
    for ours, theirs in zip(_sdpa_ours(backend, q, k, v, g, dtype), _sdpa_torch(q, k, v, g)):
        np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol)


def _matmul_tris(**kw):
    rng = np.random.default_rng(0)
    q, k, v = (ca.tensor(rand(rng, (1, 2, 20, 4)), dtype=np.float64, requires_grad=True)
               for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    graph = ca.trace_backward(out.sum()).graph
    return [n.kwargs.get("tri") for n in graph.nodes if n.target == "matmul" or
            getattr(n.target, "name", None) == "matmul"]


def test_only_the_causal_path_records_tri():
    assert sorted(_matmul_tris(is_causal=True)) == ["a_lower", "a_upper", "b_lower", "out_lower"]
    mask_ = ca.tensor(np.tril(np.ones((20, 20), bool)))
    for kw in ({}, {"attn_mask": mask_}, {"attn_mask": mask_, "is_causal": False}):
        tris = _matmul_tris(**kw)
        assert len(tris) == 4 and tris == [None] * 4, kw


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_inf_in_v_that_a_query_cannot_see(dtype):
    # Block-granular, as a flash attention's: v's row 40 is in the 16-block 32..47,
    # so rows 0..31 (whose blocks of the weights' lower triangle end before it)
    # never read it and stay finite; rows 32..39 (same block, weight 0) read it:
    # 0 * inf = NaN there, and rows >= 40 see it. torch 2.13's CPU sdpa (math and
    # flash backends alike, whose blocks at this size span all 50 keys) gives NaN
    # in every row; ours differs there on purpose, rows 0..31 being finite.
    rng = np.random.default_rng(9)
    q, k, v = (rand(rng, (1, 2, 50, 8), dtype) for _ in range(3))
    v[0, 1, 40, 3] = np.inf
    out = F.scaled_dot_product_attention(*(ca.tensor(x, dtype=dtype) for x in (q, k, v)),
                                         is_causal=True).numpy()
    assert np.isfinite(out[0, 0]).all()                     # another head
    assert np.isfinite(out[0, 1, :32]).all()
    assert not np.isfinite(out[0, 1, 32:, 3]).any()
    assert np.isfinite(np.delete(out[0, 1], 3, axis=-1)).all()
    finite = np.where(np.isfinite(v), v, 0)
    clean = F.scaled_dot_product_attention(*(ca.tensor(x, dtype=dtype) for x in (q, k, finite)),
                                           is_causal=True).numpy()
    np.testing.assert_array_equal(out[0, 1, :32], clean[0, 1, :32])
    if torch is not None:
        theirs = torch.nn.functional.scaled_dot_product_attention(
            *(torch.tensor(x) for x in (q, k, v)), is_causal=True).numpy()
        np.testing.assert_array_equal(np.isfinite(theirs[0, 1, 32:]), np.isfinite(out[0, 1, 32:]))


@pytest.mark.parametrize("tri", TRI)
def test_the_backward_s_products_are_the_variants_tri_vjp_names(tri):
    a = ca.tensor(np.ones((3, 20, 20)), requires_grad=True)
    b = ca.tensor(np.ones((3, 20, 20)), requires_grad=True)
    graph = ca.trace_backward(ops.matmul(a, b, tri=tri).sum()).graph
    got = sorted(str(n.kwargs.get("tri")) for n in graph.nodes if n.target == "matmul")
    assert got == sorted(map(str, TRI_VJP[tri]))
