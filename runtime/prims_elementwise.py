"""Elementwise prims: unary, binary, comparisons, where, casts and fused activations.

Each prim's kernel, shape rule, save spec and derivative sit together; derivatives
are written in prims (``ops.*``) so they run on arrays, Tensors and proxies alike.
"""
from __future__ import annotations

import math

import numpy as np

from compiled_autograd.runtime.prims import (as_array, broadcast_shapes, compare_meta, dtype_of,
                           elementwise_meta, is_scalar, ops, prim, same_meta, shape_of, sum_to)
from compiled_autograd.runtime.kernels import call_native
from compiled_autograd.runtime.lowering import Elementwise
from compiled_autograd.runtime.special import erf as _erf

# ---------------------------------------------------------------- unary


@prim("neg", ufunc=np.negative, method="plain", meta=same_meta,
      c=Elementwise("-{{ a }}"))
def neg(x):
    return as_array(np.negative(x))


@neg.defvjp
def _(ctx, g):
    return (ops.neg(g),)


@prim("exp", method="float", meta=same_meta, save=("out",),
      c=Elementwise("ca_exp_{{ sfx }}({{ a }})"))
def exp(x):
    return as_array(np.exp(x))


@exp.defvjp
def _(ctx, g):
    (out,) = ctx.saved
    return (ops.mul(g, out),)


@prim("log", method="float", meta=same_meta, save=(0,),
      c=Elementwise("log({{ a }})"))
def log(x):
    return as_array(np.log(x))


@log.defvjp
def _(ctx, g):
    (x,) = ctx.saved
    return (ops.div(g, x),)


@prim("log1p", method="float", meta=same_meta, save=(0,),
      c=Elementwise("log1p({{ a }})"))
def log1p(x):
    """log(1 + x), accurate where x is small."""
    return as_array(np.log1p(x))


@log1p.defvjp
def _(ctx, g):
    (x,) = ctx.saved
    return (ops.div(g, ops.add(x, 1.0)),)


@prim("sqrt", ufunc=np.sqrt, method="float", meta=same_meta, save=("out",),
      c=Elementwise("sqrt({{ a }})"))
def sqrt(x, zero_grad_at_zero=False):
    """``zero_grad_at_zero``: the gradient is 0 where the result is 0 (torch's
    std; a plain sqrt's is inf there)."""
    return as_array(np.sqrt(x))


@sqrt.defvjp
def _(ctx, g):
    (out,) = ctx.saved
    if not ctx.params.get("zero_grad_at_zero"):
        return (ops.div(ops.mul(g, 0.5), out),)
    zero = ops.eq(out, 0.0)      # (divides by 1 there: no division by zero)
    return (ops.where(zero, 0.0, ops.div(ops.mul(g, 0.5), ops.where(zero, 1.0, out))),)


@prim("abs", method="plain", meta=same_meta, save=(0,),
      c=Elementwise("fabs({{ a }})"))
def abs_(x):
    return as_array(np.abs(x))


@abs_.defvjp
def _(ctx, g):
    (x,) = ctx.saved
    return (ops.mul(g, ops.sign(x)),)


@prim("sign", method="plain", meta=same_meta,
      c=Elementwise("ca_sign_{{ sfx }}({{ a }})"))
def sign(x):
    # torch: sign(NaN) is 0 (numpy's is NaN), so abs's gradient at NaN is 0 too
    out = np.sign(x)
    if out.dtype.kind == "f":
        out = np.where(np.isnan(out), out.dtype.type(0), out)
    return as_array(out)


@sign.defvjp
def _(ctx, g):
    # torch: sign is differentiable with a zero gradient everywhere.
    return (ops.full_like(g, value=0.0),)


@prim("sin", method="float", meta=same_meta, save=(0,),
      c=Elementwise("sin({{ a }})"))
def sin(x):
    return as_array(np.sin(x))


@sin.defvjp
def _(ctx, g):
    (x,) = ctx.saved
    return (ops.mul(g, ops.cos(x)),)


@prim("cos", method="float", meta=same_meta, save=(0,),
      c=Elementwise("cos({{ a }})"))
def cos(x):
    return as_array(np.cos(x))


@cos.defvjp
def _(ctx, g):
    (x,) = ctx.saved
    return (ops.neg(ops.mul(g, ops.sin(x))),)


@prim("tanh", method="float", meta=same_meta, save=("out",),
      c=Elementwise("tanh({{ a }})"))
def tanh(x):
    return as_array(np.tanh(x))


@tanh.defvjp
def _(ctx, g):
    (out,) = ctx.saved
    return (ops.mul(g, ops.sub(1.0, ops.mul(out, out))),)


@prim("sigmoid", method="float", meta=same_meta, save=("out",),
      c=Elementwise("ca_sigmoid_{{ sfx }}({{ a }})"))
def sigmoid(x):
    # Split by sign so exp never overflows.
    x = np.asarray(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


@sigmoid.defvjp
def _(ctx, g):
    (out,) = ctx.saved
    return (ops.mul(ops.mul(g, out), ops.sub(1.0, out)),)


@prim("erf", method="float", meta=same_meta, save=(0,),
      c=Elementwise("ca_erf_{{ sfx }}({{ a }})"))
def erf(x):
    return _erf(np.asarray(x))


@erf.defvjp
def _(ctx, g):
    (x,) = ctx.saved
    return (ops.mul(g, ops.mul(ops.exp(ops.neg(ops.mul(x, x))), 2.0 / math.sqrt(math.pi))),)


@prim("relu", method="plain", meta=same_meta, save=("out",),
      c=Elementwise("ca_maximum_{{ sfx }}({{ a }}, 0)"))
def relu(x):
    return as_array(np.maximum(x, 0))


@relu.defvjp
def _(ctx, g):
    # torch's threshold_backward: the gradient is 0 where the output is <= 0 and
    # passes elsewhere, at NaN too (NaN <= 0 is false).
    (out,) = ctx.saved
    return (ops.where(ops.ge(0.0, out), 0.0, g),)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@prim("gelu", meta=same_meta, save=(0,),
      c=Elementwise('{% if approximate == "tanh" %}ca_gelu_tanh_{{ sfx }}({{ a }}){% else %}ca_gelu_{{ sfx }}({{ a }}){% endif %}'))
def gelu(x, approximate="none"):
    out = call_native("gelu", x, approximate == "tanh")
    return gelu_numpy(x, approximate) if out is NotImplemented else out


def gelu_numpy(x, approximate="none"):
    """GELU in numpy: the reference of kernels.c's (erf: runtime/special.py)."""
    x = np.asarray(x)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        return as_array(0.5 * x * (1.0 + np.tanh(inner)))
    return as_array(0.5 * x * (1.0 + _erf(x * _INV_SQRT_2)))


@gelu.defvjp
def _(ctx, g):
    (x,) = ctx.saved
    return (ops.gelu_backward(g, x, approximate=ctx.params.get("approximate", "none")),)


@prim("gelu_backward", meta=elementwise_meta, save=((0, 1), 1),
      c=Elementwise("{{ a }} * ca_gelu_grad{{ '_tanh' if approximate is defined and "
                    "approximate == 'tanh' else '' }}_{{ sfx }}({{ b }})"))
def gelu_backward(g, x, approximate="none"):
    """torch's gelu_backward: g * gelu'(x). One prim, so that the C backend computes
    the derivative in one helper that shares exp(-x^2/2) between erf and the density."""
    x = np.asarray(x)
    if approximate == "tanh":
        x2 = x * x
        t = np.tanh((x + x2 * x * 0.044715) * _SQRT_2_OVER_PI)
        left_d = (t + 1.0) * 0.5
        right_d = (x * 0.5 * (1.0 - t * t)) * ((x2 * (3 * 0.044715) + 1.0) * _SQRT_2_OVER_PI)
        return as_array(np.multiply(g, left_d + right_d))
    cdf = (_erf(x * _INV_SQRT_2) + 1.0) * 0.5
    pdf = np.exp(x * x * -0.5) * _INV_SQRT_2PI
    return as_array(np.multiply(g, cdf + x * pdf))


@gelu_backward.defvjp
def _(ctx, gg):
    # torch's gelu_double_backward. For "none", d/dx (cdf + x pdf) = pdf (2 - x^2); for
    # "tanh", with t = tanh(k (x + c x^3)), inner' = k (1 + 3 c x^2):
    # (1 - t^2) (inner' - x t inner'^2 + 3 c k x^2).
    g, x = ctx.saved
    approximate = ctx.params.get("approximate", "none")
    d_g = (_unbroadcast(ctx, 0, ops.gelu_backward(gg, x, approximate=approximate))
           if ctx.needs[0] else None)
    if not ctx.needs[1]:
        return d_g, None
    x2 = ops.mul(x, x)
    if approximate == "tanh":
        t = ops.tanh(ops.mul(ops.add(x, ops.mul(ops.mul(x2, x), 0.044715)), _SQRT_2_OVER_PI))
        inner_d = ops.mul(ops.add(ops.mul(x2, 3 * 0.044715), 1.0), _SQRT_2_OVER_PI)
        curve = ops.add(ops.sub(inner_d, ops.mul(ops.mul(x, t), ops.mul(inner_d, inner_d))),
                        ops.mul(x2, 3 * 0.044715 * _SQRT_2_OVER_PI))
        second = ops.mul(ops.sub(1.0, ops.mul(t, t)), curve)
    else:
        pdf = ops.mul(ops.exp(ops.mul(x2, -0.5)), _INV_SQRT_2PI)
        second = ops.mul(pdf, ops.sub(2.0, x2))
    return d_g, _unbroadcast(ctx, 1, ops.mul(ops.mul(gg, g), second))


# ---------------------------------------------------------------- binary


def _unbroadcast(ctx, i, g):
    """The gradient for input i: None if it needs none, reduced to its shape."""
    if not ctx.needs[i]:
        return None
    return sum_to(g, ctx.shapes[i])


@prim("add", ufunc=np.add, meta=elementwise_meta,
      c=Elementwise("{{ a }} + {{ b }}", adds=True))
def add(a, b):
    return as_array(np.add(a, b))


@add.defvjp
def _(ctx, g):
    return _unbroadcast(ctx, 0, g), _unbroadcast(ctx, 1, g)


@prim("sub", ufunc=np.subtract, meta=elementwise_meta,
      c=Elementwise("{{ a }} - {{ b }}"))
def sub(a, b):
    return as_array(np.subtract(a, b))


@sub.defvjp
def _(ctx, g):
    return _unbroadcast(ctx, 0, g), (_unbroadcast(ctx, 1, ops.neg(g)) if ctx.needs[1] else None)


@prim("mul", ufunc=np.multiply, meta=elementwise_meta, save=((1, 0), (0, 1)),
      c=Elementwise("{{ a }} * {{ b }}"))
def mul(a, b):
    return as_array(np.multiply(a, b))


@mul.defvjp
def _(ctx, g):
    b, a = ctx.saved
    return (_unbroadcast(ctx, 0, ops.mul(g, b)) if ctx.needs[0] else None,
            _unbroadcast(ctx, 1, ops.mul(g, a)) if ctx.needs[1] else None)


@prim("div", ufunc=np.true_divide, meta=elementwise_meta, save=(1, (0, 1)),
      c=Elementwise("{{ a }} / {{ b }}"))
def div(a, b):
    return as_array(np.true_divide(a, b))


@div.defvjp
def _(ctx, g):
    b, a = ctx.saved
    ga = gb = None
    if ctx.needs[0]:
        ga = _unbroadcast(ctx, 0, ops.div(g, b))
    if ctx.needs[1]:
        gb = _unbroadcast(ctx, 1, ops.neg(ops.div(ops.mul(g, a), ops.mul(b, b))))
    return ga, gb


@prim("pow", meta=elementwise_meta, save=(0, 1, ("out", 1)),
      c=Elementwise("pow({{ a }}, {{ b }})"))
def pow_(a, b):
    return as_array(np.power(a, b))


@pow_.defvjp
def _(ctx, g):
    a, b, out = ctx.saved
    ga = gb = None
    if ctx.needs[0]:
        if is_scalar(b):
            # Python arithmetic keeps the exponent a weak scalar (no float64 upcast).
            ga = (ops.full_like(g, value=0.0) if b == 0
                  else ops.mul(ops.mul(g, b), ops.pow(a, b - 1)))
        else:
            # torch: the gradient is 0 where the exponent is 0 (even at a == 0).
            ga = ops.where(ops.eq(b, 0.0), 0.0,
                           ops.mul(ops.mul(g, b), ops.pow(a, ops.sub(b, 1.0))))
        ga = _unbroadcast(ctx, 0, ga)
    if ctx.needs[1]:
        # torch: 0 where a == 0 and b >= 0, instead of 0 * log(0) = nan.
        mask = ops.mul(ops.eq(a, 0.0), ops.ge(b, 0.0))
        safe_a = ops.where(mask, 1.0, a)
        gb = _unbroadcast(ctx, 1, ops.where(mask, 0.0, ops.mul(ops.mul(g, out), ops.log(safe_a))))
    return ga, gb


def _minmax_vjp(ctx, g, a_wins):
    # torch: ties split the gradient in half; otherwise it goes to the winner.
    a, b = ctx.saved
    tie = ops.eq(a, b)
    half = ops.mul(g, 0.5)
    ga = _unbroadcast(ctx, 0, ops.where(a_wins, g, ops.where(tie, half, 0.0))) \
        if ctx.needs[0] else None
    gb = _unbroadcast(ctx, 1, ops.where(a_wins, 0.0, ops.where(tie, half, g))) \
        if ctx.needs[1] else None
    return ga, gb


@prim("maximum", ufunc=np.maximum, meta=elementwise_meta, save=(0, 1),
      c=Elementwise("ca_maximum_{{ sfx }}({{ a }}, {{ b }})"))
def maximum(a, b):
    return as_array(np.maximum(a, b))


@maximum.defvjp
def _(ctx, g):
    a, b = ctx.saved
    return _minmax_vjp(ctx, g, ops.gt(a, b))


@prim("minimum", meta=elementwise_meta, save=(0, 1),
      c=Elementwise("ca_minimum_{{ sfx }}({{ a }}, {{ b }})"))
def minimum(a, b):
    return as_array(np.minimum(a, b))


@minimum.defvjp
def _(ctx, g):
    a, b = ctx.saved
    return _minmax_vjp(ctx, g, ops.gt(b, a))


@prim("clamp", meta=same_meta, save=(0,),
      c=Elementwise("{% if min is not none and max is not none %}ca_minimum_{{ sfx }}(ca_maximum_{{ sfx }}({{ a }}, {{ min }}), {{ max }}){% elif min is not none %}ca_maximum_{{ sfx }}({{ a }}, {{ min }}){% elif max is not none %}ca_minimum_{{ sfx }}({{ a }}, {{ max }}){% else %}{{ a }}{% endif %}"))
def clamp(x, min=None, max=None):
    return as_array(np.clip(x, min, max))


@clamp.defvjp
def _(ctx, g):
    # torch's clamp_backward: the gradient passes where min <= x <= max.
    (x,) = ctx.saved
    lo, hi = ctx.params.get("min"), ctx.params.get("max")
    if lo is not None:
        g = ops.where(ops.ge(x, lo), g, 0.0)
    if hi is not None:
        g = ops.where(ops.ge(hi, x), g, 0.0)
    return (g,)


# ---------------------------------------------------------------- comparisons, where


@prim("gt", meta=compare_meta, differentiable=False,
      c=Elementwise("{{ a }} > {{ b }}", compute="inputs"))
def gt(a, b):
    return as_array(np.greater(a, b))


@prim("ge", meta=compare_meta, differentiable=False,
      c=Elementwise("{{ a }} >= {{ b }}", compute="inputs"))
def ge(a, b):
    return as_array(np.greater_equal(a, b))


@prim("eq", meta=compare_meta, differentiable=False,
      c=Elementwise("{{ a }} == {{ b }}", compute="inputs"))
def eq(a, b):
    return as_array(np.equal(a, b))


def _where_meta(cond, a, b, **_):
    return (broadcast_shapes(shape_of(cond), shape_of(a), shape_of(b)),
            np.result_type(dtype_of(a), dtype_of(b)))


@prim("where", meta=_where_meta, save=(0,),
      c=Elementwise("ca_select_{{ sfx }}({{ a }}, {{ b }}, {{ c }})", uncast=(0,)))
def where(cond, a, b):
    return as_array(np.where(cond, a, b))


@where.defvjp
def _(ctx, g):
    (cond,) = ctx.saved
    ga = _unbroadcast(ctx, 1, ops.where(cond, g, 0.0)) if ctx.needs[1] else None
    gb = _unbroadcast(ctx, 2, ops.where(cond, 0.0, g)) if ctx.needs[2] else None
    return None, ga, gb


# ---------------------------------------------------------------- casts and constants


@prim("astype", meta=lambda x, dtype: (tuple(x.shape), np.dtype(dtype)),
      c=Elementwise('{% if T == "uint8_t" %}{{ a }} != 0{% else %}{{ a }}{% endif %}',
                    uncast=(0,)))
def astype(x, dtype):
    return np.asarray(x).astype(dtype, order="C", copy=True)


@astype.defvjp
def _(ctx, g):
    return (ops.astype(g, dtype=ctx.dtypes[0]),)


@prim("copy", meta=same_meta,
      c=Elementwise("{{ a }}"))
def copy(x):
    """A fresh C-contiguous copy (clone, contiguous)."""
    return np.array(x, order="C", copy=True)


@copy.defvjp
def _(ctx, g):
    return (g,)


def _full_like_meta(x, value, shape=None, dtype=None):
    return (tuple(x.shape) if shape is None else tuple(shape),
            x.dtype if dtype is None else np.dtype(dtype))


@prim("full_like", meta=_full_like_meta, differentiable=False,
      c=Elementwise("{{ value }}", reads_inputs=False))
def full_like(x, value, shape=None, dtype=None):
    """A new array filled with ``value``; x gives the default shape and dtype."""
    return np.full(x.shape if shape is None else shape, value,
                   dtype=x.dtype if dtype is None else dtype)


@prim("masked_fill", meta=lambda x, mask, value: (
    broadcast_shapes(shape_of(x), shape_of(mask), shape_of(value)), x.dtype),
    save=(1,),
      c=Elementwise("ca_select_{{ sfx }}({{ b }}, {{ c }}, {{ a }})", uncast=(1,)))
def masked_fill(x, mask, value):
    """``value`` where ``mask``, else ``x`` (in x's dtype). With mask=True it is
    fill_/copy_: the in-place forms get a zero gradient for the overwritten value."""
    return np.where(mask, value, x).astype(np.result_type(x), copy=False)


@masked_fill.defvjp
def _(ctx, g):
    (mask,) = ctx.saved
    gx = _unbroadcast(ctx, 0, ops.where(mask, 0.0, g)) if ctx.needs[0] else None
    gv = _unbroadcast(ctx, 2, ops.where(mask, g, 0.0)) if ctx.needs[2] else None
    return gx, None, gv
