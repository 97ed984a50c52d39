"""runtime/kernels.c: the forward's C kernels against their numpy references (the
prims' numpy kernels): values, dtypes, layouts, empty arrays, NaN and infinities;
where they do not apply (other dtypes, another dim) the numpy kernel runs; with
CA_C_FORWARD=0 only numpy runs; GELU's forward agrees bit for bit with the C
backend's; gradients through them match torch on every backend.

Tolerances. GELU: both sides approximate erf within 2 float32 ulps (runtime/
special.py; ca_erff in runtime/ca_math.h), so they differ by up to 4 ulps of 1
(4.8e-7) in erf, times 0.5|x|, plus the rounding of the product: |c - numpy| <=
3e-7 |x| + 2 ulps of the result. float64: 1e-15 |x| + 2 ulps (libm's erf against
Cephes', both within 2.2e-16). softmax, log_softmax, layer_norm sum in another
order (16 lanes against numpy's pairwise sum): float32 rtol 1e-5, float64 1e-12,
with an atol of the same order times the row's scale for log_softmax and
layer_norm, whose outputs cross zero."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen.c_text import ENV
from compiled_autograd.runtime import cbuild, kernels
from compiled_autograd.runtime.prims import PRIMS
from compiled_autograd.runtime.prims_elementwise import gelu_numpy
from compiled_autograd.runtime.prims_reduce import (layer_norm_affine_numpy, layer_norm_numpy,
                                                      linear_numpy,
                                                      log_softmax_numpy, softmax_numpy)

from helpers import BACKENDS, needs_cc

pytestmark = [needs_cc, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@pytest.fixture(scope="module")
def native():
    if not kernels.KERNELS.enabled():
        pytest.skip("CA_C_FORWARD=0")
    assert kernels.KERNELS.module() is not None, kernels.KERNELS.status()
    return kernels.KERNELS.module()


def layouts(shape, dtype, scale=3.0, seed=0):
    """The same values as a C-contiguous array, a transposed view, a strided slice
    of a larger one, and a Fortran-ordered copy."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    big = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
    big[..., ::2] = x
    yield "contiguous", x
    yield "strided", big[..., ::2]
    yield "fortran", np.asfortranarray(x)
    if x.ndim >= 2:
        yield "transposed", np.swapaxes(np.swapaxes(x, 0, -1).copy(), 0, -1)


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e30, -1e30,
                    3.4e38, -3.4e38, 1e-45, 5.0, -5.0, 10.0, -10.0, -6.0, 0.5, -0.5])


def check_same_kind(got, ref):
    assert type(got) is np.ndarray and got.dtype == ref.dtype and got.shape == ref.shape
    assert got.flags.c_contiguous


def ulp(v):
    return np.spacing(np.abs(v).astype(v.dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tanh", [False, True])
def test_gelu_matches_numpy(native, dtype, tanh):
    slope = 3e-7 if dtype == np.float32 else 1e-15
    for name, x in [*layouts((7, 33, 5), dtype),
                    ("sweep", np.linspace(-12, 12, 100_001).astype(dtype)),
                    ("special", SPECIAL.astype(dtype)), ("0-d", np.array(-1.3, dtype))]:
        approximate = "tanh" if tanh else "none"
        got, ref = native.gelu(x, tanh), gelu_numpy(x, approximate)
        check_same_kind(got, ref)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=name)
        finite = np.isfinite(ref)
        assert np.array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
        bound = slope * np.abs(x[finite]) + 2 * ulp(ref[finite])
        err = np.abs(got[finite].astype(np.float64) - ref[finite])
        assert (err <= bound).all(), (name, err.max(), x[finite][np.argmax(err - bound)])
        # the prim's kernel is the C one
        np.testing.assert_array_equal(PRIMS["gelu"].kernel(x, approximate=approximate), got)


def test_gelu_float32_is_as_close_to_float64_as_numpys(native):
    x = np.linspace(-8, 8, 200_001).astype(np.float32)
    truth = gelu_numpy(x.astype(np.float64))
    err_c = np.abs(native.gelu(x, False) - truth)
    err_numpy = np.abs(gelu_numpy(x) - truth)
    assert err_c.max() <= 1.5 * err_numpy.max() and err_c.max() < 1e-6


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_and_log_softmax_match_numpy(native, dtype):
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    for shape in [(4, 3, 64), (5, 1000), (6, 1), (17,)]:
        for name, x in layouts(shape, dtype):
            for log, ref_fn in ((False, softmax_numpy), (True, log_softmax_numpy)):
                for dim in (len(shape) - 1, -1):
                    got, ref = native.softmax(x, dim, log), ref_fn(x, len(shape) - 1)
                    check_same_kind(got, ref)
                    atol = rtol * np.abs(ref).max() if log else 0
                    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol,
                                               err_msg=f"{name} {shape} log={log}")


@pytest.mark.parametrize("log", [False, True])
def test_softmax_special_rows(native, log):
    ref_fn = log_softmax_numpy if log else softmax_numpy
    x = np.array([[0.0, 1.0, -np.inf, 2.0],        # a masked entry
                  [np.nan, 1.0, 2.0, 3.0],          # NaN spreads over its row
                  [np.inf, 1.0, 2.0, 3.0],          # inf - inf
                  [-np.inf] * 4,                    # a fully masked row
                  [1e30, -1e30, 0.0, 1e30]], np.float32)
    got, ref = native.softmax(x, 1, log), ref_fn(x, 1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_matches_numpy(native, dtype):
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    for shape, k in [((8, 16, 128), 1), ((8, 16, 128), 2), ((3, 7), 2), ((5, 1), 1),
                     ((4, 6), 0)]:
        for name, x in layouts(shape, dtype, seed=k):
            x = x + np.asarray(2.0, dtype)        # a mean to take away
            got, ref = native.layer_norm(x, k, 1e-5), layer_norm_numpy(x, k, 1e-5)
            check_same_kind(got, ref)
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * 10, err_msg=name)
    x = np.array([[1.0, np.nan, 2.0], [3.0, 3.0, 3.0], [np.inf, 0.0, 1.0]], np.float32)
    got, ref = native.layer_norm(x, 1, 1e-5), layer_norm_numpy(x, 1, 1e-5)
    np.testing.assert_array_equal(got, ref)         # NaN rows, a constant row: 0


def test_empty_and_other_dtypes_go_to_numpy(native):
    empty = np.zeros((0, 4), np.float32)
    for x in (empty, np.arange(6).reshape(2, 3), np.ones((2, 3), np.float16),
              np.ones((2, 3), ">f4"), [1.0, 2.0]):
        assert native.softmax(x, 1, False) is NotImplemented
        assert native.layer_norm(x, 1, 1e-5) is NotImplemented
        if not isinstance(x, np.ndarray) or x.size:
            assert native.gelu(x, False) is NotImplemented
    assert native.gelu(empty, False).shape == (0, 4)
    assert native.softmax(np.ones((3, 4), np.float32), 0, False) is NotImplemented
    assert native.layer_norm(np.ones((3, 4), np.float32), 3, 1e-5) is NotImplemented
    # the prims still answer, from numpy
    x = np.ones((2, 3), np.float16)
    assert PRIMS["gelu"].kernel(x).dtype == gelu_numpy(x).dtype
    y = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(PRIMS["softmax"].kernel(y, 0), softmax_numpy(y, 0))
    np.testing.assert_array_equal(PRIMS["softmax"].kernel(empty, 1), softmax_numpy(empty, 1))
    with pytest.raises(TypeError, match="takes 2 arguments"):
        native.gelu(y)


def test_misaligned_arrays_go_to_numpy(native):
    buf = np.zeros(4 * 12 + 1, np.uint8)
    x = buf[1:].view(np.float32).reshape(3, 4)
    x[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert not x.flags.aligned
    assert native.gelu(x, False) is NotImplemented
    assert native.softmax(x, 1, False) is NotImplemented
    assert native.layer_norm(x, 1, 1e-5) is NotImplemented
    np.testing.assert_array_equal(PRIMS["gelu"].kernel(x), gelu_numpy(x))
    np.testing.assert_array_equal(PRIMS["layer_norm"].kernel(x, 1, 1e-5),
                                  layer_norm_numpy(x, 1, 1e-5))


def test_gelu_agrees_with_the_c_backends_bit_for_bit(native):
    """The forward's C GELU and the generated C's ca_gelu_f (built as the C backend
    builds its code: codegen's template loader, cbuild.build's flags) are the same
    function: the same header, the same flags that matter (-std=c11, the host's
    FMA). So a checkpoint recomputed by the C backend sees the forward's values."""
    driver = ("#include <stdint.h>\n#include <string.h>\n#include <tgmath.h>\n"
              '{% include "ca_math.h" %}\n'
              "void gelu(const float *x, float *y, int64_t n) {\n"
              "  for (int64_t i = 0; i < n; i++) y[i] = ca_gelu_f(x[i]);\n}\n")
    lib = cbuild.load(cbuild.build(ENV.from_string(driver).render())[0])
    lib.gelu.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x = np.concatenate([np.linspace(-12, 12, 100_003), SPECIAL]).astype(np.float32)
    y = np.empty_like(x)
    lib.gelu(x.ctypes.data, y.ctypes.data, x.size)
    np.testing.assert_array_equal(native.gelu(x, False), y)


def test_ca_c_forward_0_turns_the_kernels_off(tmp_path):
    code = ("import numpy as np\n"
            "from compiled_autograd.runtime import kernels\n"
            "from compiled_autograd.runtime.prims import PRIMS\n"
            "from compiled_autograd.runtime.prims_elementwise import gelu_numpy\n"
            "x = np.linspace(-5, 5, 1001).astype(np.float32)\n"
            "assert kernels.native('gelu') is None\n"
            "assert np.array_equal(PRIMS['gelu'].kernel(x), gelu_numpy(x))\n"
            "print(kernels.KERNELS.status())\n")
    env = dict(os.environ, CA_C_FORWARD="0", CA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "python: disabled by CA_C_FORWARD=0"
    assert not list(tmp_path.glob("_kernels_*"))           # never built


def test_the_kernels_looked_up_once_follow_disabled_and_reset(native):
    """call_native keeps each kernels.c function after its first call; turning the
    extension off (``disabled``) or forgetting it (``reset``) makes it look again,
    and a lookup that raced the change cannot leave the old answer behind."""
    x = np.linspace(-5, 5, 1001).astype(np.float32)
    expected_c = native.gelu(x, False)
    assert np.array_equal(kernels.call_native("gelu", x, False), expected_c)
    assert kernels._functions["gelu"] is native.gelu
    with kernels.KERNELS.disabled():
        assert kernels.call_native("gelu", x, False) is NotImplemented
        assert np.array_equal(PRIMS["gelu"].kernel(x), gelu_numpy(x))
        stale = kernels._functions          # a lookup that began while disabled ...
    stale["gelu"] = kernels._unavailable   # ... and stored after the change
    assert kernels.call_native("gelu", x, False) is not NotImplemented
    assert kernels._functions["gelu"] is native.gelu
    kernels.KERNELS.reset()
    try:
        assert "gelu" not in kernels._functions
        assert np.array_equal(kernels.call_native("gelu", x, False), expected_c)
        assert kernels._functions["gelu"] is kernels.KERNELS.module().gelu
    finally:
        kernels.KERNELS.reset()   # (the next test's fixture module: built again)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_through_the_c_kernels_match_torch(native, backend):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((4, 6, 32)), rng.standard_normal(32), rng.standard_normal(32)]
    results = {}
    for lib in (ca, torch):
        x, w, b = (lib.tensor(a, requires_grad=True, dtype=np.float64 if lib is ca
                              else torch.float64) for a in arrays)
        F = lib.nn.functional
        h = F.layer_norm(x, (32,), w, b)
        s = F.softmax(F.gelu(h), dim=-1) + F.log_softmax(F.gelu(h, approximate="tanh"), dim=-1)
        loss = (s * s).sum()
        if lib is ca and backend != "eager":
            with ca.compiled_backward(backend=backend):
                loss.backward()
        else:
            loss.backward()
        results[lib.__name__] = [t.detach().numpy() for t in (loss, x.grad, w.grad, b.grad)]
    for got, ref in zip(results["compiled_autograd"], results["torch"]):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_axpy_is_numpys_two_passes_in_one(native, dtype):
    # An optimizer's out = a + alpha * b (optim._rules.axpy_): the same bits as
    # numpy's b * alpha into a temporary, then the add; out may be a or b.
    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 40_000):
        a = rng.standard_normal(n).astype(dtype)
        b = (rng.standard_normal(n) * 1e3).astype(dtype)
        for alpha in (0.37, -1e-3, 3.0e7, 1.0):
            ref = np.add(a, np.multiply(b, alpha))
            out = np.empty_like(a)
            assert native.axpy(out, a, alpha, b) is None
            np.testing.assert_array_equal(out, ref)
            aa, bb = a.copy(), b.copy()
            native.axpy(aa, aa, alpha, bb)
            np.testing.assert_array_equal(aa, ref)
            native.axpy(bb, a, alpha, bb)
            np.testing.assert_array_equal(bb, ref)
    x = np.ones(6, dtype)
    for out, a, b in ((x, x, np.ones(6, np.float32 if dtype == np.float64 else np.float64)),
                      (x, x, np.ones(7, dtype)), (x, x, np.ones(12, dtype)[::2]),
                      (np.ones(6, np.int64), x, x)):
        assert native.axpy(out, a, 0.5, b) is NotImplemented
    ro = np.ones(6, dtype)
    ro.flags.writeable = False
    assert native.axpy(ro, x, 0.5, x) is NotImplemented
    np.testing.assert_array_equal(ro, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_matches_numpy(native, dtype):
    # x @ w.T + b as one GEMM onto rows of b (beta 1) against numpy's matmul and
    # += b: the BLAS may add b before or after its partial sums over a long K.
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    rng = np.random.default_rng(4)
    for x_shape, n_out in [((8, 64, 128), 384), ((5, 7), 3), ((1, 1), 1), ((2, 3, 4, 600), 9)]:
        x = rng.standard_normal(x_shape).astype(dtype)
        w = rng.standard_normal((n_out, x_shape[-1])).astype(dtype)
        b = rng.standard_normal(2 * n_out).astype(dtype)
        for w_name, ww in (("rows", w), ("transposed view", np.asfortranarray(w))):
            for b_name, bb in (("bias", b[:n_out]), ("strided bias", b[::2]), ("none", None)):
                got, ref = native.linear(x, ww, bb), linear_numpy(x, ww, bb)
                check_same_kind(got, ref)
                scale = np.abs(x).max() * np.abs(w).max() * x_shape[-1]
                np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale,
                                           err_msg=f"{x_shape} {w_name} {b_name}")
    # the prim takes the C path (the same values as the generated C's gemm_bias)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((6, 5), (4, 5), (4,)))
    np.testing.assert_array_equal(PRIMS["linear"].kernel(x, w, b), native.linear(x, w, b))
    inf = np.array([[np.inf, 1.0], [np.nan, 0.0]], np.float32)
    np.testing.assert_array_equal(native.linear(inf, np.ones((3, 2), np.float32), None),
                                  linear_numpy(inf, np.ones((3, 2), np.float32)))


def test_linear_cases_it_leaves_to_numpy(native):
    f4, f8 = np.float32, np.float64
    x, w, b = np.ones((4, 3), f4), np.ones((2, 3), f4), np.ones(2, f4)
    cases = [(x.T.copy().T, w, b),                      # x not C-contiguous
             (x, np.ones((2, 6), f4)[:, ::2], b),       # w neither C nor Fortran
             (x, w.astype(f8), b), (x, w, b.astype(f8)), (x.astype(np.int64), w, b),
             (x, w, np.ones((1, 2), f4)),               # a bias of another shape
             (x, w, np.ones(3, f4)), (np.ones(3, f4), w, b),    # 1-d x
             (np.ones((0, 3), f4), w, b), (np.ones((4, 0), f4), np.ones((2, 0), f4), b),
             (x, np.ones((0, 3), f4), np.ones(0, f4)), (x, np.ones((3, 3), f4)[:2, :2], b),
             ([[1.0, 2.0, 3.0]], w, b)]
    for args in cases:
        assert native.linear(*args) is NotImplemented
    buf = np.zeros(4 * 12 + 1, np.uint8)
    misaligned = buf[1:].view(f4).reshape(4, 3)
    assert native.linear(misaligned, w, b) is NotImplemented
    for args in cases[:6] + [(misaligned, w, b)]:     # the prim still answers, from numpy
        np.testing.assert_array_equal(PRIMS["linear"].kernel(*args), linear_numpy(*args))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        native.linear(x, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_affine_matches_numpy(native, dtype):
    # the normalisation, then * w, then + b, each rounded as numpy's (no fused
    # multiply-add): the same tolerance as layer_norm's
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    rng = np.random.default_rng(5)
    for shape, k in [((8, 16, 128), 1), ((8, 16, 128), 2), ((3, 7), 2), ((5, 1), 1)]:
        norm = shape[len(shape) - k:]
        w, b = (rng.standard_normal(norm).astype(dtype) for _ in range(2))
        for name, x in layouts(shape, dtype, seed=k):
            got = native.layer_norm(x + np.asarray(2.0, dtype), k, 1e-5, w, b)
            ref = layer_norm_affine_numpy(x + np.asarray(2.0, dtype), w, b, k, 1e-5)
            check_same_kind(got, ref)
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * 10, err_msg=name)
            np.testing.assert_array_equal(
                PRIMS["layer_norm_affine"].kernel(x + np.asarray(2.0, dtype), w, b, ndim=k,
                                                  eps=1e-5), got)
    x, w = np.ones((2, 4), np.float32), np.ones(4, np.float32)
    for ww, bb in ((w.astype(np.float64), w), (w, np.ones(3, np.float32)),
                   (np.ones(8, np.float32)[::2], w), (w, [1.0, 2.0, 3.0, 4.0])):
        assert native.layer_norm(x, 1, 1e-5, ww, bb) is NotImplemented
    with pytest.raises(TypeError, match="takes 3 or 5 arguments"):
        native.layer_norm(x, 1, 1e-5, w)


class _LayerNormInBackward(ca.autograd.Function):
    """A backward that computes layer_norm_affine, so that the C backend lowers it."""
    inline_backward = True

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w, b)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        x, w, b = ctx.saved_tensors
        y = PRIMS["layer_norm_affine"](x.transpose(0, 1), w, b, ndim=1, eps=1e-5)
        return g * y.transpose(0, 1), None, None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_affine_in_the_c_backend_matches_eager(dtype):
    rng = np.random.default_rng(6)
    data = [(rng.standard_normal(s) * 2 + 1).astype(dtype) for s in ((6, 4, 3), (3,), (3,))]
    grads = {}
    for backend in BACKENDS:
        x = ca.tensor(data[0], requires_grad=True, dtype=dtype)
        w, b = (ca.tensor(a, dtype=dtype) for a in data[1:])
        loss = _LayerNormInBackward.apply(x, w, b).sum()
        if backend == "eager":
            loss.backward()
        else:
            with ca.compiled_backward(backend=backend):
                loss.backward()
        grads[backend] = x.grad.numpy()
    g = ca.trace_backward(_LayerNormInBackward.apply(
        ca.tensor(data[0], requires_grad=True, dtype=dtype), *map(ca.tensor, data[1:])).sum())
    assert "layer_norm_affine" in {n.target for n in g.graph.nodes}
    np.testing.assert_array_equal(grads["python"], grads["eager"])
    if "c" in grads:
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(grads["c"], grads["eager"], rtol=rtol, atol=rtol)


def test_a_small_batched_product_copies_a_transposed_b_row_major_first(monkeypatch):
    """The matmul prim follows the C backend's rule (prims_reduce.b_row_major_first):
    attention's q @ k^T (32 products of 64x64x32) copies k^T row-major before the
    BLAS call; a large product, or one whose a is transposed too, does not."""
    from compiled_autograd.runtime import prims_reduce
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((8, 4, 64, 32)).astype(np.float32) for _ in range(2))
    big = rng.standard_normal((2, 256, 512)).astype(np.float32)
    copies = []
    original = np.ascontiguousarray
    monkeypatch.setattr(prims_reduce.np, "ascontiguousarray",
                        lambda x, *a, **kw: copies.append(x.shape) or original(x, *a, **kw))
    for a, b, copied in ((q, k.swapaxes(-1, -2), True),
                         (q.swapaxes(-1, -2), k, False),                 # a is transposed
                         (q[0, 0], k[0, 0].T, False),                     # not batched
                         (big, big.swapaxes(-1, -2), False)):             # not small
        copies.clear()
        got = PRIMS["matmul"](a, b)
        assert copies == ([b.shape] if copied else []), (a.shape, a.strides, b.strides)
        np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)
