"""Torch kernels: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12+).

Semantics follow the CPU provider: float16/bfloat16 compute in float32, ignore_index entries
weigh 0, and a mean over zero total weight gives NaN (0 / 0). A target outside [0, C) raises
IndexError, as on the CPU; checking that needs one host sync per call (inherent: a device
gather with a bad index would instead trap the CUDA context).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import attr_str, up
from onnxkiln.providers.cuda.dtypes import FLOATS, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
_REDUCTIONS = ("none", "sum", "mean")


def _reduction(info: NodeInfo) -> str:
    reduction = attr_str(info.attrs.get("reduction")) or "mean"
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


def _reduction_ok(info: NodeInfo) -> str | None:
    reduction = attr_str(info.attrs.get("reduction")) or "mean"
    if reduction not in _REDUCTIONS:
        return f"{info.op_type}: reduction {reduction!r} is not one of {_REDUCTIONS}"
    return None


# input 1 (the target) is an integer tensor checked by the kernel itself
_SUPPORTS = needs(FLOATS, skip_inputs=(1,), extra=_reduction_ok)


def _check_shapes(logp: Tensor, labels: Tensor, weights: Tensor | None) -> None:
    if logp.ndim < 2:
        raise ValueError(f"input must have shape (N, C, d1, ...), got {tuple(logp.shape)}")
    expected = (logp.shape[0], *logp.shape[2:])
    if tuple(labels.shape) != expected:
        raise ValueError(f"target must have shape {expected}, got {tuple(labels.shape)}")
    if weights is not None and tuple(weights.shape) != (logp.shape[1],):
        raise ValueError(
            f"weight must have shape ({logp.shape[1]},), got {tuple(weights.shape)}")


def _nll(logp: Tensor, labels: Tensor, weights: Tensor | None, ignore_index: int | None,
         reduction: str) -> Tensor:
    """Weighted negative log-likelihood of `labels` under log-probabilities (N, C, d1...),
    in logp's (compute) dtype."""
    _check_shapes(logp, labels, weights)
    n_classes = logp.shape[1]
    labels = labels.to(torch.int64)
    valid = None
    if ignore_index is not None:
        valid = labels != ignore_index
        labels = torch.where(valid, labels, torch.zeros((), dtype=torch.int64,
                                                        device=labels.device))
    if labels.numel():
        bad = (labels < 0) | (labels >= n_classes)
        if bool(bad.any()):  # the one host sync (see the module docstring)
            raise IndexError(
                f"target value {int(labels[bad][0])} is out of range [0, {n_classes})")
    loss = -torch.gather(logp, 1, labels.unsqueeze(1)).squeeze(1)
    w = None
    if weights is not None:
        w = weights.to(logp.dtype)[labels]
        if valid is not None:
            w = w * valid
    elif valid is not None:
        w = valid.to(logp.dtype)
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "mean":
        denom = w.sum() if w is not None else torch.tensor(
            float(loss.numel()), dtype=logp.dtype, device=logp.device)
        total = total / denom
    return total


def _ignore(info: NodeInfo) -> int | None:
    v = info.attrs.get("ignore_index")
    return None if v is None else int(v)


@kernel("NegativeLogLikelihoodLoss", since=12, factory=True, supports=_SUPPORTS)
def negative_log_likelihood_loss(info: NodeInfo) -> Callable[..., Tensor]:
    """-input[n, target[n, d...], d...] * weight[target], reduced none/sum/mean."""
    reduction, ignore_index = _reduction(info), _ignore(info)

    def run(x: Tensor, target: Tensor, weight: Tensor | None = None) -> Tensor:
        w = None if weight is None else up(weight)
        return _nll(up(x), target, w, ignore_index, reduction).to(x.dtype)

    return run


@kernel("SoftmaxCrossEntropyLoss", since=12, factory=True, multi_output=True,
        supports=_SUPPORTS)
def softmax_cross_entropy_loss(info: NodeInfo) -> Callable[..., tuple[Tensor, Tensor]]:
    """Cross entropy of softmax(scores) along axis 1 with integer targets; also log_prob."""
    reduction, ignore_index = _reduction(info), _ignore(info)

    def run(scores: Tensor, labels: Tensor, weights: Tensor | None = None
            ) -> tuple[Tensor, Tensor]:
        if scores.ndim < 2:
            raise ValueError(
                f"input must have shape (N, C, d1, ...), got {tuple(scores.shape)}")
        logp = torch.log_softmax(up(scores), dim=1)
        w = None if weights is None else up(weights)
        loss = _nll(logp, labels, w, ignore_index, reduction)
        return loss.to(scores.dtype), logp.to(scores.dtype)

    return run
