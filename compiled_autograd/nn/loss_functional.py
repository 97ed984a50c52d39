"""The losses of ca.nn.functional, composed from prims (torch's formulas and checks).

No loss has a derivative of its own: each is a short composition of differentiable
ops, so eager autograd, the tracer and both code generators run the prims' rules.
Targets' masks (ignored indices, the picked class) are constants of the graph.
"""
from __future__ import annotations

import warnings

import numpy as np

from compiled_autograd.autograd.factory import where
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.runtime.prims import ops

_REDUCTIONS = ("mean", "sum", "none")


def legacy_reduction(size_average, reduce, reduction):
    """torch's ``size_average``/``reduce`` (deprecated) as a ``reduction``."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    out = "none" if not reduce else ("mean" if size_average else "sum")
    warnings.warn(f"size_average and reduce args will be deprecated, please use "
                  f"reduction='{out}' instead.", UserWarning, stacklevel=3)
    return out


def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _check_reduction(reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")


def _as_tensor(x, like):
    if isinstance(x, Tensor):
        return x
    return Tensor._make(np.asarray(x, dtype=like.dtype))


def _pointwise_target(input, target):
    """torch's warning when a pointwise loss's target broadcasts."""
    target = _as_tensor(target, input)
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(f"Using a target size ({tuple(target.shape)}) that is different to the "
                      f"input size ({tuple(input.shape)}). This will likely lead to incorrect "
                      "results due to broadcasting. Please ensure they have the same size.",
                      UserWarning, stacklevel=3)
    return target


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """``(input - target) ** 2``, reduced."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    diff = input - _pointwise_target(input, target)
    loss = diff * diff
    return _reduce(loss if weight is None else loss * weight, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """``|input - target|``, reduced."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    loss = (input - _pointwise_target(input, target)).abs()
    return _reduce(loss if weight is None else loss * weight, reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean",
                   beta=1.0):
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta``."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    diff = input - _pointwise_target(input, target)
    z = diff.abs()
    if beta == 0:
        return _reduce(z, reduction)
    inside = Tensor._make(z._data < beta)
    return _reduce(where(inside, diff * diff * (0.5 / beta), z - 0.5 * beta), reduction)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``."""
    _check_reduction(reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    diff = input - _pointwise_target(input, target)
    z = diff.abs()
    inside = Tensor._make(z._data < delta)
    loss = where(inside, diff * diff * 0.5, (z - 0.5 * delta) * delta)
    return _reduce(loss if weight is None else loss * weight, reduction)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """``-w (t log(x) + (1 - t) log(1 - x))``, each log clamped at -100 (torch)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    target = _as_tensor(target, input)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size ({tuple(target.shape)}) that is different to "
                         f"the input size ({tuple(input.shape)}) is deprecated. Please ensure "
                         "they have the same size.")
    x = input._data
    if x.size and not ((x >= 0) & (x <= 1)).all():
        raise RuntimeError("all elements of input should be between 0 and 1")
    with np.errstate(divide="ignore"):
        log_x = input.log().clamp(min=-100.0)
        log_1mx = (1.0 - input).log().clamp(min=-100.0)
    loss = -(target * log_x + (1.0 - target) * log_1mx)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def _abs_at_zero_one(x):
    """``|x|`` whose derivative at 0 is +1 (``where``), so that log-sigmoid's
    derivative at 0 is 1/2, as torch's."""
    return where(Tensor._make(x._data >= 0), x, -x)


def logsigmoid(input):
    """``log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|))``, stable for every x."""
    negative = Tensor._make(input._data < 0)
    return where(negative, input, 0.0) - (-_abs_at_zero_one(input)).exp().log1p()


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None,
                                     reduce=None, reduction="mean", pos_weight=None):
    """``(1 - t) x - lw log(sigmoid(x))``, ``lw = (pos_weight - 1) t + 1`` (torch)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    target = _as_tensor(target, input)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Target size ({tuple(target.shape)}) must be the same as input size "
                         f"({tuple(input.shape)})")
    log_sig = logsigmoid(input)
    if pos_weight is not None:
        log_sig = log_sig * ((pos_weight - 1.0) * target + 1.0)
    loss = (1.0 - target) * input - log_sig
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


# ---------------------------------------------------------------- class targets


def _class_target(input, target, class_dim):
    if not isinstance(target, Tensor):
        target = Tensor._make(np.asarray(target, dtype=np.int64))
    if target.dtype.kind not in "iu":
        raise RuntimeError(f"expected scalar type Long but found {target.dtype.name}")
    if input.ndim < 1:
        raise ValueError(f"Expected 1 or more dimensions (got {input.ndim})")
    expected = tuple(input.shape[:class_dim]) + tuple(input.shape[class_dim + 1:])
    if input.ndim >= 2 and target.ndim >= 1 and target.shape[0] != input.shape[0]:
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target "
                         f"batch_size ({target.shape[0]}).")
    if tuple(target.shape) != expected:
        raise RuntimeError(f"Expected target size {list(expected)}, got "
                           f"{list(target.shape)}")
    return target


def _class_weight(weight, n_classes):
    if weight is None:
        return None
    w = weight._data if isinstance(weight, Tensor) else np.asarray(weight)
    if w.ndim != 1 or w.shape[0] != n_classes:
        raise RuntimeError(f"weight tensor should be defined either for all {n_classes} "
                           f"classes or no classes but got weight tensor of shape: "
                           f"{list(w.shape)}")
    return w


def _nll(logp, target, weight, ignore_index, reduction, class_dim):
    """The negative log-likelihood of ``logp`` at the integer ``target``; returns the
    loss and the per-element weights of the targets (for the smoothing term)."""
    n_classes = logp.shape[class_dim]
    tgt = target._data
    valid = tgt != ignore_index
    safe = np.where(valid, tgt, 0)
    bad = safe[(safe < 0) | (safe >= n_classes)]
    if bad.size:
        raise IndexError(f"Target {int(bad[0])} is out of bounds.")
    idx = Tensor._make(np.expand_dims(safe, class_dim).astype(np.int64))
    picked = ops.gather(logp, idx, dim=class_dim).squeeze(class_dim)
    loss = -picked
    if weight is None and valid.all():
        return _reduce(loss, reduction), None
    w = valid.astype(logp.dtype)
    if weight is not None:
        w = w * weight[safe].astype(logp.dtype)
    loss = loss * Tensor._make(w)
    if reduction == "mean":  # nan when every target is ignored, as torch
        total = float(w.sum())
        return (loss.sum() / total if total else loss.sum() * float("nan")), w
    return _reduce(loss, reduction), w


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """``-w[t] input[t]`` over the class dim (1, or 0 for an unbatched input); the mean
    divides by the sum of the targets' weights."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    class_dim = 1 if input.ndim > 1 else 0
    target = _class_target(input, target, class_dim)
    w = _class_weight(weight, input.shape[class_dim])
    return _nll(input, target, w, ignore_index, reduction, class_dim)[0]


def _class_view(weight, ndim, class_dim):
    shape = [1] * ndim
    shape[class_dim] = -1
    w = weight if isinstance(weight, Tensor) else Tensor._make(np.asarray(weight))
    return w.reshape(*shape)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                  reduce=None, reduction="mean", label_smoothing=0.0):
    """Log-softmax over the class dim and the negative log-likelihood of integer
    targets, or of class probabilities (a float target of the input's shape);
    ``label_smoothing`` mixes in the uniform distribution, as torch."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: "
                           f"{label_smoothing}")
    class_dim = 1 if input.ndim > 1 else 0
    n_classes = input.shape[class_dim]
    logp = input.log_softmax(class_dim)
    if isinstance(target, Tensor) and tuple(target.shape) == tuple(input.shape):
        return _cross_entropy_probs(logp, target, weight, ignore_index, reduction,
                                    label_smoothing, class_dim)
    target = _class_target(input, target, class_dim)
    w = _class_weight(weight, n_classes)
    nll, w_t = _nll(logp, target, w, ignore_index, reduction, class_dim)
    if label_smoothing == 0.0:
        return nll
    if weight is not None:
        smooth = -(logp * _class_view(weight, logp.ndim, class_dim)).sum(class_dim)
    else:
        smooth = -logp.sum(class_dim)
    valid = target._data != ignore_index
    if not valid.all():
        smooth = smooth * Tensor._make(valid.astype(logp.dtype))
    if reduction == "mean":
        total = float(w_t.sum()) if w_t is not None else float(valid.sum())
        smooth = smooth.sum() / total if total else smooth.sum() * float("nan")
    elif reduction == "sum":
        smooth = smooth.sum()
    return nll * (1.0 - label_smoothing) + smooth * (label_smoothing / n_classes)


def _cross_entropy_probs(logp, target, weight, ignore_index, reduction, label_smoothing,
                         class_dim):
    if target.dtype.kind != "f":
        raise RuntimeError(f"Expected floating point type for target with class "
                           f"probabilities, got {target.dtype.name}")
    if ignore_index >= 0:
        raise RuntimeError("ignore_index is not supported for floating point target")
    n_classes = logp.shape[class_dim]
    if label_smoothing > 0.0:
        target = target * (1.0 - label_smoothing) + label_smoothing / n_classes
    if weight is not None:
        _class_weight(weight, n_classes)
        logp = logp * _class_view(weight, logp.ndim, class_dim)
    loss = logp * target
    if reduction == "mean":
        return -loss.sum() / float(logp.numel() // n_classes)
    if reduction == "sum":
        return -loss.sum()
    return -loss.sum(class_dim)
