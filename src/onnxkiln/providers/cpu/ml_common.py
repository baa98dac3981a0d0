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

from onnxkiln.ops.attrs import attr_str, attr_tensor
from onnxkiln.providers.cpu import _numba

__all__ = [
    "ML",
    "POST_TRANSFORMS",
    "Finish",
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
_I64 = np.dtype(np.int64)
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


def _finish_signature(dt: np.dtype):
    from numba import types

    f = types.float32 if dt == _F32 else types.float64

    def ro(t, nd):
        return types.Array(t, nd, "C", readonly=True)

    return (ro(f, 2), ro(types.uint8, 2), ro(types.int32, 1), ro(types.float64, 1),
            types.Array(types.float32, 2, "C"), types.Array(types.int64, 1, "C"))


_numba.register("tree_finish", "onnxkiln.providers.cpu._numba_ml", _finish_signature,
                (_F32, _F64))


_numba.register("ml_finish", "onnxkiln.providers.cpu._numba_ml", _finish_signature,
                (_F32, _F64))
_REGRESS, _MULTI, _BINARY = range(3)  # _numba_ml.ml_finish modes
_NO_HAS = np.zeros((0, 0), np.uint8)


class Finish:
    """Scores -> outputs for one node: a regressor's post-transformed scores in out_dtype
    (a single target only takes PROBIT), a classifier's argmax labels (unscored classes
    count as -inf) and post-transformed scores, or a tree ensemble's binary rules
    (`binary`, an `ml_tree_rules.Binary`). In one numba call per batch
    (`_numba_ml.ml_finish`, loaded on first use) where `prepare` gave a dtype, since the
    numpy version's dozen small array operations dominate a one-row run; numpy otherwise."""

    def __init__(self, post: str, k: int, labels: np.ndarray | None = None,
                 binary: Any = None, out_dtype: np.dtype = _F32) -> None:
        """`k`: the score width (targets or classes)."""
        self.post, self.k, self.labels, self.binary = post, k, labels, binary
        self.out_dtype = out_dtype
        mode = _BINARY if binary else _MULTI if labels is not None else _REGRESS
        self.mode = mode
        rest, base = binary.params() if binary else ([-1, -1, 0, 0], np.zeros(2))
        head = [mode, POST_TRANSFORMS.index(post)]
        # fi[HAS]: whether the has-array holds per-row flags; one array for each case
        self._fi = [np.asarray([*head, h, *rest], np.int32) for h in (0, 1)]
        self._fb = base
        self._fns: dict[np.dtype, Any] = {}
        self._bounds: dict[np.dtype, Any] = {}  # bound(dtype), once made
        self.fast_used = False  # whether the last call ran in numba
        self.reason: str | None = _numba.disabled_reason()  # why not, when it did not

    def variant(self, op: str) -> str:
        """The trace variant name of the last call."""
        return f"{op.lower()}.{'numba' if self.fast_used else 'numpy'}"

    def prepare(self, dtype: np.dtype, fast: bool = True) -> None:
        """Take the numba kernel for scores of `dtype` (loaded on first use) when `fast`
        (the caller's own path is numba) and numba is on."""
        if fast and dtype not in self._fns:
            handle = _numba.lazy("ml_finish", dtype)
            if handle is not None:
                self._fns[dtype] = handle

    def __call__(self, scores: np.ndarray, has: np.ndarray | None):
        dt = scores.dtype
        fast = self._bounds[dt] if dt in self._bounds else self.bound(dt)
        self.fast_used = fast is not None and not self._nothing_to_do()
        return self._numpy(scores, has) if fast is None else fast(scores, has)

    def _nothing_to_do(self) -> bool:
        return self.mode == _REGRESS and (self.post == "NONE" or
                                          (self.k == 1 and self.post != "PROBIT"))

    def bound(self, dtype: np.dtype):
        """The finishing of [N, k] scores of `dtype` with everything but the scores and
        has-mask bound: the numba call, a dtype conversion when there is nothing to
        transform, or None for the numpy path. Made once per dtype."""
        if dtype not in self._bounds:
            self._bounds[dtype] = self._bind(dtype)
        return self._bounds[dtype]

    def _bind(self, dtype: np.dtype):
        if self._nothing_to_do():
            out_dtype = self.out_dtype
            return lambda scores, has: scores.astype(out_dtype, copy=False)
        handle = self._fns.get(dtype)
        if handle is None or not handle.ready():
            if handle is not None:
                self.reason = handle.reason
            return None
        fn, (fi_none, fi_rows), fb, k = handle.fn, self._fi, self._fb, self.k
        regress, out_dtype = self.mode == _REGRESS, self.out_dtype
        names = self.binary.pair if self.binary else self.labels
        empty, f32, i64, u8 = np.empty, _F32, _I64, np.uint8

        def finish(scores: np.ndarray, has: np.ndarray | None):
            n = scores.shape[0]
            z = empty((n, k), f32)
            lab = empty(n, i64)
            if has is None:
                fn(scores, _NO_HAS, fi_none, fb, z, lab)
            else:
                fn(scores, has.view(u8), fi_rows, fb, z, lab)
            return z.astype(out_dtype, copy=False) if regress else (names[lab], z)

        return finish

    def _numpy(self, scores: np.ndarray, has: np.ndarray | None):
        if self.binary:
            return self.binary(scores, has)
        if self.mode == _REGRESS:
            return transform_rows(scores, self.post).astype(self.out_dtype, copy=False)
        best = scores.argmax(axis=1) if has is None else \
            np.where(has, scores, -np.inf).argmax(axis=1)
        z = scores.astype(_F32, copy=False)
        return self.labels[best], z if self.post == "NONE" else transform_rows(z, self.post)


def update_scores(scores: np.ndarray, name: str) -> np.ndarray:
    """onnxruntime's score update for regressors and multi-column classifiers: every row is
    transformed when K > 1; a single column only takes PROBIT."""
    if scores.shape[1] > 1 or name == "PROBIT":
        return transform_rows(scores, name)
    return np.asarray(scores, dtype=_F32)
