"""CPU kernels: LpNormalization, MeanVarianceNormalization, LRN and Dropout."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.ops.random import seeded_state
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.norm import _F64, _MVN_EPSILON, _axis, _compute_dtype, _wants, _work
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []


# ---------------------------------------------------------------------------------------------
# LpNormalization, MeanVarianceNormalization, LRN, Dropout


@kernel("LpNormalization", since=1, factory=True)
def lp_normalization(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """x / ||x||_p along `axis` (p = 1 or 2); where the norm is zero the output is zero."""
    p = int(info.attrs["p"])
    axis = int(info.attrs["axis"])
    if p not in (1, 2):
        raise ValueError(f"LpNormalization: p must be 1 or 2, got {p}")

    def run(x: np.ndarray) -> np.ndarray:
        ax = _axis(axis, x.ndim, "LpNormalization")
        xc, _ = _work(x)
        if p == 1:
            norm = np.add.reduce(np.abs(xc), axis=ax, keepdims=True)
        else:
            norm = np.sqrt(np.add.reduce(np.square(xc), axis=ax, keepdims=True))
        y = np.zeros(xc.shape, xc.dtype)
        np.divide(xc, norm, out=y, where=norm != 0)
        return y.astype(x.dtype, copy=False)

    return run


@kernel("MeanVarianceNormalization", since=9, factory=True)
def mean_variance_normalization(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """(X - E[X]) / (sqrt(E[(X - E[X])^2]) + 1e-9) over `axes`."""
    axes_attr = tuple(int(a) for a in info.attrs["axes"])

    def run(x: np.ndarray) -> np.ndarray:
        axes = tuple(_axis(a, x.ndim, "MeanVarianceNormalization") for a in axes_attr)
        xc, owned = _work(x)
        mean = np.mean(xc, axis=axes, keepdims=True)
        d = np.subtract(xc, mean, out=xc if owned else None)
        std = np.sqrt(np.mean(np.square(d), axis=axes, keepdims=True))
        std += _MVN_EPSILON
        d /= std
        return d.astype(x.dtype, copy=False)

    return run


@kernel("LRN", since=1, factory=True)
def lrn(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """X / (bias + alpha / size * sum of X^2 over a window of `size` channels) ^ beta."""
    size = int(info.attrs["size"])
    alpha, beta, bias = (float(info.attrs[k]) for k in ("alpha", "beta", "bias"))
    if size < 1:
        raise ValueError(f"LRN: size must be >= 1, got {size}")
    lo = (size - 1) // 2

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim < 2:
            raise ValueError(f"LRN: input must be (N, C, ...), got shape {x.shape}")
        xc, _ = _work(x)
        c = x.shape[1]
        sq = np.square(xc)
        acc = np.zeros_like(sq)
        # Window [c - lo, c + size - 1 - lo], clipped at the channel edges.
        for off in range(-lo, size - lo):
            lo_dst, hi_dst = max(0, -off), min(c, c - off)
            if lo_dst < hi_dst:
                acc[:, lo_dst:hi_dst] += sq[:, lo_dst + off : hi_dst + off]
        acc *= xc.dtype.type(alpha / size)
        acc += xc.dtype.type(bias)
        np.power(acc, xc.dtype.type(-beta), out=acc)
        acc *= xc
        return acc.astype(x.dtype, copy=False)

    return run


def _dropout_train(x: np.ndarray, ratio: float, state, mask_dtype, want_mask: bool) -> tuple:
    """Training dropout: keep where u >= ratio (u ~ U[0, 1) from `state`), scale by 1/(1-ratio).

    The mask is drawn as `state.random_sample(x.shape) >= ratio`, the stream and comparison
    of onnx's reference, so a seeded node reproduces onnx's expected outputs.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"Dropout: ratio must be in [0, 1], got {ratio}")
    keep = state.random_sample(x.shape) >= ratio
    cdt = _compute_dtype(x.dtype)
    xc = x if x.dtype == cdt else x.astype(cdt)
    y = np.zeros(x.shape, cdt)
    if ratio < 1.0:
        np.multiply(xc, cdt.type(1) / (cdt.type(1) - cdt.type(ratio)), out=y, where=keep)
    y = y if y.dtype == x.dtype else y.astype(x.dtype)
    return (y, keep.astype(mask_dtype, copy=False) if want_mask else None)


def _dropout_outputs(info: NodeInfo, x: np.ndarray, mask_dtype) -> tuple:
    mask = np.ones(x.shape, mask_dtype) if _wants(info, 1) else None
    return (x, mask)


def _dropout_state(info: NodeInfo):
    return seeded_state(info.attrs.get("seed"))


@kernel("Dropout", since=1, until=6, factory=True, multi_output=True, view=True)
def dropout_v1(info: NodeInfo) -> Callable[[np.ndarray], tuple]:
    """is_test != 0: identity (the input itself), mask of ones (type T). is_test == 0 (the
    schema default) trains: random dropout scaled by 1/(1-ratio), mask of 0/1 in type T."""
    ratio = float(info.attrs["ratio"])
    if not info.attrs.get("is_test"):
        state = _dropout_state(info)
        return lambda x: _dropout_train(x, ratio, state, x.dtype, _wants(info, 1))
    return lambda x: _dropout_outputs(info, x, x.dtype)


@kernel("Dropout", since=7, until=11, factory=True, multi_output=True, view=True)
def dropout_legacy(info: NodeInfo) -> Callable[[np.ndarray], tuple]:
    """Identity (these opsets have no training switch; the input is returned as is), mask
    all ones (type T in opsets 7-9, bool from 10)."""
    mask_dtype = np.bool_ if info.opset >= 10 else None

    def run(x: np.ndarray) -> tuple:
        return _dropout_outputs(info, x, mask_dtype or x.dtype)

    return run


@kernel("Dropout", since=12, factory=True, multi_output=True, view=True)
def dropout(info: NodeInfo) -> Callable[..., tuple]:
    """Identity with an all-True mask unless training_mode is true with a non-zero ratio
    (default 0.5): then random dropout, mask from a stream seeded by the `seed` attribute."""
    state = _dropout_state(info)
    want_mask = _wants(info, 1)

    def run(x: np.ndarray, ratio=None, training_mode=None) -> tuple:
        if training_mode is not None and bool(np.asarray(training_mode)):
            r = 0.5 if ratio is None else float(np.asarray(ratio, dtype=_F64))
            if r != 0.0:
                return _dropout_train(x, r, state, np.bool_, want_mask)
        return _dropout_outputs(info, x, np.bool_)

    return run
