"""Gradient clipping, in place on ``.grad``, as torch.nn.utils.clip_grad.

The norms are accumulated in float64 and returned as a 0-d tensor of the gradients'
dtype; the scaling multiplies each gradient in place (no new array per gradient).
"""
from __future__ import annotations

import math

import numpy as np

from compiled_autograd.autograd.tensor import Tensor


def _tensors(tensors):
    if isinstance(tensors, Tensor):
        return [tensors]
    return list(tensors)


def _grads(parameters):
    return [p.grad for p in _tensors(parameters) if p.grad is not None]


def _vector_norm(a: np.ndarray, norm_type: float) -> float:
    a = a.reshape(-1)
    if norm_type == math.inf:
        return float(np.abs(a).max()) if a.size else 0.0
    if norm_type == -math.inf:
        return float(np.abs(a).min()) if a.size else math.inf
    if norm_type == 0:
        return float(np.count_nonzero(a))
    if norm_type == 2:
        a64 = a.astype(np.float64) if a.dtype != np.float64 else a
        return math.sqrt(float(np.dot(a64, a64)))
    if norm_type == 1:
        return float(np.abs(a).sum(dtype=np.float64))
    return float((np.abs(a.astype(np.float64)) ** norm_type).sum() ** (1.0 / norm_type))


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The ``norm_type`` norm of the norms of ``tensors`` (a 0-d tensor)."""
    tensors = [t for t in _tensors(tensors) if t is not None]
    norm_type = float(norm_type)
    if not tensors:
        return Tensor._make(np.array(0.0, dtype=np.float32))
    dtype = tensors[0].dtype
    norms = np.array([_vector_norm(t._data, norm_type) for t in tensors], dtype=dtype)
    total = np.array(_vector_norm(norms, norm_type), dtype=dtype)
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                           "`parameters` is non-finite, so it cannot be clipped. To disable "
                           "this error and scale the gradients by the non-finite norm anyway, "
                           "set `error_if_nonfinite=False`")
    return Tensor._make(total)


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale every gradient by ``min(1, max_norm / (total_norm + 1e-6))``, in place."""
    grads = _grads(parameters)
    if not grads:
        return
    total = total_norm._data if isinstance(total_norm, Tensor) else np.asarray(total_norm)
    coef = np.minimum(np.asarray(max_norm, dtype=total.dtype) / (total + total.dtype.type(1e-6)),
                      total.dtype.type(1.0))
    with np.errstate(invalid="ignore"):   # (a non-finite norm scales to nan, as torch)
        for g in grads:
            g._data *= coef.astype(g.dtype)
            g._version_counter.bump()


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scale the gradients so that their total ``norm_type`` norm is at most
    ``max_norm``; returns the total norm before clipping (torch's)."""
    grads = _grads(parameters)
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, float(max_norm), total, foreach)
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient to ``[-clip_value, clip_value]``, in place."""
    clip_value = float(clip_value)
    for g in _grads(parameters):
        np.clip(g._data, -clip_value, clip_value, out=g._data)
        g._version_counter.bump()
