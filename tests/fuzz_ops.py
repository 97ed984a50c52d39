"""The op table of the random programs (tests/fuzz_programs.py): each entry is
``name: (pick, apply)``. ``pick(rng, pool)`` chooses operands among the pool's
values (``.shape``, ``.requires_grad``, ``.maxabs``) where their shapes fit and
draws the op's parameters, or returns None; ``pick.params`` draws the parameters
again for other shapes (resize). ``apply(m, xs, params)`` runs the op in ``m``,
``compiled_autograd`` or ``torch`` (the APIs match)."""
from __future__ import annotations

import numpy as np

# ------------------------------------------------------------------ picking


def _recent(rng, pool, ok=lambda v: True):
    """An index of the pool whose value passes ``ok``: mostly one of the last
    three such values, sometimes any."""
    found = [i for i, v in enumerate(pool) if ok(v)]
    if not found:
        return None
    if rng.random() < 0.6:
        return found[-1 - int(rng.integers(min(3, len(found))))]
    return found[int(rng.integers(len(found)))]


def _partner(rng, pool, i, ok):
    """An index j (maybe i itself) with ok(pool[i], pool[j])."""
    found = [j for j, v in enumerate(pool) if ok(pool[i], v)]
    return found[int(rng.integers(len(found)))] if found else None


def _small(v):
    return v.maxabs <= 3.0


def _rank(*ranks):
    return lambda v: len(v.shape) in ranks


def _one(ok=lambda v: True, params=lambda rng, v: {}):
    def pick(rng, pool):
        i = _recent(rng, pool, ok)
        return None if i is None else ([i], params(rng, pool[i]))
    pick.params = params            # (resize: the arrays again, for other shapes)
    return pick


def _two(ok_first, ok_pair, params=lambda rng, a, b: {}):
    def pick(rng, pool):
        i = _recent(rng, pool, ok_first)
        if i is None:
            return None
        j = _partner(rng, pool, i, ok_pair)
        return None if j is None else ([i, j], params(rng, pool[i], pool[j]))
    pick.params = params
    return pick


def _same_shape(a, b):
    return a.shape == b.shape


def _dim(rng, v, min_size=1):
    dims = [d for d, n in enumerate(v.shape) if n >= min_size]
    return int(dims[int(rng.integers(len(dims)))]) if dims else None


def _with_dim(min_size=1, **extra):
    def params(rng, v):
        return dict(dim=_dim(rng, v, min_size), **{k: f(rng) for k, f in extra.items()})
    return params


def _has_dim(min_size):
    return lambda v: any(n >= min_size for n in v.shape)


# ------------------------------------------------------------------ the ops


def F(m):
    return m.nn.functional


_FUNCTIONS: dict = {}


BACKWARD_CALLS = [0]   # calls of the opaque Functions' backwards (compiled must equal eager)


def _functions(m):
    """Custom autograd.Functions (the same class bodies for ca and torch): one
    that saves its input, one whose backward computes with a size, one that keeps
    its operands as ctx attributes. Each twice: as is (under compiled_backward
    its backward runs as Python, a call_backward node; it counts its calls in
    ``BACKWARD_CALLS``), and declared ``inline_backward`` (traced into prims)."""
    if m not in _FUNCTIONS:
        class Square(m.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                return grad * 2.0 * x

        class PerRow(m.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * (1.0 / x.shape[-1])

            @staticmethod
            def backward(ctx, grad):
                return grad * (1.0 / grad.shape[-1])

        class MulByAttributes(m.autograd.Function):
            # Its operands kept as ctx attributes (not saved tensors): either may
            # be a leaf, whose accumulation needs the Tensor itself.
            @staticmethod
            def forward(ctx, x, y):
                ctx.x, ctx.y = x, y
                return x * y

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.y, grad * ctx.x
        table = {}
        for name, cls in (("square", Square), ("per_row", PerRow),
                          ("mul_attrs", MulByAttributes)):
            table[name] = type(cls.__name__ + "Counted", (cls,),
                               {"backward": staticmethod(_counted(cls.backward))})
            table[name + "_inline"] = type(cls.__name__ + "Inline", (cls,),
                                           {"inline_backward": True})
        _FUNCTIONS[m] = table
    return _FUNCTIONS[m]


def _counted(backward):
    def counted(ctx, *grads):
        BACKWARD_CALLS[0] += 1
        return backward(ctx, *grads)
    return counted


def _const(m, array):
    """Indices (int64) or a mask (bool) as a tensor of ``m``."""
    return m.from_numpy(np.array(array))     # (a 0-d mask stays 0-d)


def _inplace(kind):
    def apply(m, xs, p):
        b = xs[0].clone()
        other = xs[1] if len(xs) > 1 else None
        if kind == "mul_":
            b.mul_(other)
        elif kind == "sub_alpha":
            b.sub_(other, alpha=0.5)
        elif kind == "select_mul_":
            b.select(0, p["index"]).mul_(other.select(0, p["index"]))
        elif kind == "setitem_slice":
            b[1:] = other[1:]
        elif kind == "transpose_add_":
            b.transpose(0, 1).add_(p["c"])
        elif kind == "relu_":
            b.relu_()
        elif kind == "clamp_":
            b.clamp_(-0.5, 0.5)
        elif kind == "setitem_mask":
            b[_const(m, p["mask"])] = 0.0
        elif kind == "zero_row":
            b[0].zero_()
        elif kind == "add_alpha_":
            b.add_(other, alpha=-0.3)
        elif kind == "div_":
            b.div_(other * other + 1.0)
        elif kind == "fill_row":
            b[0].fill_(0.25)
        elif kind == "copy_row":
            b[0].copy_(other[0])
        return b * xs[0] if kind in ("zero_row", "setitem_mask", "fill_row") else b
    return apply


def _split(p, shape):
    return max(1, shape[p["dim"]] // 2)


OPS = {
    # elementwise, one operand
    "sin": (_one(), lambda m, xs, p: xs[0].sin()),
    "cos": (_one(), lambda m, xs, p: xs[0].cos()),
    "tanh": (_one(), lambda m, xs, p: xs[0].tanh()),
    "sigmoid": (_one(), lambda m, xs, p: xs[0].sigmoid()),
    "scale": (_one(params=lambda rng, v: dict(c=float(rng.uniform(-1.5, 1.5)))),
              lambda m, xs, p: xs[0] * p["c"]),
    "shift": (_one(params=lambda rng, v: dict(c=float(rng.uniform(-0.5, 0.5)))),
              lambda m, xs, p: xs[0] + p["c"]),
    "rsub": (_one(), lambda m, xs, p: 1.0 - xs[0]),
    "neg": (_one(), lambda m, xs, p: -xs[0]),
    "relu": (_one(), lambda m, xs, p: xs[0].relu()),
    "gelu": (_one(), lambda m, xs, p: F(m).gelu(xs[0])),
    "gelu_tanh": (_one(), lambda m, xs, p: F(m).gelu(xs[0], approximate="tanh")),
    "abs": (_one(), lambda m, xs, p: xs[0].abs()),
    "square": (_one(_small), lambda m, xs, p: xs[0] * xs[0]),
    "cube": (_one(_small), lambda m, xs, p: xs[0].pow(3)),
    "exp_tanh": (_one(), lambda m, xs, p: xs[0].tanh().exp()),
    "log_sq1": (_one(_small), lambda m, xs, p: (xs[0] * xs[0] + 1.0).log()),
    "sqrt_sq": (_one(_small), lambda m, xs, p: (xs[0] * xs[0] + 0.5).sqrt()),
    "clamp": (_one(), lambda m, xs, p: xs[0].clamp(-0.8, 0.8)),
    "square_fn": (_one(_small), lambda m, xs, p: _functions(m)["square"].apply(xs[0])),
    "per_row_fn": (_one(_rank(1, 2, 3)), lambda m, xs, p: _functions(m)["per_row"].apply(xs[0])),
    "mul_attrs_fn": (_two(_small, lambda a, b: _same_shape(a, b) and _small(b)),
                     lambda m, xs, p: _functions(m)["mul_attrs"].apply(xs[0], xs[1])),
    "square_fn_inline": (_one(_small),
                         lambda m, xs, p: _functions(m)["square_inline"].apply(xs[0])),
    "per_row_fn_inline": (_one(_rank(1, 2, 3)),
                          lambda m, xs, p: _functions(m)["per_row_inline"].apply(xs[0])),
    "mul_attrs_fn_inline": (_two(_small, lambda a, b: _same_shape(a, b) and _small(b)),
                            lambda m, xs, p: _functions(m)["mul_attrs_inline"].apply(xs[0],
                                                                                      xs[1])),
    # elementwise, two operands (of one shape, or broadcast)
    "add": (_two(lambda v: True, _same_shape), lambda m, xs, p: xs[0] + xs[1]),
    "sub": (_two(lambda v: True, _same_shape), lambda m, xs, p: xs[0] - xs[1]),
    "mul": (_two(_small, lambda a, b: _same_shape(a, b) and _small(b)),
            lambda m, xs, p: xs[0] * xs[1]),
    "div": (_two(lambda v: True, lambda a, b: _same_shape(a, b) and _small(b)),
            lambda m, xs, p: xs[0] / (xs[1] * xs[1] + 1.0)),
    "maximum": (_two(lambda v: True, _same_shape), lambda m, xs, p: m.maximum(xs[0], xs[1])),
    "minimum": (_two(lambda v: True, _same_shape), lambda m, xs, p: m.minimum(xs[0], xs[1])),
    "where": (_two(lambda v: True, _same_shape),
              lambda m, xs, p: m.where(xs[0] > xs[1], xs[0], xs[1] * 0.5)),
    "add_row": (_two(_rank(2, 3), lambda a, b: b.shape == a.shape[-1:]),
                lambda m, xs, p: xs[0] + xs[1]),
    "mul_row": (_two(_small, lambda a, b: b.shape == a.shape[-1:] and _small(b)),
                lambda m, xs, p: xs[0] * xs[1]),
    "mul_scalar": (_two(_small, lambda a, b: b.shape == () and _small(b)),
                   lambda m, xs, p: xs[0] * xs[1]),
    "sub_keepdim": (_two(_rank(2), lambda a, b: len(b.shape) == 2 and (
        b.shape == (a.shape[0], 1) or b.shape == (1, a.shape[1]))),
        lambda m, xs, p: xs[0] - xs[1]),
    "mse": (_two(lambda v: True, _same_shape), lambda m, xs, p: F(m).mse_loss(xs[0], xs[1])),
    # reductions and normalisations
    "sum_dim": (_one(_rank(1, 2, 3), _with_dim(keepdim=lambda rng: bool(rng.integers(2)))),
                lambda m, xs, p: xs[0].sum(p["dim"], keepdim=p["keepdim"])),
    "sum_all": (_one(), lambda m, xs, p: xs[0].sum()),
    "mean_dim": (_one(_rank(1, 2, 3), _with_dim()), lambda m, xs, p: xs[0].mean(p["dim"])),
    "mean_all": (_one(), lambda m, xs, p: xs[0].mean()),
    "var_dim": (_one(_has_dim(2), _with_dim(2)), lambda m, xs, p: xs[0].var(p["dim"])),
    "amax_dim": (_one(_rank(1, 2, 3), _with_dim(keepdim=lambda rng: bool(rng.integers(2)))),
                 lambda m, xs, p: xs[0].amax(p["dim"], keepdim=p["keepdim"])),
    "softmax": (_one(_rank(1, 2, 3), _with_dim()), lambda m, xs, p: F(m).softmax(xs[0], p["dim"])),
    "log_softmax": (_one(_rank(1, 2, 3), _with_dim()),
                    lambda m, xs, p: F(m).log_softmax(xs[0], p["dim"])),
    "layer_norm": (_one(lambda v: len(v.shape) >= 1 and v.shape[-1] >= 2),
                   lambda m, xs, p: F(m).layer_norm(xs[0], xs[0].shape[-1:])),
    "layer_norm_affine": (_two(lambda v: len(v.shape) == 2 and v.shape[-1] >= 2,
                               lambda a, b: b.shape == a.shape[-1:]),
                          lambda m, xs, p: F(m).layer_norm(xs[0], xs[0].shape[-1:], xs[1], xs[1])),
    "cross_entropy": (_one(_rank(2), params=lambda rng, v: dict(
        target=rng.integers(v.shape[1], size=v.shape[0]))),
        lambda m, xs, p: F(m).cross_entropy(xs[0], _const(m, p["target"]))),
    # matrix products
    "matmul": (_two(lambda v: len(v.shape) == 2 and _small(v),
                    lambda a, b: len(b.shape) == 2 and b.shape[0] == a.shape[1] and _small(b)),
               lambda m, xs, p: xs[0] @ xs[1]),
    "matmul_tn": (_two(lambda v: len(v.shape) == 2 and _small(v),
                       lambda a, b: len(b.shape) == 2 and b.shape[0] == a.shape[0] and _small(b)),
                  lambda m, xs, p: xs[0].t() @ xs[1]),
    "matmul_nt": (_two(lambda v: len(v.shape) == 2 and _small(v),
                       lambda a, b: len(b.shape) == 2 and b.shape[1] == a.shape[1] and _small(b)),
                  lambda m, xs, p: xs[0] @ xs[1].transpose(0, 1)),
    "matvec": (_two(lambda v: len(v.shape) == 2 and _small(v),
                    lambda a, b: b.shape == a.shape[1:] and _small(b)),
               lambda m, xs, p: xs[0] @ xs[1]),
    "bmm": (_two(lambda v: len(v.shape) == 3 and _small(v),
                 lambda a, b: len(b.shape) == 2 and b.shape[0] == a.shape[2] and _small(b)),
            lambda m, xs, p: xs[0] @ xs[1]),
    "linear": (_two(lambda v: len(v.shape) == 2 and _small(v),
                    lambda a, b: len(b.shape) == 2 and b.shape[1] == a.shape[1] and _small(b)),
               lambda m, xs, p: F(m).linear(xs[0], xs[1])),
    "attention": (_two(lambda v: len(v.shape) == 2 and _small(v),
                       lambda a, b: _same_shape(a, b) and _small(b),
                       lambda rng, a, b: dict(causal=bool(rng.integers(2)))),
                  lambda m, xs, p: F(m).scaled_dot_product_attention(
                      xs[0], xs[1], xs[1] * 0.5, is_causal=p["causal"])),
    # shapes, views and indexing
    "transpose": (_one(_rank(2)), lambda m, xs, p: xs[0].transpose(0, 1)),
    "permute": (_one(_rank(3)), lambda m, xs, p: xs[0].permute(2, 0, 1)),
    "flatten": (_one(_rank(2, 3)), lambda m, xs, p: xs[0].reshape(-1)),
    "reshape_swap": (_one(_rank(2)), lambda m, xs, p: xs[0].reshape(xs[0].shape[1], xs[0].shape[0])),
    "expand": (_one(_rank(1, 2)), lambda m, xs, p: xs[0].unsqueeze(0).expand(3, *xs[0].shape)),
    "unsqueeze": (_one(_rank(0, 1, 2)), lambda m, xs, p: xs[0].unsqueeze(-1)),
    "squeeze": (_one(lambda v: 1 in v.shape), lambda m, xs, p: xs[0].squeeze()),
    "slice_rows": (_one(lambda v: len(v.shape) >= 1 and v.shape[0] >= 2),
                   lambda m, xs, p: xs[0][1:]),
    "slice_step": (_one(lambda v: len(v.shape) == 2 and v.shape[1] >= 2),
                   lambda m, xs, p: xs[0][:, ::2]),
    "select": (_one(lambda v: len(v.shape) >= 1, lambda rng, v: dict(index=int(rng.integers(v.shape[0])))),
               lambda m, xs, p: xs[0].select(0, p["index"])),
    "narrow": (_one(_has_dim(2), _with_dim(2)),
               lambda m, xs, p: xs[0].narrow(p["dim"], 1, xs[0].shape[p["dim"]] - 1)),
    "chunk": (_one(_has_dim(2), _with_dim(2, part=lambda rng: int(rng.integers(2)))),
              lambda m, xs, p: xs[0].chunk(2, p["dim"])[p["part"]]),
    "split": (_one(_has_dim(3), _with_dim(3, part=lambda rng: int(rng.integers(2)))),
              lambda m, xs, p: xs[0].split(_split(p, xs[0].shape), p["dim"])[p["part"]]),
    "cat": (_two(_rank(1, 2), _same_shape, lambda rng, a, b: dict(dim=int(rng.integers(len(a.shape))))),
            lambda m, xs, p: m.cat([xs[0], xs[1]], p["dim"])),
    "stack": (_two(_rank(1, 2), _same_shape), lambda m, xs, p: m.stack([xs[0], xs[1]])),
    "gather_rows": (_one(lambda v: len(v.shape) >= 1 and v.shape[0] >= 1, lambda rng, v: dict(
        index=rng.integers(v.shape[0], size=int(rng.integers(1, 6))))),
        lambda m, xs, p: xs[0][_const(m, p["index"])]),
    "mask": (_one(lambda v: len(v.shape) >= 1, lambda rng, v: dict(mask=rng.random(v.shape) < 0.6)),
             lambda m, xs, p: xs[0][_const(m, p["mask"])]),
    "embedding": (_one(_rank(2), lambda rng, v: dict(index=rng.integers(v.shape[0], size=4))),
                  lambda m, xs, p: F(m).embedding(_const(m, p["index"]), xs[0])),
    "clone": (_one(), lambda m, xs, p: xs[0].clone()),
    # in place, on a clone
    "mul_": (_two(_small, lambda a, b: _same_shape(a, b) and _small(b)), _inplace("mul_")),
    "sub_alpha": (_two(lambda v: True, _same_shape), _inplace("sub_alpha")),
    "select_mul_": (_two(lambda v: len(v.shape) == 2 and _small(v),
                         lambda a, b: _same_shape(a, b) and _small(b),
                         lambda rng, a, b: dict(index=int(rng.integers(a.shape[0])))),
                    _inplace("select_mul_")),
    "setitem_slice": (_two(lambda v: len(v.shape) >= 1 and v.shape[0] >= 2, _same_shape),
                      _inplace("setitem_slice")),
    "transpose_add_": (_one(_rank(2), lambda rng, v: dict(c=float(rng.uniform(-1, 1)))),
                       _inplace("transpose_add_")),
    "relu_": (_one(), _inplace("relu_")),
    "clamp_": (_one(), _inplace("clamp_")),
    "setitem_mask": (_one(_small, lambda rng, v: dict(mask=rng.random(v.shape) < 0.5)),
                     _inplace("setitem_mask")),
    "zero_row": (_one(lambda v: len(v.shape) >= 1 and _small(v)), _inplace("zero_row")),
    "add_alpha_": (_two(lambda v: True, _same_shape), _inplace("add_alpha_")),
    "div_": (_two(lambda v: True, lambda a, b: _same_shape(a, b) and _small(b)), _inplace("div_")),
    "fill_row": (_one(lambda v: len(v.shape) >= 1 and _small(v)), _inplace("fill_row")),
    "copy_row": (_two(lambda v: len(v.shape) >= 1, _same_shape), _inplace("copy_row")),
    # more reductions, views and mixes
    "std_dim": (_one(_has_dim(2), _with_dim(2)), lambda m, xs, p: xs[0].std(p["dim"])),
    "amin_dim": (_one(_rank(1, 2, 3), _with_dim()), lambda m, xs, p: xs[0].amin(p["dim"])),
    "max_dim": (_one(_rank(1, 2, 3), _with_dim()), lambda m, xs, p: xs[0].max(p["dim"])[0]),
    "min_dim": (_one(_rank(1, 2, 3), _with_dim()), lambda m, xs, p: xs[0].min(p["dim"])[0]),
    "sum_dims": (_one(_rank(2, 3)), lambda m, xs, p: xs[0].sum((0, 1))),
    "mean_keepdim": (_one(_rank(1, 2, 3), _with_dim()),
                     lambda m, xs, p: xs[0].mean(p["dim"], keepdim=True)),
    "softmax_last": (_one(_rank(1, 2, 3)), lambda m, xs, p: F(m).softmax(xs[0], -1)),
    "masked_fill": (_one(lambda v: True, lambda rng, v: dict(mask=rng.random(v.shape) < 0.4)),
                    lambda m, xs, p: xs[0].masked_fill(_const(m, p["mask"]), 0.5)),
    "erf": (_one(), lambda m, xs, p: xs[0].erf()),
    "clamp_min": (_one(), lambda m, xs, p: xs[0].clamp(min=-0.2)),
    "where_scalar": (_one(), lambda m, xs, p: m.where(xs[0] > 0.1, xs[0], 0.0)),
    "maximum_row": (_two(_rank(2, 3), lambda a, b: b.shape == a.shape[-1:]),
                    lambda m, xs, p: m.maximum(xs[0], xs[1])),
    "pow_tensor": (_two(lambda v: True, lambda a, b: _same_shape(a, b) and _small(b)),
                   lambda m, xs, p: (xs[0].sigmoid() + 0.5).pow(xs[1])),
    "dot": (_two(lambda v: len(v.shape) == 1 and _small(v),
                 lambda a, b: _same_shape(a, b) and _small(b)),
            lambda m, xs, p: xs[0] @ xs[1]),
    "detach_mix": (_one(_small), lambda m, xs, p: xs[0] * xs[0].detach()),
    "transpose12": (_one(_rank(3)), lambda m, xs, p: xs[0].transpose(1, 2)),
    "contiguous_t": (_one(_rank(2)), lambda m, xs, p: xs[0].t().contiguous()),
    "reshape_t": (_one(_rank(2)), lambda m, xs, p: xs[0].t().reshape(-1)),
    "view_same": (_one(), lambda m, xs, p: xs[0].view(xs[0].shape)),
    "expand_mid": (_one(_rank(2)), lambda m, xs, p: xs[0].unsqueeze(1).expand(
        xs[0].shape[0], 3, xs[0].shape[1])),
    "cat3": (_two(_rank(1, 2), _same_shape, lambda rng, a, b: dict(dim=int(rng.integers(len(a.shape))))),
             lambda m, xs, p: m.cat([xs[0], xs[1], xs[0]], p["dim"])),
}
