"""Shared pieces of the ai.onnx.ml kernels: post-transforms, class labels, attribute parsing.

The post-transforms follow onnxruntime's ml_common semantics: scores are float32; PROBIT
uses the closed-form erfinv approximation (a = 0.147) onnxruntime uses; SOFTMAX_ZERO leaves
zero scores at zero; a single score column is only transformed by PROBIT (binary
classifiers expand one score to two columns in their own modules).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxkiln.providers.cpu._tensor_util import attr_str, attr_tensor

__all__ = [
    "ML",
    "POST_TRANSFORMS",
    "as_features",
    "class_labels",
    "float_attr",
    "logistic",
    "logistic_pair",
    "post_transform",
    "probit",
    "softmax",
    "softmax_zero",
    "string_list",
    "transform_rows",
    "update_scores",
]

ML = "ai.onnx.ml"
POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_SQRT2 = np.float32(1.41421356)
_ERFINV_A = np.float32(0.147)
_ERFINV_C = np.float32(2.0) / (np.float32(3.14159) * _ERFINV_A)


def post_transform(value: Any, op: str) -> str:
    """The post_transform attribute (a name, or TreeEnsemble's enum int) as its name."""
    if value is None:
        return "NONE"
    if isinstance(value, (int, np.integer)):
        if 0 <= int(value) < len(POST_TRANSFORMS):
            return POST_TRANSFORMS[int(value)]
        raise ValueError(f"{op}: post_transform {value} is not in 0..4 ({POST_TRANSFORMS})")
    name = attr_str(value)
    if name not in POST_TRANSFORMS:
        raise ValueError(f"{op}: post_transform {name!r} is not one of {POST_TRANSFORMS}")
    return name


def string_list(value: Any) -> list[str] | None:
    """A STRINGS attribute (str or bytes items) as a list of str; None stays None."""
    if value is None:
        return None
    return [attr_str(v) for v in value]


def float_attr(attrs: Mapping[str, Any], name: str, dtype: np.dtype = _F32) -> np.ndarray | None:
    """A FLOATS attribute, or its `<name>_as_tensor` twin when set, as a 1-D array."""
    tensor = attrs.get(f"{name}_as_tensor")
    if tensor is not None:
        return attr_tensor(tensor).reshape(-1).astype(dtype)
    values = attrs.get(name)
    if values is None:
        return None
    return np.asarray(values, dtype=_F32).astype(dtype)


def class_labels(
    attrs: Mapping[str, Any], op: str, ints_name: str = "classlabels_int64s"
) -> tuple[np.ndarray | None, bool]:
    """(labels, using_strings): int64 labels or an object array of str; None if neither is set."""
    strings = string_list(attrs.get("classlabels_strings"))
    ints = attrs.get(ints_name)
    if strings:
        if ints:
            raise ValueError(f"{op}: set only one of classlabels_strings and {ints_name}")
        out = np.empty(len(strings), dtype=object)
        out[:] = strings
        return out, True
    if ints:
        return np.asarray(ints, dtype=np.int64), False
    return None, False


def as_features(x: np.ndarray, op: str) -> np.ndarray:
    """X as [N, F] (a 1-D X is one sample), without copying."""
    if x.ndim == 2:
        return x
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim == 0:
        return x.reshape(1, 1)
    return x.reshape(x.shape[0], -1)


def logistic(v: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-v)) without overflow, in float32."""
    v = np.asarray(v, dtype=_F32)
    e = np.exp(-np.abs(v))
    s = np.float32(1.0) / (np.float32(1.0) + e)
    return np.where(v < 0, np.float32(1.0) - s, s).astype(_F32, copy=False)


def logistic_pair(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(logistic(-v), logistic(v)) as `logistic` computes them, sharing one exp."""
    v = np.asarray(v, dtype=_F32)
    s = np.float32(1.0) / (np.float32(1.0) + np.exp(-np.abs(v)))
    r = np.float32(1.0) - s
    return np.where(v > 0, r, s), np.where(v < 0, r, s)


def probit(v: np.ndarray) -> np.ndarray:
    """sqrt(2) * erfinv(2v - 1) with the closed-form erfinv approximation onnxruntime uses."""
    v = np.asarray(v, dtype=_F32)
    x = np.float32(2.0) * v - np.float32(1.0)
    sgn = np.where(x < 0, np.float32(-1.0), np.float32(1.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (np.float32(1.0) - x) * (np.float32(1.0) + x)
        lg = np.log(t)
        a = _ERFINV_C + np.float32(0.5) * lg
        b = lg / _ERFINV_A
        r = sgn * np.sqrt(np.sqrt(a * a - b) - a)
    return (r * _SQRT2).astype(_F32, copy=False)


def softmax(v: np.ndarray) -> np.ndarray:
    """Row softmax of a 2-D float32 array."""
    e = np.exp(v - v.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e


def softmax_zero(v: np.ndarray) -> np.ndarray:
    """Row softmax where (near-)zero scores, |v| <= 1e-7, stay zero."""
    zero = (v <= np.float32(1e-7)) & (v >= np.float32(-1e-7))
    vmax = np.maximum(v.max(axis=1, keepdims=True), np.finfo(np.float32).min)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.where(zero, v * np.exp(-vmax), np.exp(v - vmax))
        total = np.where(zero, 0, e).sum(axis=1, keepdims=True, dtype=_F32)
        return (e / total).astype(_F32, copy=False)


def transform_rows(scores: np.ndarray, name: str) -> np.ndarray:
    """Apply a post-transform to every row of [N, K] scores, in float32."""
    v = np.asarray(scores, dtype=_F32)
    if name == "PROBIT":
        return probit(v)
    if name == "LOGISTIC":
        return logistic(v)
    if name == "SOFTMAX":
        return softmax(v)
    if name == "SOFTMAX_ZERO":
        return softmax_zero(v)
    return v


def update_scores(scores: np.ndarray, name: str) -> np.ndarray:
    """onnxruntime's score update for regressors and multi-column classifiers: every row is
    transformed when K > 1; a single column only takes PROBIT."""
    if scores.shape[1] > 1 or name == "PROBIT":
        return transform_rows(scores, name)
    return np.asarray(scores, dtype=_F32)
