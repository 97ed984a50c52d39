"""Reductions, matmul, and the fused normalisation kernels (softmax, log_softmax,
layer_norm) whose derivatives are written once in prims."""
from __future__ import annotations

import math

import numpy as np

from compiled_autograd.runtime.lowering import Reduction, Template
from compiled_autograd.runtime.kernels import call_native
from compiled_autograd.runtime.prims import as_array, broadcast_shapes, ops, prim, shape_of, sum_to


def _reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if d in dims else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in dims)


def _reduce_meta(x, dims, keepdim):
    return _reduced_shape(x.shape, dims, keepdim), x.dtype


def _expand_back(g, shape, dims, keepdim):
    """Broadcast a reduced gradient back over the reduced dims."""
    if not keepdim:
        g = ops.reshape(g, shape=_reduced_shape(shape, dims, True))
    return ops.expand(g, shape=tuple(shape))


@prim("sum", meta=_reduce_meta, index_params=("dims", "keepdim"),
      c=Reduction("sum", init=("0", "0"), wide=True))
def sum_(x, dims, keepdim):
    """Sum over ``dims`` (a tuple of non-negative dims; () sums nothing)."""
    return as_array(np.sum(x, axis=dims, keepdims=keepdim))


@sum_.defvjp
def _(ctx, g):
    return (_expand_back(g, ctx.shapes[0], ctx.params["dims"], ctx.params["keepdim"]),)


@prim("amax", meta=_reduce_meta, save=(0, "out"), index_params=("dims", "keepdim"),
      c=Reduction("amax", init=("-INFINITY", "INT64_MIN"), wide=False))
def amax(x, dims, keepdim):
    return as_array(np.amax(x, axis=dims, keepdims=keepdim))


@amax.defvjp
def _(ctx, g):
    # torch's amax: the gradient is shared evenly among the tied maxima.
    x, out = ctx.saved
    shape, dims, keepdim = ctx.shapes[0], ctx.params["dims"], ctx.params["keepdim"]
    mask = ops.astype(ops.eq(x, _expand_back(out, shape, dims, keepdim)), dtype=ctx.dtypes[0])
    count = ops.sum(mask, dims=dims, keepdim=True)
    return (ops.div(ops.mul(_expand_back(g, shape, dims, keepdim), mask), count),)


def _argmax_meta(x, dim, keepdim):
    if dim is None:
        return (), np.dtype(np.int64)
    return _reduced_shape(x.shape, (dim,), keepdim), np.dtype(np.int64)


@prim("argmax", meta=_argmax_meta, differentiable=False, index_params=("dim", "keepdim"),
      c=Template("argmax.c.j2", kind="argreduce"))
def argmax(x, dim, keepdim):
    """Index of the first maximum along ``dim`` (None: of the flattened array)."""
    return as_array(np.argmax(x, axis=dim, keepdims=keepdim)).astype(np.int64, copy=False)


def _check_tri(tri):
    """matmul's ``tri`` is None or one of ``TRI`` (the meta's check, and the
    kernel's, which runs on arrays without the meta)."""
    if tri is not None and tri not in TRI:
        raise ValueError(f"matmul: tri must be None or one of {TRI}, got {tri!r}")


def _matmul_meta(a, b, tri=None):
    _check_tri(tri)
    batch = broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                           f"({a.shape[-2]}x{a.shape[-1]} and {b.shape[-2]}x{b.shape[-1]})")
    return tuple(batch) + (a.shape[-2], b.shape[-1]), np.result_type(a.dtype, b.dtype)


def transpose_last(x):
    """Swap the last two dims (a view)."""
    n = len(x.shape)
    return ops.permute(x, perm=tuple(range(n - 2)) + (n - 1, n - 2))


def small_product(M, N, K) -> bool:
    """A product OpenBLAS runs on one thread with its small-matrix path."""
    return M * N * K <= 65536 * 4


def b_row_major_first(a_transposed, b_transposed, batched, M, N, K) -> bool:
    """Whether a product's ``b`` is copied row-major before the BLAS call: OpenBLAS's
    small batched ``a @ b^T`` runs at ~60% of its ``a @ b`` (attention's 32 products
    of 64x64x32: 129 against 76 us), and the copy costs a fraction of that. The
    forward's matmul and the C backend's (codegen/c_ops.py) follow this one rule."""
    return b_transposed and not a_transposed and batched and small_product(M, N, K)


def _transposed(x) -> bool:
    """Column-major in its last two dims (a transposed view): BLAS reads it as op^T."""
    return x.shape[-1] > 1 and x.strides[-2] == x.itemsize != x.strides[-1]


# Block-triangular products (matmul's ``tri``): attention's causal mask zeroes the
# entries above the diagonal of its scores' last two dims, so its two products and
# their four gradients skip the blocks of the mask's zeros. The triangle is taken by
# blocks of TRI_BLOCK rows and columns: "lower" keeps the entries (i, j) with
# i // TRI_BLOCK >= j // TRI_BLOCK (the causal entries and the rest of the diagonal
# blocks), "upper" those with i // TRI_BLOCK <= j // TRI_BLOCK (its transpose).
#   a_lower, a_upper: matmul(a kept to its triangle, b): only its entries are read;
#   b_lower, b_upper: the same of b;
#   out_lower, out_upper: the product kept to its triangle, 0 elsewhere.
# The variants are closed under differentiation (the vjp below); each is computed by
# blocks of rows (a_*, out_*) or columns (b_*) of the product, each block one BLAS
# call over the range of k it needs: ``tri_blocks`` is the rule, which kernels.c and
# the C backend take from ca_tri_block (runtime/ca_math.h) and tests compare.
TRI_BLOCK = 16
TRI = ("a_lower", "a_upper", "b_lower", "b_upper", "out_lower", "out_upper")
# d/da of each variant is matmul(g, b^T, tri=...) and d/db is matmul(a^T, g, tri=...):
# a transpose swaps lower and upper, a kept product gives the gradient's operand
# that triangle, and a kept operand gives its gradient the same triangle.
TRI_VJP = {"a_lower": ("out_lower", "a_upper"), "a_upper": ("out_upper", "a_lower"),
           "b_lower": ("b_upper", "out_lower"), "b_upper": ("b_lower", "out_upper"),
           "out_lower": ("a_lower", "b_lower"), "out_upper": ("a_upper", "b_upper"),
           None: (None, None)}


def tri_blocks(tri, M, N, K):
    """The blocks of an M x N product over K that ``tri`` computes: (r0, r1, c0, c1,
    k0, k1) each, the product's rows and columns and the range of k. Entries of
    out_*'s rows outside their block's columns are 0; a block whose range of k is
    empty is 0."""
    by_cols = tri in ("b_lower", "b_upper")
    n = N if by_cols else M
    for lo in range(0, n, TRI_BLOCK):
        end = lo + TRI_BLOCK       # the block's end in the triangle (not cut at n)
        hi = min(end, n)
        r0, r1, c0, c1, k0, k1 = 0, M, 0, N, 0, K
        if by_cols:
            c0, c1 = lo, hi
        else:
            r0, r1 = lo, hi
        if tri in ("a_lower", "b_upper"):
            k1 = min(end, K)
        elif tri in ("a_upper", "b_lower"):
            k0 = min(lo, K)
        elif tri == "out_lower":
            c1 = min(end, N)
        elif tri == "out_upper":
            c0 = min(lo, N)
        yield r0, r1, c0, c1, k0, k1


def matmul_tri_numpy(a, b, tri):
    """The reference of kernels.c's matmul_tri: ``tri_blocks``, each block a numpy
    product."""
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    out = np.zeros(tuple(batch) + (M, N), np.result_type(a.dtype, b.dtype))
    for r0, r1, c0, c1, k0, k1 in tri_blocks(tri, M, N, K):
        if k1 > k0 and r1 > r0 and c1 > c0:
            out[..., r0:r1, c0:c1] = np.matmul(a[..., r0:r1, k0:k1], b[..., k0:k1, c0:c1])
    return out


@prim("matmul", meta=_matmul_meta, save=((1, 0), (0, 1)),
      c=Template("matmul.c.j2", kind="gemm"))
def matmul(a, b, tri=None):
    """Batched matrix product; both operands have at least 2 dims. ``tri``: a
    block-triangular product (``TRI``, above)."""
    # (whether b is transposed first: one comparison in the common case, 8 times a
    # step in the custom-Function MLP's forward)
    if b.strides[-2] == b.itemsize and b_row_major_first(
            _transposed(a), _transposed(b), max(a.ndim, b.ndim) > 2,
            a.shape[-2], b.shape[-1], a.shape[-1]):
        b = np.ascontiguousarray(b)
    if tri is None:
        return as_array(np.matmul(a, b))
    _check_tri(tri)
    out = call_native("matmul_tri", a, b, TRI.index(tri) + 1)
    return matmul_tri_numpy(a, b, tri) if out is NotImplemented else out


@matmul.defvjp
def _(ctx, g):
    b, a = ctx.saved
    tri_a, tri_b = TRI_VJP[ctx.params.get("tri")]
    ga = (sum_to(ops.matmul(g, transpose_last(b), **_tri(tri_a)), ctx.shapes[0])
          if ctx.needs[0] else None)
    gb = (sum_to(ops.matmul(transpose_last(a), g, **_tri(tri_b)), ctx.shapes[1])
          if ctx.needs[1] else None)
    return ga, gb


def _tri(tri):
    """matmul's params for ``tri``: none for a plain product (its cache key and
    graph stay those of a product without the param)."""
    return {} if tri is None else {"tri": tri}


# ---------------------------------------------------------------- fused kernels


def _same_meta(x, **_):
    return tuple(x.shape), x.dtype


@prim("softmax", meta=_same_meta, save=("out",), index_params=("dim",),
      c=Template("softmax.c.j2", kind="row_softmax", log=False))
def softmax(x, dim):
    out = call_native("softmax", x, dim, False)
    return softmax_numpy(x, dim) if out is NotImplemented else out


def softmax_numpy(x, dim):
    """The reference of kernels.c's softmax."""
    if x.size == 0:  # numpy's amax has no identity for an empty reduction
        return np.array(x, order="C", copy=True)
    e = np.exp(x - np.amax(x, axis=dim, keepdims=True))
    return as_array(e / np.sum(e, axis=dim, keepdims=True))


@softmax.defvjp
def _(ctx, g):
    (out,) = ctx.saved
    dot = ops.sum(ops.mul(g, out), dims=(ctx.params["dim"],), keepdim=True)
    return (ops.mul(out, ops.sub(g, dot)),)


@prim("log_softmax", meta=_same_meta, save=("out",), index_params=("dim",),
      c=Template("softmax.c.j2", kind="row_softmax", log=True))
def log_softmax(x, dim):
    out = call_native("softmax", x, dim, True)
    return log_softmax_numpy(x, dim) if out is NotImplemented else out


def log_softmax_numpy(x, dim):
    """The reference of kernels.c's log_softmax."""
    if x.size == 0:
        return np.array(x, order="C", copy=True)
    shifted = x - np.amax(x, axis=dim, keepdims=True)
    return as_array(shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True)))


@log_softmax.defvjp
def _(ctx, g):
    (out,) = ctx.saved
    total = ops.sum(g, dims=(ctx.params["dim"],), keepdim=True)
    return (ops.sub(g, ops.mul(ops.exp(out), total)),)


@prim("scaled_softmax", meta=_same_meta, save=("out",),
      c=Template("softmax.c.j2", kind="row_softmax", log=False))
def scaled_softmax(x, scale, causal):
    """softmax over the last dim of ``x * scale``, and with ``causal`` the entries
    above the diagonal of the last two dims (column > row) masked out (-inf before,
    0 after): attention's scores in one pass, where mul, masked_fill and softmax
    made three. kernels.c's where it applies."""
    out = call_native("scaled_softmax", x, scale, causal)
    return scaled_softmax_numpy(x, scale, causal) if out is NotImplemented else out


def scaled_softmax_numpy(x, scale, causal):
    """The reference of kernels.c's scaled_softmax: mul, masked_fill, softmax."""
    z = x * scale
    if causal:
        keep = np.tril(np.ones(x.shape[-2:], dtype=bool))
        z = np.where(keep, z, -np.inf).astype(z.dtype, copy=False)
    return softmax_numpy(z, x.ndim - 1)


@scaled_softmax.defvjp
def _(ctx, g):
    # softmax's derivative times the scale; a masked entry's output is 0, so is
    # its gradient (as masked_fill's).
    (out,) = ctx.saved
    dot = ops.sum(ops.mul(g, out), dims=(len(ctx.shapes[0]) - 1,), keepdim=True)
    return (ops.mul(ops.mul(out, ops.sub(g, dot)), ctx.params["scale"]),)


@prim("layer_norm", meta=_same_meta, save=(0,), index_params=("ndim",),
      c=Template("layer_norm.c.j2", kind="row_normalize"))
def layer_norm(x, ndim, eps):
    """Normalise over the last ``ndim`` dims (biased variance); the affine part is
    ordinary mul/add ops."""
    out = call_native("layer_norm", x, ndim, eps)
    return layer_norm_numpy(x, ndim, eps) if out is NotImplemented else out


def layer_norm_numpy(x, ndim, eps):
    """The reference of kernels.c's layer_norm."""
    axes = tuple(range(x.ndim - ndim, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    return as_array(centered / np.sqrt(var + eps))


@layer_norm.defvjp
def _(ctx, g):
    (x,) = ctx.saved
    return _layer_norm_vjp(x, g, ctx.shapes[0], ctx.params["ndim"], ctx.params["eps"])


def _layer_norm_vjp(x, g, shape, k, eps, xhat_too=False):
    # Recompute mean and 1/std from x rather than saving them: one saved tensor.
    dims = tuple(range(len(shape) - k, len(shape)))
    inv_n = 1.0 / float(math.prod(shape[len(shape) - k:]))  # guards a symbolic size

    def mean(v):
        return ops.mul(ops.sum(v, dims=dims, keepdim=True), inv_n)

    centered = ops.sub(x, mean(x))
    rstd = ops.pow(ops.add(mean(ops.mul(centered, centered)), eps), -0.5)
    xhat = ops.mul(centered, rstd)
    if g is None:
        return None, xhat
    inner = ops.sub(ops.sub(g, mean(g)), ops.mul(xhat, mean(ops.mul(g, xhat))))
    return (ops.mul(inner, rstd), xhat) if xhat_too else (ops.mul(inner, rstd),)


def _layer_norm_affine_meta(x, w, b, ndim, eps):
    shape = tuple(x.shape[len(x.shape) - ndim:])
    if tuple(w.shape) != shape or tuple(b.shape) != shape:
        raise RuntimeError(f"layer_norm_affine: weight {tuple(w.shape)} and bias "
                           f"{tuple(b.shape)} must be the normalized shape {shape}")
    return tuple(x.shape), x.dtype


@prim("layer_norm_affine", meta=_layer_norm_affine_meta, save=(0, (1, 0)),
      index_params=("ndim",), c=Template("layer_norm.c.j2", kind="row_normalize"))
def layer_norm_affine(x, w, b, ndim, eps):
    """layer_norm's normalisation times ``w`` plus ``b`` (each of the normalised
    shape, x's dtype) in one pass, where layer_norm, mul and add made three (torch's
    native_layer_norm). kernels.c's where it applies."""
    out = call_native("layer_norm", x, ndim, eps, w, b)
    return layer_norm_affine_numpy(x, w, b, ndim, eps) if out is NotImplemented else out


def layer_norm_affine_numpy(x, w, b, ndim, eps):
    """The reference of kernels.c's layer_norm with weight and bias."""
    return as_array(layer_norm_numpy(x, ndim, eps) * w + b)


@layer_norm_affine.defvjp
def _(ctx, g):
    x, w = ctx.saved
    shape, k = ctx.shapes[0], ctx.params["ndim"]
    rows = tuple(range(len(shape) - k))              # the dims w and b broadcast over
    gx = gw = gb = None
    if ctx.needs[0] or ctx.needs[1]:     # (the normalised x, for w's gradient, once)
        gx, xhat = _layer_norm_vjp(x, ops.mul(g, w) if ctx.needs[0] else None, shape, k,
                                   ctx.params["eps"], xhat_too=True)
    if ctx.needs[1]:
        gw = ops.sum(ops.mul(g, xhat), dims=rows, keepdim=False) if rows else ops.mul(g, xhat)
    if ctx.needs[2]:
        gb = ops.sum(g, dims=rows, keepdim=False) if rows else g
    return gx, gw, gb


def _linear_meta(x, w, b=None):
    if x.shape[-1] != w.shape[-1]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                           f"({int(np.prod(x.shape[:-1]))}x{x.shape[-1]} and "
                           f"{w.shape[-1]}x{w.shape[0]})")
    return tuple(x.shape[:-1]) + (w.shape[0],), np.result_type(x.dtype, w.dtype)


@prim("linear", meta=_linear_meta, save=((0, 1), (1, 0)),
      c=Template("matmul.c.j2", kind="gemm_bias"))
def linear(x, w, b=None):
    """``x @ w.T + b`` (torch's addmm): one kernel, and a derivative whose weight
    gradient comes out in w's own layout (no transposed copy). kernels.c's linear
    (one GEMM onto rows of b, as the C backend's) where it applies."""
    out = call_native("linear", x, w, b)
    return linear_numpy(x, w, b) if out is NotImplemented else out


def linear_numpy(x, w, b=None):
    """The reference of kernels.c's linear."""
    if x.ndim > 2 and x.flags.c_contiguous:
        # One GEMM over the flattened leading dims, not one per batch element
        # (what np.matmul does for a stack); the same sums, so the same bits.
        out = np.matmul(x.reshape(-1, x.shape[-1]), w.T).reshape(x.shape[:-1] + (w.shape[0],))
    else:
        out = np.matmul(x, w.T)
    if b is not None:
        out += b
    return as_array(out)


@linear.defvjp
def _(ctx, g):
    x, w = ctx.saved
    gx = gw = gb = None
    if ctx.needs[0]:
        gx = ops.matmul(g, w) if len(shape_of(g)) >= 2 else None
        if gx is None:  # 1-d input: g is (out,)
            gx = ops.reshape(ops.matmul(ops.reshape(g, shape=(1, shape_of(g)[0])), w),
                             shape=ctx.shapes[0])
    if ctx.needs[1] or (len(ctx.needs) > 2 and ctx.needs[2]):
        gshape, xshape = shape_of(g), shape_of(x) if x is not None else None
        n_out = gshape[-1]
        g2 = ops.reshape(g, shape=(math.prod(gshape[:-1]), n_out)) if len(gshape) != 2 else g
        if ctx.needs[1]:
            n_in = xshape[-1]
            x2 = ops.reshape(x, shape=(math.prod(xshape[:-1]), n_in)) if len(xshape) != 2 else x
            gw = ops.matmul(transpose_last(g2), x2)
        if len(ctx.needs) > 2 and ctx.needs[2]:
            gb = ops.sum(g2, dims=(0,), keepdim=False)
    return gx, gw, gb
