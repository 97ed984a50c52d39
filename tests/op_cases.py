"""One table of op cases. Each case is written once as ``fn(m, *inputs)`` where ``m``
is either ``compiled_autograd`` or ``torch`` (the APIs match), so the same expression
runs in both libraries.

Input specs: ``(shape)`` a float input that requires grad; ``("pos", shape)`` a
positive float input; ``("idx", shape, high)`` int64 indices in [0, high);
``("mask", shape)`` a boolean mask; ``("away", shape)`` floats kept away from 0 (for
ops with kinks at 0).
"""
from __future__ import annotations

import numpy as np

S = ()  # 0-d


def F(m):
    return m.nn.functional


def _mul_on_view(m, x, y):
    b = x * 1.0
    b[1].mul_(y)
    return b


def _setitem_slice(m, x, y):
    b = x.clone()
    b[1:3] = y
    return b * b


def _add_on_transpose(m, x):
    b = x.clone()
    b.transpose(0, 1).add_(1.0)
    return b.exp()


def _imul_select(m, x, y):
    b = x.clone()
    s = b.select(0, 0)
    s *= y
    return s * b.sum(0)


def _inplace_chain(m, x, y):
    b = x * 2
    b.mul_(y)
    b.sub_(x, alpha=0.5)
    b.div_(y)
    b.relu_()
    return b


def _fill_zero_copy(m, x, y):
    b = x.clone()
    b[0].zero_()
    b[1].fill_(2.0)
    b[:, 0].copy_(y)
    return b * x


def _clamp_inplace(m, x):
    b = x * 1.0
    b.clamp_(-0.5, 0.5)
    return b


def _setitem_mask(m, x, mask):
    b = x * 3.0
    b[mask] = 0.0
    return b


def _view_of_view(m, x, y):
    b = x.clone()
    v = b[1:, :].transpose(0, 1)[::2]
    v.mul_(y)
    return b.sin()


CASES = [
    # name, fn, input specs
    ("add", lambda m, x, y: x + y, [(3, 4), (3, 4)]),
    ("add_broadcast", lambda m, x, y: x + y, [(2, 3, 4), (3, 1)]),
    ("add_scalar", lambda m, x: 2.5 + x, [(3,)]),
    ("add_0d", lambda m, x, y: x + y, [S, (2, 3)]),
    ("sub_broadcast", lambda m, x, y: x - y, [(1, 4), (3, 1)]),
    ("rsub", lambda m, x: 1.0 - x, [(2, 2)]),
    ("mul_broadcast", lambda m, x, y: x * y, [(4, 1, 3), (2, 3)]),
    ("mul_0d", lambda m, x: x * x, [S]),
    ("div", lambda m, x, y: x / y, [(3, 4), ("pos", (4,))]),
    ("rdiv", lambda m, x: 2.0 / x, [("pos", (3,))]),
    ("neg", lambda m, x: -x, [(2, 3)]),
    ("exp", lambda m, x: x.exp(), [(2, 3)]),
    ("log", lambda m, x: x.log(), [("pos", (2, 3))]),
    ("log1p", lambda m, x: x.log1p(), [("pos", (2, 3))]),
    ("sqrt", lambda m, x: x.sqrt(), [("pos", (5,))]),
    ("abs", lambda m, x: x.abs(), [("away", (2, 3))]),
    ("sin", lambda m, x: x.sin(), [(3, 1)]),
    ("cos", lambda m, x: x.cos(), [(3,)]),
    ("tanh", lambda m, x: x.tanh(), [(2, 3)]),
    ("sigmoid", lambda m, x: x.sigmoid(), [(2, 3)]),
    ("erf", lambda m, x: x.erf(), [(2, 3)]),
    ("relu", lambda m, x: x.relu(), [("away", (3, 4))]),
    ("gelu", lambda m, x: F(m).gelu(x), [(3, 4)]),
    ("gelu_tanh", lambda m, x: F(m).gelu(x, approximate="tanh"), [(3, 4)]),
    ("pow_scalar", lambda m, x: x ** 3, [(2, 3)]),
    ("pow_frac", lambda m, x: x ** 1.5, [("pos", (4,))]),
    ("pow_tensor", lambda m, x, y: x.pow(y), [("pos", (2, 3)), (3,)]),
    ("rpow", lambda m, x: 2.0 ** x, [(3,)]),
    ("maximum", lambda m, x, y: m.maximum(x, y), [(3, 4), (4,)]),
    ("minimum", lambda m, x, y: m.minimum(x, y), [(3, 1), (3, 4)]),
    ("clamp", lambda m, x: x.clamp(-0.5, 0.5), [("away", (4, 3))]),
    ("clamp_min", lambda m, x: x.clamp(min=0.1), [("away", (6,))]),
    ("where", lambda m, c, x, y: m.where(c, x, y), [("mask", (3, 4)), (3, 4), (4,)]),
    ("where_scalar", lambda m, c, x: m.where(c, x, 0.0), [("mask", (2, 3)), (2, 3)]),
    ("sum_all", lambda m, x: x.sum(), [(3, 4)]),
    ("sum_dim", lambda m, x: x.sum(1), [(2, 3, 4)]),
    ("sum_dims_keepdim", lambda m, x: x.sum((0, 2), keepdim=True), [(2, 3, 4)]),
    ("sum_0d", lambda m, x: x.sum(), [S]),
    ("mean", lambda m, x: x.mean(-1), [(3, 5)]),
    ("mean_all", lambda m, x: x.mean(), [(2, 3)]),
    ("var", lambda m, x: x.var(1), [(3, 5)]),
    ("var_all_keepdim", lambda m, x: x.var(None, keepdim=True), [(2, 4)]),
    ("amax", lambda m, x: x.amax(1), [(3, 5)]),
    ("amax_keepdim", lambda m, x: x.amax((0, 1), keepdim=True), [(2, 3, 2)]),
    ("max_all", lambda m, x: x.max(), [(3, 4)]),
    ("max_dim", lambda m, x: x.max(1).values, [(3, 5)]),
    ("max_dim_keepdim", lambda m, x: x.max(0, keepdim=True)[0], [(3, 5)]),
    ("gather", lambda m, x, i: x.gather(1, i), [(3, 5), ("idx", (3, 4), 5)]),
    ("gather_one", lambda m, x, i: m.gather(x, 0, i), [(4, 3), ("idx", (1, 3), 4)]),
    ("gather_smaller", lambda m, x, i: x.gather(0, i), [(4, 3), ("idx", (2, 2), 4)]),
    ("min_dim", lambda m, x: x.min(-1).values, [(4, 3)]),
    ("softmax", lambda m, x: x.softmax(-1), [(3, 5)]),
    ("softmax_dim0", lambda m, x: F(m).softmax(x, 0), [(4, 2)]),
    ("log_softmax", lambda m, x: F(m).log_softmax(x, 1), [(2, 5, 3)]),
    ("matmul_2d", lambda m, x, y: x @ y, [(3, 4), (4, 5)]),
    ("matmul_batched", lambda m, x, y: x @ y, [(2, 3, 4), (2, 4, 5)]),
    ("matmul_broadcast", lambda m, x, y: x.matmul(y), [(2, 1, 3, 4), (3, 4, 2)]),
    ("matmul_vec", lambda m, x, y: x @ y, [(3, 4), (4,)]),
    ("matmul_vecmat", lambda m, x, y: x @ y, [(4,), (4, 2)]),
    ("matmul_dot", lambda m, x, y: x @ y, [(4,), (4,)]),
    ("reshape", lambda m, x: x.reshape(4, -1) * 2, [(2, 3, 2)]),
    ("view", lambda m, x: x.view(6, 2).exp(), [(3, 4)]),
    ("reshape_noncontig", lambda m, x: x.t().reshape(-1).sin(), [(3, 4)]),
    ("transpose", lambda m, x: x.transpose(0, 2).sin(), [(2, 3, 4)]),
    ("permute", lambda m, x: x.permute(2, 0, 1) * 3, [(2, 3, 4)]),
    ("t", lambda m, x, y: x.t() @ y, [(3, 4), (3, 2)]),
    ("expand", lambda m, x: x.expand(3, 4) * 1.5, [(3, 1)]),
    ("expand_new_dims", lambda m, x: x.expand(2, 3, 4).exp(), [(4,)]),
    ("unsqueeze", lambda m, x: x.unsqueeze(1).exp(), [(3, 4)]),
    ("squeeze", lambda m, x: x.squeeze().exp(), [(3, 1, 4, 1)]),
    ("squeeze_dim", lambda m, x: x.squeeze(1).exp(), [(3, 1, 4)]),
    ("flatten", lambda m, x: x.flatten(1).sin(), [(2, 3, 4)]),
    ("contiguous", lambda m, x: x.t().contiguous().exp(), [(3, 4)]),
    ("clone", lambda m, x: x.clone() * x, [(3,)]),
    ("getitem_int", lambda m, x: x[1].exp(), [(3, 4)]),
    ("getitem_slice", lambda m, x: x[:, 1:3].exp(), [(3, 4)]),
    ("getitem_step", lambda m, x: x[::2, 1:].sin(), [(5, 4)]),
    ("getitem_neg", lambda m, x: x[-1, -2:].exp(), [(3, 4)]),
    ("getitem_none_ellipsis", lambda m, x: x[None, ..., 0].exp(), [(2, 3, 4)]),
    ("getitem_index", lambda m, x, i: x[i].exp(), [(5, 3), ("idx", (4,), 5)]),
    ("getitem_index_dup", lambda m, x, i: x[i] * 2, [(3, 2), ("idx", (6,), 3)]),
    ("getitem_index_2d", lambda m, x, i, j: x[i, j].exp(), [(4, 5), ("idx", (3,), 4),
                                                             ("idx", (3,), 5)]),
    ("getitem_slice_index", lambda m, x, i: x[1:, i].sin(), [(4, 5), ("idx", (2, 2), 5)]),
    ("getitem_mask", lambda m, x, b: x[b].exp(), [(3, 4), ("mask", (3, 4))]),
    ("narrow", lambda m, x: x.narrow(1, 1, 2).exp(), [(3, 4)]),
    ("select", lambda m, x: x.select(1, 2).exp(), [(3, 4)]),
    ("split", lambda m, x: x.split(2, 1)[1].exp() , [(3, 5)]),
    ("split_sizes", lambda m, x: x.split([1, 3], 0)[1].sin(), [(4, 2)]),
    ("chunk", lambda m, x: x.chunk(3, 0)[2] * 2, [(7, 2)]),
    ("cat", lambda m, x, y: m.cat([x, y], 1).exp(), [(2, 3), (2, 2)]),
    ("cat_dim0", lambda m, x, y, z: m.cat([x, y, z]).sin(), [(1, 3), (2, 3), (1, 3)]),
    ("stack", lambda m, x, y: m.stack([x, y], 1).exp(), [(2, 3), (2, 3)]),
    ("masked_fill", lambda m, x, b: x.masked_fill(b, 0.5).exp(), [(3, 4), ("mask", (3, 4))]),
    ("linear", lambda m, x, w, b: F(m).linear(x, w, b), [(5, 3), (4, 3), (4,)]),
    ("layer_norm", lambda m, x, w, b: F(m).layer_norm(x, (4,), w, b), [(3, 4), (4,), (4,)]),
    ("layer_norm_2d", lambda m, x: F(m).layer_norm(x, (3, 4)), [(2, 3, 4)]),
    ("embedding", lambda m, i, w: F(m).embedding(i, w), [("idx", (2, 3), 5), (5, 4)]),
    ("cross_entropy", lambda m, x, t: F(m).cross_entropy(x, t), [(4, 6), ("idx", (4,), 6)]),
    ("cross_entropy_sum", lambda m, x, t: F(m).cross_entropy(x, t, reduction="sum"),
     [(3, 5), ("idx", (3,), 5)]),
    ("cross_entropy_3d", lambda m, x, t: F(m).cross_entropy(x, t), [(2, 4, 3),
                                                                     ("idx", (2, 3), 4)]),
    ("mse_loss", lambda m, x, y: F(m).mse_loss(x, y), [(3, 4), (3, 4)]),
    ("sdpa", lambda m, q, k, v: F(m).scaled_dot_product_attention(q, k, v),
     [(2, 3, 4), (2, 5, 4), (2, 5, 2)]),
    ("sdpa_causal", lambda m, q, k, v: F(m).scaled_dot_product_attention(q, k, v, is_causal=True),
     [(1, 2, 4, 3), (1, 2, 4, 3), (1, 2, 4, 3)]),
    ("inplace_mul_on_view", _mul_on_view, [(3, 4), (4,)]),
    ("inplace_setitem_slice", _setitem_slice, [(4, 3), (2, 3)]),
    ("inplace_add_on_transpose", _add_on_transpose, [(3, 2)]),
    ("inplace_imul_select", _imul_select, [(3, 4), (4,)]),
    ("inplace_chain", _inplace_chain, [("away", (3, 4)), ("pos", (4,))]),
    ("inplace_fill_zero_copy", _fill_zero_copy, [(3, 4), (3,)]),
    ("inplace_clamp", _clamp_inplace, [("away", (5,))]),
    ("inplace_setitem_mask", _setitem_mask, [(3, 4), ("mask", (3, 4))]),
    ("inplace_view_of_view", _view_of_view, [(4, 5), (1, 3)]),
    ("chain", lambda m, x, y: ((x * y).tanh() + x.exp() / (y * y + 1)).sum(1).sigmoid(),
     [(3, 4), (4,)]),
]


def make_inputs(specs, seed, dtype=np.float64):
    """numpy arrays for the specs, and whether each requires grad."""
    rng = np.random.default_rng(seed)
    arrays, grads = [], []
    for spec in specs:
        kind, shape, extra = "float", spec, None
        if isinstance(spec, tuple) and spec and isinstance(spec[0], str):
            kind, shape, *rest = spec
            extra = rest[0] if rest else None
        if kind == "float":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif kind == "pos":
            arrays.append(rng.uniform(0.5, 2.0, shape).astype(dtype))
        elif kind == "away":
            sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
            arrays.append((sign * rng.uniform(0.2, 1.5, shape)).astype(dtype))
        elif kind == "idx":
            arrays.append(rng.integers(0, extra, shape).astype(np.int64))
        elif kind == "mask":
            arrays.append(rng.random(shape) < 0.5)
        grads.append(kind in ("float", "pos", "away"))
    return arrays, grads
