"""CPU kernels: RandomNormal, RandomUniform, their *Like forms, Multinomial, Bernoulli.

Each node owns one random stream, created when the plan is built and advanced by every
run: with a `seed` attribute the sequence of outputs is the same in every session, without
one every session (and every run) draws fresh values, unless `set_default_seed`
(onnxruntime's set_seed) fixed the seeds of the streams created after it. The streams are
onnxkiln.ops.random's: numpy's legacy MT19937 `RandomState(seed)`, the generator onnx's own
test data and reference implementation seed (`np.random.seed(seed)`), so seeded draws follow
onnx's sequence for the same seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from onnxkiln.dtypes import DataType, to_numpy
from onnxkiln.ops.random import seeded_state
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import kernel

__all__ = [
    "bernoulli",
    "multinomial",
    "random_normal",
    "random_normal_like",
    "random_uniform",
    "random_uniform_like",
]

_F64 = np.dtype(np.float64)
_FLOATS = frozenset(
    np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)
)


def _out_dtype(info: NodeInfo, op: str) -> np.dtype | None:
    """The `dtype` attribute as a float numpy dtype; None when absent (then: the input's)."""
    code = info.attrs.get("dtype")
    if code is None:
        return None
    try:
        dt = to_numpy(DataType(int(code)))
    except (KeyError, ValueError):
        raise ValueError(f"{op}: dtype {code} is not a supported element type") from None
    if dt not in _FLOATS:
        raise ValueError(f"{op}: dtype must be a float type, got {DataType(int(code))}")
    return dt


def _like_dtype(fixed: np.dtype | None, x: np.ndarray, op: str) -> np.dtype:
    if fixed is not None:
        return fixed
    if x.dtype not in _FLOATS:
        raise ValueError(f"{op}: input is {x.dtype}; set the dtype attribute to a float type")
    return x.dtype


def _normal(state: np.random.RandomState, shape, mean: float, scale: float, dt: np.dtype):
    v = state.standard_normal(shape)
    v *= scale
    v += mean
    return v.astype(dt)


def _uniform(state: np.random.RandomState, shape, low: float, high: float, dt: np.dtype):
    v = state.random_sample(shape)
    v *= high - low
    v += low
    return v.astype(dt)


def _shape_attr(info: NodeInfo, op: str) -> tuple[int, ...]:
    shape = tuple(int(d) for d in info.attrs["shape"])
    if any(d < 0 for d in shape):
        raise ValueError(f"{op}: shape {list(shape)} has a negative dimension")
    return shape


@kernel("RandomNormal", since=1, factory=True)
def random_normal(info: NodeInfo) -> Callable[[], np.ndarray]:
    """Samples of N(mean, scale^2) with the `shape` and `dtype` attributes."""
    shape = _shape_attr(info, "RandomNormal")
    dt = _out_dtype(info, "RandomNormal") or np.dtype(np.float32)
    mean, scale = float(info.attrs["mean"]), float(info.attrs["scale"])
    state = seeded_state(info.attrs.get("seed"))
    return lambda: _normal(state, shape, mean, scale, dt)


@kernel("RandomUniform", since=1, factory=True)
def random_uniform(info: NodeInfo) -> Callable[[], np.ndarray]:
    """Samples of U(low, high) with the `shape` and `dtype` attributes."""
    shape = _shape_attr(info, "RandomUniform")
    dt = _out_dtype(info, "RandomUniform") or np.dtype(np.float32)
    low, high = float(info.attrs["low"]), float(info.attrs["high"])
    state = seeded_state(info.attrs.get("seed"))
    return lambda: _uniform(state, shape, low, high, dt)


@kernel("RandomNormalLike", since=1, factory=True)
def random_normal_like(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """N(mean, scale^2) samples shaped like the input; dtype attribute or the input's type."""
    op = "RandomNormalLike"
    fixed = _out_dtype(info, op)
    mean, scale = float(info.attrs["mean"]), float(info.attrs["scale"])
    state = seeded_state(info.attrs.get("seed"))
    return lambda x: _normal(state, x.shape, mean, scale, _like_dtype(fixed, x, op))


@kernel("RandomUniformLike", since=1, factory=True)
def random_uniform_like(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """U(low, high) samples shaped like the input; dtype attribute or the input's type."""
    op = "RandomUniformLike"
    fixed = _out_dtype(info, op)
    low, high = float(info.attrs["low"]), float(info.attrs["high"])
    state = seeded_state(info.attrs.get("seed"))
    return lambda x: _uniform(state, x.shape, low, high, _like_dtype(fixed, x, op))


@kernel("Multinomial", since=7, factory=True)
def multinomial(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """`sample_size` class indices per row of (batch, classes) unnormalized log-probabilities."""
    op = "Multinomial"
    code = int(info.attrs["dtype"])
    if code not in (DataType.INT32, DataType.INT64):
        raise ValueError(f"{op}: dtype must be int32 or int64, got {DataType(code)}")
    out_dt = to_numpy(DataType(code))
    n = int(info.attrs["sample_size"])
    if n < 0:
        raise ValueError(f"{op}: sample_size must be >= 0, got {n}")
    state = seeded_state(info.attrs.get("seed"))

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim != 2:
            raise ValueError(f"{op}: input must be (batch_size, class_size), got shape {x.shape}")
        batch, classes = x.shape
        u = state.random_sample((batch, n))
        if classes == 0:
            if batch and n:
                raise ValueError(f"{op}: cannot sample from 0 classes")
            return np.zeros((batch, n), out_dt)
        logits = x.astype(_F64)
        logits -= logits.max(axis=1, keepdims=True)
        cdf = np.cumsum(np.exp(logits), axis=1)
        cdf /= cdf[:, -1:]
        out = np.empty((batch, n), out_dt)
        for r in range(batch):  # first class whose cumulative probability exceeds u
            out[r] = np.searchsorted(cdf[r], u[r], side="right")
        np.minimum(out, classes - 1, out=out)
        return out

    return run


@kernel("Bernoulli", since=15, factory=True)
def bernoulli(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """1 with probability p (the input), else 0: u < p for u ~ U[0, 1); dtype attr or p's."""
    code = info.attrs.get("dtype")
    fixed: Any = None
    if code is not None:
        try:
            fixed = to_numpy(DataType(int(code)))
        except (KeyError, ValueError):
            raise ValueError(f"Bernoulli: dtype {code} is not a supported element type") from None
    state = seeded_state(info.attrs.get("seed"))

    def run(x: np.ndarray) -> np.ndarray:
        u = state.random_sample(x.shape)
        hit = np.less(u, x.astype(_F64) if x.dtype != _F64 else x)
        dt = fixed if fixed is not None else x.dtype
        return hit if dt.kind == "b" else hit.astype(dt)

    return run
