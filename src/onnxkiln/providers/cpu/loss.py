"""CPU kernels: loss functions (SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss)."""

from __future__ import annotations

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import kernel

_REDUCTIONS = ("none", "sum", "mean")


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


def _reduction(info: NodeInfo) -> str:
    reduction = info.attrs.get("reduction") or "mean"
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


def _nll(logp: np.ndarray, labels, weights, ignore_index, reduction: str, out_dtype):
    """Weighted negative log-likelihood of `labels` under log-probabilities (N, C, d1...)."""
    if logp.ndim < 2:
        raise ValueError(f"input must have shape (N, C, d1, ...), got {logp.shape}")
    n_classes = logp.shape[1]
    expected = (logp.shape[0], *logp.shape[2:])
    if labels.shape != expected:
        raise ValueError(f"target must have shape {expected}, got {labels.shape}")
    labels = labels.astype(np.int64, copy=False)
    valid = None
    if ignore_index is not None:
        valid = labels != ignore_index
        labels = np.where(valid, labels, 0)
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        bad = labels[(labels < 0) | (labels >= n_classes)].flat[0]
        raise IndexError(f"target value {bad} is out of range [0, {n_classes})")
    picked = np.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
    loss = np.negative(picked)
    w = None
    if weights is not None:
        if weights.shape != (n_classes,):
            raise ValueError(f"weight must have shape ({n_classes},), got {weights.shape}")
        w = weights.astype(logp.dtype, copy=False)[labels]
        if valid is not None:
            w *= valid
    elif valid is not None:
        w = valid.astype(logp.dtype)
    if w is not None:
        loss *= w
    if reduction == "none":
        return loss.astype(out_dtype, copy=False)
    total = loss.sum(dtype=logp.dtype)
    if reduction == "mean":
        denom = w.sum(dtype=logp.dtype) if w is not None else logp.dtype.type(loss.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            total = total / denom
    return np.asarray(total, dtype=out_dtype)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """log(softmax(x)) over axis 1, computed stably into a fresh array."""
    out = x - np.max(x, axis=1, keepdims=True)
    out -= np.log(np.sum(np.exp(out), axis=1, keepdims=True))
    return out


@kernel("SoftmaxCrossEntropyLoss", since=12, factory=True, multi_output=True,
        variant="sce.numpy")
def softmax_cross_entropy_loss(info: NodeInfo):
    """Cross entropy of softmax(scores) along axis 1 with integer targets; also log_prob."""
    reduction = _reduction(info)
    ignore_index = info.attrs.get("ignore_index")

    def run(scores, labels, weights=None):
        dtype = _compute_dtype(scores.dtype)
        logp = _log_softmax(scores.astype(dtype, copy=False))
        loss = _nll(logp, labels, weights, ignore_index, reduction, scores.dtype)
        return loss, logp.astype(scores.dtype, copy=False)

    return run


@kernel("NegativeLogLikelihoodLoss", since=12, factory=True, variant="nllloss.numpy")
def negative_log_likelihood_loss(info: NodeInfo):
    """-input[n, target[n, d...], d...] * weight[target], reduced none/sum/mean."""
    reduction = _reduction(info)
    ignore_index = info.attrs.get("ignore_index")

    def run(x, target, weight=None):
        dtype = _compute_dtype(x.dtype)
        return _nll(x.astype(dtype, copy=False), target, weight, ignore_index, reduction,
                    x.dtype)

    return run
