"""ca.nn.functional: the usual layers as functions of Tensors, built from prims."""
from __future__ import annotations

import math

import numpy as np

from compiled_autograd.autograd import random as _random
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.autograd.tensor_methods import _float
from compiled_autograd.runtime.memory import on_array
from compiled_autograd.runtime.prims import ops

# The losses (Step 13): compositions of prims, in their own module.
from compiled_autograd.nn.loss_functional import (  # noqa: F401  (ca.nn.functional.*)
    binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy, huber_loss,
    l1_loss, logsigmoid, mse_loss, nll_loss, smooth_l1_loss)


def linear(input, weight, bias=None):
    """``input @ weight.T + bias`` as one fused prim (torch's addmm)."""
    if input.ndim == 0 or weight.ndim != 2:
        out = input.matmul(weight.t())
        return out if bias is None else out + bias
    if input.shape[-1] != weight.shape[-1]:
        rows = int(np.prod(input.shape[:-1], dtype=np.int64))
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x"
                           f"{input.shape[-1]} and {weight.shape[1]}x{weight.shape[0]})")
    if input.ndim == 1:
        out = ops.linear(input.reshape(1, input.shape[0]), weight, bias)
        return out.reshape(weight.shape[0])
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != weight.shape[0]):
        return ops.linear(input, weight, None) + bias
    return ops.linear(input, weight, bias)


def relu(input, inplace=False):
    return input.relu_() if inplace else ops.relu(input)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"approximate argument must be either none or tanh.")
    return ops.gelu(_float(input), approximate=approximate)


def tanh(input):
    return input.tanh()


def sigmoid(input):
    return input.sigmoid()


def softmax(input, dim):
    return input.softmax(dim)


def log_softmax(input, dim):
    return input.log_softmax(dim)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    normalized_shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                        else tuple(normalized_shape))
    k = len(normalized_shape)
    if tuple(input.shape[input.ndim - k:]) != normalized_shape or input.ndim < k:
        raise RuntimeError(
            f"Given normalized_shape={list(normalized_shape)}, expected input with shape "
            f"[*, {', '.join(map(str, normalized_shape))}], but got input of size"
            f"{list(input.shape)}")
    x = _float(input)
    if (isinstance(weight, Tensor) and isinstance(bias, Tensor)
            and tuple(weight.shape) == normalized_shape == tuple(bias.shape)
            and weight.dtype == bias.dtype == x.dtype):
        # torch's native_layer_norm: the affine part in the same pass
        return ops.layer_norm_affine(x, weight, bias, ndim=k, eps=float(eps))
    out = ops.layer_norm(x, ndim=k, eps=float(eps))
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability ``p`` (ca's seeded RNG), scale the rest
    by 1/(1-p). The mask is a constant of the graph."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    keep = _random.generator().random(input.shape) >= p
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    mask_data = np.asarray(keep * scale, dtype=input.dtype)   # (0-d: an array too)
    on_array(mask_data, "dropout_mask")
    mask = Tensor._make(mask_data)
    return input.mul_(mask) if inplace else input * mask


def embedding(input, weight):
    """Rows of ``weight`` at the integer indices ``input``."""
    return weight[input]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None):
    """softmax(q k^T * scale + mask) v, as torch's reference implementation; with
    no mask but the causal one, the scale, the mask and the softmax are one prim
    (scaled_softmax)."""
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if (attn_mask is None and is_causal and query.ndim >= 2 and key.ndim >= 2
            and value.ndim >= 2 and query.dtype.kind == "f"
            and query.dtype == key.dtype == value.dtype):
        # The causal mask's zeros, skipped: the scores are computed by blocks of
        # their lower triangle (the rest is never read), and the weights, 0 above
        # the diagonal, multiply the values by blocks of theirs (matmul's tri).
        scores = ops.matmul(query, key.transpose(-2, -1), tri="out_lower")
        attn = ops.scaled_softmax(scores, scale=float(scale), causal=True)
        if dropout_p > 0.0:
            attn = dropout(attn, dropout_p, True)
        return ops.matmul(attn, value, tri="a_lower")
    scores = query.matmul(key.transpose(-2, -1))
    if attn_mask is None and scores.dtype.kind == "f":
        attn = ops.scaled_softmax(scores, scale=float(scale), causal=bool(is_causal))
        if dropout_p > 0.0:
            attn = dropout(attn, dropout_p, True)
        return attn.matmul(value)
    scores = scores * scale
    if is_causal:
        causal = np.tril(np.ones((L, S), dtype=bool))
        scores = scores.masked_fill(Tensor._make(~causal), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    attn = scores.softmax(-1)
    if dropout_p > 0.0:
        attn = dropout(attn, dropout_p, True)
    return attn.matmul(value)


