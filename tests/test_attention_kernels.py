"""Attention's scores in one prim: ``scaled_softmax(x, scale, causal)`` = softmax of
``x * scale`` over the last dim, with ``causal`` the entries above the diagonal of
the last two dims masked out (what scaled_dot_product_attention made of mul,
masked_fill and softmax). kernels.c's C kernel against its numpy reference
(``scaled_softmax_numpy``: those three ops), the C backend's lowering (the softmax
template with a scale and a causal row count) against eager, and the attention's
gradients against torch on every backend, with and without the fused path.

Tolerances: the C kernel sums its row in another order than numpy's pairwise sum,
float32 rtol 1e-5 (as softmax's, tests/test_forward_kernels.py), float64 1e-12."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.runtime import kernels
from compiled_autograd.runtime.prims import PRIMS, ops
from compiled_autograd.runtime.prims_reduce import scaled_softmax_numpy

from helpers import BACKENDS, needs_cc

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@pytest.fixture(scope="module")
def native():
    if not kernels.KERNELS.enabled():
        pytest.skip("CA_C_FORWARD=0")
    assert kernels.KERNELS.module() is not None, kernels.KERNELS.status()
    return kernels.KERNELS.module()


def test_the_reference_is_mul_masked_fill_softmax():
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    mask = np.triu(np.ones((3, 5), bool), 1)
    z = np.where(mask, -np.inf, x * 0.25)
    e = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(scaled_softmax_numpy(x, 0.25, True), e / e.sum(-1, keepdims=True),
                               rtol=1e-6)
    assert (scaled_softmax_numpy(x, 0.25, True)[:, 0, 1:] == 0).all()


@needs_cc
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_scaled_softmax_matches_numpy(native, dtype, causal):
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    rng = np.random.default_rng(1)
    for shape in [(2, 4, 64, 64), (3, 5), (5, 3), (2, 1, 7), (4, 1), (6,)]:
        if causal and len(shape) < 2:
            continue
        x = (rng.standard_normal(shape) * 4).astype(dtype)
        big = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
        big[..., ::2] = x
        for name, xx in (("contiguous", x), ("strided", big[..., ::2]),
                         ("fortran", np.asfortranarray(x))):
            for scale in (0.125, 1.0, -3.0):
                got, ref = native.scaled_softmax(xx, scale, causal), scaled_softmax_numpy(
                    xx, scale, causal)
                assert type(got) is np.ndarray and got.dtype == ref.dtype
                assert got.shape == ref.shape and got.flags.c_contiguous
                np.testing.assert_allclose(got, ref, rtol=rtol, atol=0,
                                           err_msg=f"{shape} {name} {scale}")
                np.testing.assert_array_equal(PRIMS["scaled_softmax"].kernel(
                    xx, scale=scale, causal=causal), got)


@needs_cc
def test_scaled_softmax_special_rows(native):
    x = np.array([[0.0, np.nan, 1.0, 2.0],          # NaN in the masked part: no effect
                  [np.inf, 0.0, 1.0, 2.0],          # inf - inf in the row
                  [-np.inf, -np.inf, 1.0, 2.0],     # masked -inf entries
                  [1.0, 2.0, 3.0, np.nan],          # NaN in the row: all of it NaN
                  [-np.inf] * 4], np.float32)       # a row of -inf only
    for causal in (False, True):
        for scale in (0.5, -0.5):
            got, ref = native.scaled_softmax(x, scale, causal), scaled_softmax_numpy(
                x, scale, causal)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=0)


@needs_cc
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scaled_softmax_long_rows_with_specials(native, dtype):
    # Rows longer than a vector: a causal row's exp stops at its valid part rounded
    # up to a vector and the rest is written without it (0, or NaN where the row's
    # sum is NaN: an inf, or a NaN, in the valid part).
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 40, 40)) * 3).astype(dtype)
    x[0, 5, 2] = np.inf           # row 5: valid part 0..5 holds an inf
    x[0, 20, 30] = np.inf         # row 20: the inf is in its masked part
    x[1, 17, 3] = np.nan          # row 17: a NaN in the valid part
    x[1, 33, 39] = np.nan         # row 33: a NaN in the masked part
    x[2, 8, :9] = -np.inf         # row 8: its whole valid part -inf
    for causal in (True, False):
        for scale in (0.3, -2.0):
            got, ref = native.scaled_softmax(x, scale, causal), scaled_softmax_numpy(
                x, scale, causal)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"{causal} {scale}")
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=0, err_msg=f"{causal} {scale}")


@needs_cc
def test_scaled_softmax_cases_it_leaves_to_numpy(native):
    for x, causal in ((np.ones(4, np.float32), True), (np.zeros((0, 3), np.float32), False),
                      (np.ones((2, 3), np.float16), False), (np.arange(6).reshape(2, 3), True),
                      (np.ones((2, 3), ">f4"), False), ([[1.0, 2.0]], False)):
        assert native.scaled_softmax(x, 0.5, causal) is NotImplemented
    x = np.ones((2, 3), np.float16)
    assert PRIMS["scaled_softmax"].kernel(x, scale=0.5, causal=True).dtype == np.float16
    with pytest.raises(TypeError, match="takes 3 arguments"):
        native.scaled_softmax(x, 0.5)


def _attention(lib, arrays, backend, **kw):
    dt = np.float64 if lib is ca else lib.float64
    q, k, v = (lib.tensor(a, requires_grad=True, dtype=dt) for a in arrays[:3])
    mask = kw.pop("mask", None)
    if mask is not None:
        kw["attn_mask"] = lib.tensor(mask) if mask.dtype == bool else lib.tensor(mask, dtype=dt)
    y = lib.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    loss = (y * y.tanh()).sum()
    if lib is ca and backend != "eager":
        with ca.compiled_backward(backend=backend):
            loss.backward()
    else:
        loss.backward()
    return [t.detach().numpy() for t in (y, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["causal", "plain", "scale", "long keys", "bool mask",
                                  "float mask"])
def test_attention_gradients_match_torch(backend, case):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    L, S = (3, 5) if case == "long keys" else (4, 4)
    arrays = [rng.standard_normal(s) for s in ((2, 3, L, 8), (2, 3, S, 8), (2, 3, S, 8))]
    kw = {"causal": dict(is_causal=True), "plain": {}, "scale": dict(scale=0.3, is_causal=True),
          "long keys": dict(is_causal=True),
          "bool mask": dict(mask=rng.random((L, S)) > 0.3, is_causal=False),
          "float mask": dict(mask=rng.standard_normal((L, S)))}[case]
    if case == "bool mask":
        kw["mask"][:, 0] = True                     # no row fully masked
    got = _attention(ca, arrays, backend, **dict(kw))
    ref = _attention(torch, arrays, backend, **dict(kw))
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


def test_attention_uses_one_prim_for_its_scores():
    q = ca.randn(1, 2, 4, 8, requires_grad=True)
    graph = ca.trace_backward(ca.nn.functional.scaled_dot_product_attention(
        q, q, q, is_causal=True).sum()).graph
    sources = [n.meta.get("source") for n in graph.nodes]
    assert "ScaledSoftmaxBackward" in sources
    assert not any(s in ("MaskedFillBackward", "SoftmaxBackward") for s in sources)


class _SoftmaxInBackward(ca.autograd.Function):
    """A backward that computes scaled_softmax, so that the C backend lowers it."""
    inline_backward = True

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ops.scaled_softmax(x.transpose(-2, -1), scale=0.7, causal=True).transpose(
            -2, -1) + g * ops.scaled_softmax(x, scale=-1.5, causal=False)


@pytest.mark.parametrize("shape", [(2, 3, 5), (5, 3), (4, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_c_backends_lowering_matches_eager(shape, dtype):
    rng = np.random.default_rng(3)
    data = (rng.standard_normal(shape) * 2).astype(dtype)
    grads = {}
    for backend in BACKENDS:
        x = ca.tensor(data, requires_grad=True, dtype=dtype)
        loss = _SoftmaxInBackward.apply(x).sum()
        if backend == "eager":
            loss.backward()
        else:
            with ca.compiled_backward(backend=backend):
                loss.backward()
            g = ca.trace_backward(_SoftmaxInBackward.apply(
                ca.tensor(data, requires_grad=True, dtype=dtype)).sum())
            assert "scaled_softmax" in {n.target for n in g.graph.nodes}
        grads[backend] = x.grad.numpy()
    np.testing.assert_array_equal(grads["python"], grads["eager"])
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(grads["c"], grads["eager"], rtol=rtol, atol=0)
