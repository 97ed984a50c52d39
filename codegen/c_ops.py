"""C for one graph node, by the *kind* of its prim's lowering (``prim.c``, a
``compiled_autograd.runtime.lowering`` record): ``EMITTERS[kind](emitter, node, lowering)``
appends the node's statements and records its value. The record gives the
template file and the facts its kind needs; no emitter here knows a prim by
name. Elementwise prims share one loop template (their expression is the
record's); view prims make no code, only a new layout (``c_layout``)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from compiled_autograd.codegen.c_layout import (Val, add, broadcast_strides, c_expr, contiguous_strides, dim,
                              expanded, mul, permuted, prod, reshaped, sliced,
                              strided_reshape)
from compiled_autograd.codegen.c_fusion import lowering
from compiled_autograd.codegen.c_text import literal
from compiled_autograd.codegen.c_text import render as _render
from compiled_autograd.codegen.c_threads import HEAVY, cost, pragma, work
from compiled_autograd.runtime.prims_reduce import TRI, b_row_major_first, tri_blocks


def emit(e, node, lowering):
    """Append the C of ``node``, whose prim lowers as ``lowering``."""
    emitter = EMITTERS.get(lowering.kind)
    if emitter is None:
        raise NotImplementedError(f"C backend: no emitter for lowering kind {lowering.kind!r} "
                                  f"(prim {node.target!r})")
    emitter(e, node, lowering)


def _shape(node):
    return tuple(map(dim, node.meta["shape"]))


def _fill(e, out: Val, value="0"):
    e.emit(e.store_loop(out, f"(({out.ctype}){value})", []))


def _error(e, message) -> int:
    e.prog.errors.append(message)
    return -len(e.prog.errors)


# ---------------------------------------------------------------- loops and views

def _elementwise(e, node, low):
    out = e.fresh(node)
    leaves = []
    text, _ = e.expression(node, out.shape, leaves)
    out = e.reuse_dying_input(out, leaves)
    total = e.sums_in_loop.get(node)
    if total is None:
        e.emit(e.store_loop(out, text, leaves))
    else:       # (c_fusion.sums_in_producer_loops: the sum's loop writes out too)
        _reduce_keeping_rows(e, total, lowering(total), text, leaves, store=out)
    e.vals[node] = out


def _view(e, node, low):
    src = e.vals[node.args[0]]
    p = node.kwargs
    shape = tuple(map(dim, node.meta["shape"]))
    e.vals[node] = LAYOUTS[low.options["layout"]](e, src, p, shape)


def _reshape(e, src, p, shape):
    v = reshaped(src, shape)
    return v if v is not None else reshaped(e.materialize(src), shape)


def _slice(e, src, p, shape):
    v = sliced(src, p["dim"], dim(p["start"]), dim(p["step"]))
    return v.with_layout(shape, v.strides, v.offset)


def _strided(e, src, p, shape):
    base = e.contiguous(src)
    return base.with_layout(shape, tuple(map(dim, p["strides"])),
                            add(base.offset, dim(p["offset"])))


# A view's layout (``View.layout``) -> its new Val over the same storage.
LAYOUTS = {
    "permuted": lambda e, src, p, shape: permuted(src, p["perm"]),
    "expanded": lambda e, src, p, shape: expanded(src, shape),
    "sliced": _slice, "reshaped": _reshape, "strided": _strided,
}


# ---------------------------------------------------------------- reductions

def _reduced_layout(loop, dims):
    """For a reduction of ``loop`` over ``dims``: the kept dims, the output's
    strides over the whole loop (0 on the reduced dims: contiguous output) and the
    loop's index names."""
    kept = [d for d in range(len(loop)) if d not in dims]
    out_strides = [0] * len(loop)
    for d, s in zip(kept, contiguous_strides([loop[d] for d in kept])):
        out_strides[d] = s
    return kept, out_strides, [f"i{d}" for d in range(len(loop))]

# The longest sum over inner dims added in float32 (rather than double) lanes
FLOAT_SUM_MAX = 256


def _reduce(e, node, low):
    x = node.args[0]
    loop = _shape(x)
    dims = tuple(node.kwargs["dims"])
    leaves = []
    text = e.operand(x, loop, leaves, None)
    if loop and (len(loop) - 1) not in dims and dims:
        _reduce_keeping_rows(e, node, low, text, leaves)
        return
    out, kept, out_strides, names, text, data = _reduction(e, node, low, loop, dims, text,
                                                           leaves)
    count = prod([loop[d] for d in dims])
    if data["op"] == "sum" and out.dtype == np.float32 and isinstance(count, int) \
            and count <= FLOAT_SUM_MAX:
        # A row of at most FLOAT_SUM_MAX floats is added in float32 vector lanes
        # (16 adds a lane at most, about numpy's pairwise sum's blocks): in
        # double, each vector of 16 is two conversions and two dependent adds,
        # about twice the time (docs/c-backend.md, "sums vectorise").
        data["acc"] = out.ctype
    # Threads take shares of the outputs (never of one output's sum).
    e.emit(_render(low.template, outer=[(names[d], c_expr(loop[d])) for d in kept],
                   inner=[(names[d], c_expr(loop[d])) for d in dims],
                   out_index=e.index(out.offset, out_strides, names),
                   omp=pragma(work(loop, cost(text)), collapse=len(kept)) if kept else "",
                   **data))
    e.vals[node] = out


def _reduction(e, node, low, loop, dims, text, leaves):
    """A reduction's output, its layout over ``loop`` (``_reduced_layout``), its
    value's C text with the leaves' indices, and the template's common data."""
    out = e.fresh(node)
    kept, out_strides, names = _reduced_layout(loop, dims)
    for j, (offset, strides, _) in enumerate(leaves):
        text = text.replace(f"@{j}@", e.index(offset, strides, names))
    floating = np.issubdtype(out.dtype, np.floating)
    opt = low.options
    acc = ("double" if floating else "int64_t") if opt["wide"] else out.ctype
    data = dict(op=opt["op"], out=e.ptr(out), T=out.ctype, acc=acc,
                init=opt["init"][0 if floating else 1], value=text)
    return out, kept, out_strides, names, text, data


def _reduce_keeping_rows(e, node, low, text, leaves, store=None):
    """A reduction over leading dims that keeps the last, of the value ``text``
    (over its input's loop, with ``leaves``): the input is walked in memory
    order and each element added into its output's accumulator (a scratch
    row), not down strided columns; threads take shares of the last dim's
    columns (a row of 32 or more). ``store``: the loop also writes each
    value there (the elementwise node whose loop computes the sum too:
    c_fusion.sums_in_producer_loops)."""
    loop = _shape(node.args[0]) if store is None else store.shape
    dims = tuple(node.kwargs["dims"]) if store is None else tuple(range(len(loop) - 1))
    out, kept, out_strides, names, text, data = _reduction(e, node, low, loop, dims, text,
                                                           leaves)
    if data["op"] == "sum" and out.dtype == np.float32:
        # numpy sums a float32 array over leading dims a row at a time, in float32:
        # the same order here is its result bit for bit on a contiguous input (a
        # bias's gradient is eager's), with half the work per element of double's
        data["acc"] = out.ctype
    n_out = prod([loop[d] for d in kept])
    scratch = e.new_storage("arena", {"double": np.float64, "int64_t": np.int64}.get(
        data["acc"], out.dtype), (n_out,))
    wide = not isinstance(loop[-1], int) or loop[-1] >= 32
    target = (f"{e.ptr(store)}[{e.index(store.offset, store.strides, names)}]"
              if store is not None else None)
    e.emit(_render(low.options["rows_template"], scratch=e.ptr(scratch),
                   n_out=c_expr(n_out), loops=[(nm, c_expr(n)) for nm, n in zip(names, loop)],
                   acc_index=e.index(0, out_strides, names), out_index=c_expr(out.offset),
                   omp=pragma(work(loop, cost(text)), parallel_for=False) if wide else "",
                   store=target, **data))
    e.vals[node] = out


def _argmax(e, node, low):
    x = e.vals[node.args[0]]
    d = node.kwargs["dim"]
    loop = x.shape
    dims = tuple(range(len(loop))) if d is None else (d,)
    out = e.fresh(node)
    kept, out_strides, names = _reduced_layout(loop, dims)
    e.emit(_render(low.template, out=e.ptr(out), T=x.ctype,
                   omp=pragma(work(loop), collapse=len(kept)) if kept else "",
                   outer=[(names[k], c_expr(loop[k])) for k in kept],
                   inner=[(names[k], c_expr(loop[k])) for k in dims],
                   out_index=e.index(out.offset, out_strides, names),
                   x_index=e.index(x.offset, x.strides, names), x=e.ptr(x)))
    e.vals[node] = out


# ---------------------------------------------------------------- BLAS

class Gemm(NamedTuple):
    """One BLAS call site of a program, as the C calls it (``batch`` times, on
    ``batch`` different blocks), for timing the same calls alone
    (benchmarks/backward.py: the GEMM floor)."""
    dtype: np.dtype
    ta: str
    tb: str
    M: object
    N: object
    K: object
    lda: object
    ldb: object
    ldc: object
    batch: object
    beta: float


def _blas_layout(v: Val, rows, cols):
    """(transpose flag, leading dimension) to read ``v``'s last two dims as a
    rows x cols matrix without copying, or None."""
    sr, sc = v.strides[-2], v.strides[-1]
    if 0 in (rows, cols):           # (sizes 0 are never symbolic) nothing is read
        return "CblasNoTrans", max(cols, 1)
    symbolic = not all(isinstance(x, int) for x in (sr, sc, rows, cols))
    if (sc == 1 or cols == 1) and (rows == 1 or (sr != 0 and (symbolic or sr >= cols))):
        return "CblasNoTrans", (sr if rows != 1 else cols)
    if (sr == 1 or rows == 1) and (cols == 1 or (sc != 0 and (symbolic or sc >= rows))):
        return "CblasTrans", (sc if cols != 1 else rows)
    return None


def _gemm_operand(e, v, rows, cols):
    layout = _blas_layout(v, rows, cols)
    if layout is None:
        v = e.materialize(v)
        layout = _blas_layout(v, rows, cols)
    return v, layout


def _gemm_prefix(dtype):
    dt = np.dtype(dtype)
    if dt == np.float32:
        return "ca_sgemm", "f"
    if dt == np.float64:
        return "ca_dgemm", ""
    raise NotImplementedError(f"C backend: matmul of {dt} arrays")


def _matmul(e, node, low):
    a, b = e.vals[node.args[0]], e.vals[node.args[1]]
    out = e.fresh(node)
    M, K = a.shape[-2:]
    N = b.shape[-1]
    a, (ta, lda) = _gemm_operand(e, a, M, K)
    b, (tb, ldb) = _gemm_operand(e, b, K, N)
    batch = out.shape[:-2]
    if all(isinstance(d, int) for d in (M, N, K)) and b_row_major_first(   # (static sizes)
            ta == "CblasTrans", tb == "CblasTrans", bool(batch), M, N, K):
        b = e.materialize(b)
        tb, ldb = _blas_layout(b, K, N)

    def batch_strides(v):
        return broadcast_strides(v.shape[:-2], v.strides[:-2], len(batch))

    sa, sb, so = batch_strides(a), batch_strides(b), list(out.strides[:-2])
    rows = M
    tri = node.kwargs.get("tri")
    # b shared by every batch and a plain row-major: one gemm over all rows
    if tri is None and batch and all(s == 0 for s in sb) and ta == "CblasNoTrans":
        dims, vecs = e.loop_nest(list(batch) + [M], [sa + [lda], so + [N]])
        merged_lda = vecs[0][0] if dims else lda
        # BLAS needs lda >= K: rows repeated by a broadcast (stride 0) cannot merge.
        if len(dims) <= 1 and (not dims or dims[0] == 1 or not isinstance(merged_lda, int)
                               or not isinstance(K, int) or merged_lda >= max(K, 1)):
            rows, batch, sa, sb, so = (dims[0] if dims else 1), (), [], [], []
            lda = merged_lda if dims and dims[0] != 1 else lda
    fn, suffix = _gemm_prefix(out.dtype)
    names = [f"i{k}" for k in range(len(batch))]
    # The batch on several threads where OpenBLAS keeps each product on one (it
    # threads one of more than 65536 * 4 multiply-adds: interface/gemm.c): no BLAS
    # team is then started inside ours. A multiply-add costs about 1/32 of a
    # simple loop element.
    sizes = [rows, N, K] + list(batch)
    omp = (pragma(prod(sizes) // 32, collapse=len(batch))
           if batch and all(isinstance(d, int) for d in sizes) and rows * N * K <= 65536 * 4
           else "")
    a_ptr = f"{e.ptr(a)} + {e.index(a.offset, sa, names)}"
    b_ptr = f"{e.ptr(b)} + {e.index(b.offset, sb, names)}"
    c_ptr = f"{e.ptr(out)} + {e.index(out.offset, so, names)}"
    if tri is not None:
        _emit_tri(e, tri, out, fn, suffix, ta, tb, (M, N, K), (lda, ldb), omp,
                  list(zip(names, batch)), (a_ptr, b_ptr, c_ptr))
        e.vals[node] = out
        return
    e.prog.gemms.append(Gemm(out.dtype, ta, tb, rows, N, K, lda, ldb, N, prod(batch), 0.0))
    e.emit(_render(low.template, fn=fn, f=suffix, ta=ta, tb=tb, M=c_expr(rows), N=c_expr(N),
                   omp=omp,
                   K=c_expr(K), lda=c_expr(lda), ldb=c_expr(ldb), ldc=c_expr(N),
                   loops=[(n, c_expr(d)) for n, d in zip(names, batch)],
                   a=a_ptr, b=b_ptr, c=c_ptr, out=e.ptr(out),
                   zero=f"{c_expr(mul(prod(out.shape), out.dtype.itemsize))}"))
    e.vals[node] = out


def _emit_tri(e, tri, out, fn, suffix, ta, tb, sizes, lds, omp, loops, ptrs):
    """A block-triangular product (matmul's ``tri``): ca_tri_block's blocks, one
    BLAS call each (matmul_tri.c.j2)."""
    M, N, K = sizes
    lda, ldb = lds
    count = prod([n for _, n in loops])
    if all(isinstance(d, int) for d in sizes):
        for r0, r1, c0, c1, k0, k1 in tri_blocks(tri, M, N, K):
            if r1 > r0 and c1 > c0 and k1 > k0:
                e.prog.gemms.append(Gemm(out.dtype, ta, tb, r1 - r0, c1 - c0, k1 - k0, lda, ldb,
                                         N, count, 0.0))
    else:     # (symbolic sizes: the blocks are taken at run time; the whole product)
        e.prog.gemms.append(Gemm(out.dtype, ta, tb, M, N, K, lda, ldb, N, count, 0.0))
    e.emit(_render("matmul_tri.c.j2", fn=fn, f=suffix, ta=ta, tb=tb, omp=omp,
                   T="float" if suffix == "f" else "double", tri=TRI.index(tri) + 1,
                   out_tri=tri.startswith("out_"), M=c_expr(M), N=c_expr(N), K=c_expr(K),
                   lda=c_expr(lda), ldb=c_expr(ldb), loops=[(n, c_expr(d)) for n, d in loops],
                   a_at="bl[0] * (%s) + bl[4]" % c_expr(lda) if ta == "CblasNoTrans"
                   else "bl[4] * (%s) + bl[0]" % c_expr(lda),
                   b_at="bl[4] * (%s) + bl[2]" % c_expr(ldb) if tb == "CblasNoTrans"
                   else "bl[2] * (%s) + bl[4]" % c_expr(ldb),
                   a=ptrs[0], b=ptrs[1], c=ptrs[2]))


def _linear(e, node, low):
    x = e.contiguous(e.vals[node.args[0]])
    w = e.vals[node.args[1]]
    bias = e.vals[node.args[2]] if len(node.args) > 2 and node.args[2] is not None else None
    out = e.fresh(node)
    n_out, n_in = w.shape
    rows = prod(x.shape[:-1])
    w, (tw, ldw) = _gemm_operand(e, w, n_out, n_in)
    tb = "CblasTrans" if tw == "CblasNoTrans" else "CblasNoTrans"
    if bias is not None:
        e.emit(e.copy_into(out, bias))
    fn, suffix = _gemm_prefix(out.dtype)
    e.prog.gemms.append(Gemm(out.dtype, "CblasNoTrans", tb, rows, n_out, n_in, n_in, ldw, n_out,
                             1, 1.0 if bias is not None else 0.0))
    e.emit(_render(low.template, fn=fn, f=suffix, ta="CblasNoTrans", tb=tb, M=c_expr(rows),
                   N=c_expr(n_out), K=c_expr(n_in), lda=c_expr(n_in), ldb=c_expr(ldw),
                   ldc=c_expr(n_out), loops=[], a=f"{e.ptr(x)} + {c_expr(x.offset)}",
                   b=f"{e.ptr(w)} + {c_expr(w.offset)}", c=e.ptr(out), beta=bias is not None,
                   zero=c_expr(mul(prod(out.shape), out.dtype.itemsize)), out=e.ptr(out)))
    e.vals[node] = out


# ---------------------------------------------------------------- fused normalisations

def _softmax(e, node, low):
    x = e.vals[node.args[0]]
    nd = len(x.shape)
    d = node.kwargs.get("dim", nd - 1)        # scaled_softmax: the last dim
    scale, causal = node.kwargs.get("scale"), node.kwargs.get("causal", False)
    out = e.fresh(node)
    names = [f"i{k}" for k in range(nd)]
    outer = [k for k in range(nd) if k != d]
    xs = [0 if k == d else s for k, s in enumerate(x.strides)]
    os_ = [0 if k == d else s for k, s in enumerate(out.strides)]
    e.emit(_render(low.template, log=low.options["log"], T=x.ctype,
                   scale=None if scale is None else literal(float(scale), "double"),
                   causal_row=names[nd - 2] if causal else None,
                   omp=pragma(work(x.shape, HEAVY), collapse=len(outer)) if outer else "",
                   outer=[(names[k], c_expr(x.shape[k])) for k in outer],
                   n=c_expr(x.shape[d]), x=e.ptr(x), out=e.ptr(out),
                   x_base=e.index(x.offset, xs, names), x_step=c_expr(x.strides[d]),
                   out_base=e.index(out.offset, os_, names), out_step=c_expr(out.strides[d])))
    e.vals[node] = out


def _layer_norm(e, node, low):
    x = e.contiguous(e.vals[node.args[0]])
    k = node.kwargs["ndim"]
    w = b = None
    if len(node.args) > 1:                  # layer_norm_affine
        w, b = (e.contiguous(e.vals[a]) for a in node.args[1:3])
    out = e.fresh(node)
    rows = prod(x.shape[:len(x.shape) - k])
    e.emit(_render(low.template, T=x.ctype, x=f"{e.ptr(x)} + {c_expr(x.offset)}",
                   w=None if w is None else f"({e.ptr(w)} + {c_expr(w.offset)})",
                   b=None if b is None else f"({e.ptr(b)} + {c_expr(b.offset)})",
                   omp=pragma(work(x.shape, 4)) if rows != 1 else "",
                   out=e.ptr(out), rows=c_expr(rows),
                   n=c_expr(prod(x.shape[len(x.shape) - k:])),
                   eps=repr(float(node.kwargs["eps"]))))
    e.vals[node] = out


# ---------------------------------------------------------------- copies and scatters

def _cat(e, node, low):
    out = e.fresh(node)
    d = node.kwargs["dim"]
    if len(node.args) == 1:
        # The cat of one value is one copy loop, as an elementwise node is one
        # loop: it too may write over its input where that dies here.
        leaves = []
        text = e.operand_val(e.vals[node.args[0]], out.shape, leaves, out.ctype)
        out = e.reuse_dying_input(out, leaves)
        e.emit(_render(low.template, parts=[e.store_loop(out, text, leaves)]))
        e.vals[node] = out
        return
    start, parts = 0, []
    for a in node.args:
        v = e.vals[a]
        parts.append(e.copy_into(_window(out, d, start, v.shape), v))
        start = add(start, v.shape[d])
    e.emit(_render(low.template, parts=parts))
    e.vals[node] = out


def _window(out: Val, d, start, shape) -> Val:
    """``out``'s window of ``shape`` along dim ``d`` from ``start`` (step 1)."""
    v = sliced(out, d, start, 1)
    return v.with_layout(shape, v.strides, v.offset)


def tiled_sum(e, node, tiling):
    """A sum of slice gradients with disjoint windows (``c_concat.Tiling``),
    written as their concatenation (cat's template): each gradient copied into
    its window, zeros only in the gaps. No zero fill of the whole, no add."""
    out = e.fresh(node)
    d = tiling.dim
    for start, stop in tiling.gaps:
        _fill(e, _window(out, d, start, out.shape[:d] + (stop - start,) + out.shape[d + 1:]))
    parts = []
    for start, g in tiling.pieces:
        window = _window(out, d, start, _shape(g))
        if g in tiling.reshapes:
            # the reshape's input, copied into the window seen in its shape (no
            # copy of its own first); where that view cannot be, as the reshape
            v = e.vals[g.args[0]]
            seen = strided_reshape(window, v.shape)
            window, v = (seen, v) if seen is not None else (window, _reshape(e, v, {}, window.shape))
        else:
            v = e.vals[g]
        parts.append(e.copy_into(window, v))
    if parts:
        e.emit(_render("cat.c.j2", parts=parts))
    e.vals[node] = out


def _slice_backward(e, node, low):
    g = e.vals[node.args[0]]
    p = node.kwargs
    out = e.fresh(node)
    _fill(e, out)
    dst = sliced(out, p["dim"], dim(p["start"]), dim(p["step"]))
    e.emit(_render(low.template,
                   copy=e.copy_into(dst.with_layout(g.shape, dst.strides, dst.offset), g)))
    e.vals[node] = out


def _as_strided_scatter(e, node, low):
    base, src = e.vals[node.args[0]], e.vals[node.args[1]]
    p = node.kwargs
    out = e.fresh(node)
    dst = out.with_layout(tuple(map(dim, p["shape"])), tuple(map(dim, p["strides"])),
                          dim(p["offset"]))
    e.emit(_render(low.template, base=e.copy_into(out, base),
                   src=e.copy_into(dst, src)))
    e.vals[node] = out


def _gather_like(e, node, low):
    scatter = low.options["scatter"]
    if scatter:
        src, idx = e.vals[node.args[0]], e.vals[node.args[1]]
    else:
        x, idx = e.vals[node.args[0]], e.vals[node.args[1]]
    d = node.kwargs["dim"]
    out = e.fresh(node)
    loop = idx.shape
    names = [f"i{k}" for k in range(len(loop))]
    table = out if scatter else x
    other = src if scatter else out
    base = [0 if k == d else s for k, s in enumerate(table.strides)]
    n = table.shape[d]
    code = _error(e, f"index out of bounds in {node.target} along "
                     f"dim {d} (size {n})")
    if scatter:
        _fill(e, out)
    e.emit(_render(low.template, scatter=scatter, T=out.ctype,
                   loops=[(nm, c_expr(s)) for nm, s in zip(names, loop)],
                   idx=f"{e.ptr(idx)}[{e.index(idx.offset, idx.strides, names)}]",
                   n=c_expr(n), code=code, table=e.ptr(table),
                   table_index=e.index(table.offset, base, names), step=c_expr(table.strides[d]),
                   other=f"{e.ptr(other)}[{e.index(other.offset, other.strides, names)}]"))
    e.vals[node] = out


def _wrap_index(e, node, low):
    idx = e.contiguous(e.vals[node.args[0]])
    out = e.fresh(node)
    n = node.kwargs["size"]
    code = _error(e, f"index out of bounds in {node.target} (size {n})")
    e.emit(_render(low.template, count=c_expr(prod(out.shape)), n=c_expr(n), code=code,
                   src=f"{e.ptr(idx)} + {c_expr(idx.offset)}", out=e.ptr(out)))
    e.vals[node] = out


def _index_like(e, node, low):
    """y = x[indices]; accumulating: x = zeros, x[indices] += y."""
    accumulate = low.options["accumulate"]
    pattern = node.kwargs["pattern"]
    if accumulate:
        y = e.vals[node.args[0]]
        x = out = e.fresh(node)
        _fill(e, out)
    else:
        x = e.vals[node.args[0]]
        y = out = e.fresh(node)
    indices = [e.vals[a] for a in node.args[1:]]
    nb = max(len(i.shape) for i in indices)
    D = [d for d, p in enumerate(pattern) if p is not None]
    adjacent = D == list(range(D[0], D[-1] + 1))
    b0 = D[0] if adjacent else 0
    ynames = [f"i{k}" for k in range(len(y.shape))]
    # which y dim walks each plain x dim
    plain = [d for d in range(len(x.shape)) if d not in D]
    if adjacent:
        ydim = {d: (d if d < b0 else d - len(D) + nb) for d in plain}
    else:
        ydim = {d: nb + j for j, d in enumerate(plain)}
    x_strides = [0] * len(y.shape)
    for d in plain:
        x_strides[ydim[d]] = x.strides[d]
    reads = []
    for d in D:
        v = indices[pattern[d]]
        lead = nb - len(v.shape)
        strides = [0] * len(y.shape)
        for t, (size, s) in enumerate(zip(v.shape, v.strides)):
            strides[b0 + lead + t] = 0 if size == 1 else s
        reads.append((f"j{d}", f"{e.ptr(v)}[{e.index(v.offset, strides, ynames)}]",
                      c_expr(x.shape[d]), c_expr(x.strides[d])))
    code = _error(e, f"index out of bounds in {'index_put' if accumulate else 'index'} "
                     f"(shape {tuple(x.shape)})")
    e.emit(_render(low.template, accumulate=accumulate, code=code,
                   loops=[(nm, c_expr(s)) for nm, s in zip(ynames, y.shape)], reads=reads,
                   x=e.ptr(x), x_index=e.index(x.offset, x_strides, ynames),
                   y=f"{e.ptr(y)}[{e.index(y.offset, y.strides, ynames)}]"))
    e.vals[node] = out


# Lowering kind (``compiled_autograd.runtime.lowering``) -> its emitter.
EMITTERS = {
    "elementwise": _elementwise, "view": _view, "reduction": _reduce, "argreduce": _argmax,
    "gemm": _matmul, "gemm_bias": _linear, "row_softmax": _softmax, "row_normalize": _layer_norm,
    "concat": _cat, "slice_scatter": _slice_backward, "strided_scatter": _as_strided_scatter,
    "gather_scatter": _gather_like, "advanced_index": _index_like, "index_check": _wrap_index,
}

__all__ = ["EMITTERS", "LAYOUTS", "emit", "tiled_sum"]
