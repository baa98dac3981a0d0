"""onnxruntime's rules that turn tree-ensemble scores into outputs, numpy and numba.

A regressor applies its post-transform (a single target only takes PROBIT); a multi-class
classifier takes the argmax label (unscored classes count as -inf) and the post-transformed
scores; a two-class classifier follows onnxruntime's binary rules (`Binary`). `Finish`
runs them in one numba call per batch (`_numba_ml.tree_finish`) when the forest walks in
numba, since the numpy version's dozen small array operations dominate a one-row run;
the numpy version is the fallback and the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxkiln.providers.cpu import _numba
from onnxkiln.providers.cpu.ml_common import (
    POST_TRANSFORMS,
    logistic,
    logistic_pair,
    probit,
    transform_rows,
)
from onnxkiln.providers.cpu.ml_forest import Forest

__all__ = ["Binary", "Finish"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_REGRESS, _MULTI, _BINARY = range(3)  # _numba_ml.tree_finish modes
_NO_HAS = np.zeros((0, 0), np.uint8)


def _finish_signature(dt: np.dtype):
    from numba import types

    f = types.float32 if dt == _F32 else types.float64

    def ro(t, nd):
        return types.Array(t, nd, "C", readonly=True)

    return (ro(f, 2), ro(types.uint8, 2), ro(types.int32, 1), ro(types.float64, 1),
            types.Array(types.float32, 2, "C"), types.Array(types.int64, 1, "C"))


_numba.register("tree_finish", "onnxkiln.providers.cpu._numba_ml", _finish_signature,
                (_F32, _F64))


class Binary:
    """onnxruntime's two-class rules: the label is 1/0 ("labels[1]/[0]" for string labels
    or one voting class), not an argmax; base values and which classes scored decide the
    two score columns. A class's scored-flag that is the same for every row (every leaf
    votes for it, or none does) is a constant, so common models skip the per-row masks."""

    def __init__(self, a: Mapping[str, Any], labels: np.ndarray, strings: bool,
                 base: np.ndarray, all_positive: bool, post: str, forest: Forest) -> None:
        binary_case = len(set(a.get("class_ids") or [])) == 1
        neg, pos = (labels[0], labels[1]) if binary_case or strings else (0, 1)
        self.pair = np.array([neg, pos], dtype=object if strings else _I64)
        self.base, self.post = base, post
        self.one_positive = binary_case and all_positive
        self.threshold = 0.5 if self.one_positive else 0.0
        trees = forest.n_trees > 0
        scored, full = forest.leaf_has.any(axis=0), forest.leaf_has.all(axis=0)
        self.const = [True if trees and full[j] else False if not (trees and scored[j])
                      else None for j in (0, 1)]

    def params(self) -> tuple[list[int], np.ndarray]:
        """tree_finish's int parameters (after the mode and post) and base values."""
        code = [-1 if c is None else int(c) for c in self.const]
        base = np.zeros(2)
        base[: self.base.size] = self.base
        return [*code, self.base.size, int(self.one_positive)], base

    def __call__(self, scores: np.ndarray, has: np.ndarray | None):
        n, base = scores.shape[0], self.base
        h0, h1 = (c if c is not None else has[:, j] for j, c in enumerate(self.const))
        s0, s1 = scores[:, 0], scores[:, 1]
        if base.size == 2:
            # once class 1 scored, its score becomes base[1] + score[0] and class 0's its
            # negation; otherwise both just take their base value
            s1_new = base[1] + s0
            s0 = _pick(h1, -s1_new, s0 + base[0], n)
            s1 = _pick(h1, s1_new, s1 + base[1], n)
            single: Any = False
        else:
            # one base value (skl2onnx's binary gradient boosting): class 0's margin
            s0 = s0 + base[0] if base.size else s0
            single = _negate(h1)
        s0 = _pick(h0, s0, 0.0, n).astype(_F32, copy=False)
        s1 = _pick(h1, s1, 0.0, n).astype(_F32, copy=False)
        y = self.pair[(_pick(h1, s1, s0, n) > self.threshold).astype(np.intp)]
        if single is True:
            return y, _one_score(s0, self.post, self.one_positive)
        z = np.empty((n, 2), dtype=_F32)
        z[:, 0], z[:, 1] = s0, s1
        if self.post != "NONE":
            z = transform_rows(z, self.post)
        if single is not False:
            rows = np.flatnonzero(single)
            if rows.size:
                z[rows] = _one_score(s0[rows], self.post, self.one_positive)
        return y, z


def _pick(h: Any, a: Any, b: Any, n: int) -> np.ndarray:
    """np.where(h, a, b) for a mask h that may be the constant True or False."""
    if h is True:
        return a if isinstance(a, np.ndarray) else np.full(n, a, dtype=_F32)
    if h is False:
        return b if isinstance(b, np.ndarray) else np.full(n, b, dtype=_F32)
    return np.where(h, a, b)


def _negate(h: Any) -> Any:
    return (not h) if isinstance(h, bool) else ~h


def _one_score(s: np.ndarray, post: str, all_positive: bool) -> np.ndarray:
    """onnxruntime's two columns from a binary classifier's single class-0 score."""
    out = np.empty((s.shape[0], 2), dtype=_F32)
    if post == "PROBIT":
        out[:, 0], out[:, 1] = probit(s), 0.0
    elif all_positive:
        p = logistic(s) if post == "LOGISTIC" else s
        out[:, 0], out[:, 1] = np.float32(1.0) - p, p
    elif post == "LOGISTIC":
        out[:, 0], out[:, 1] = logistic_pair(s)
    else:
        out[:, 0], out[:, 1] = -s, s
    return out


class Finish:
    """Scores -> outputs for one node: `regress` (post-transformed scores in out_dtype),
    `multi` (labels, scores) or `binary` (a `Binary`), in numba when the forest walked in
    numba (the kernel loaded per compare dtype with the forest), else in numpy."""

    def __init__(self, post: str, labels: np.ndarray | None = None,
                 binary: Binary | None = None, out_dtype: np.dtype = _F32) -> None:
        self.post, self.labels, self.binary, self.out_dtype = post, labels, binary, out_dtype
        mode = _BINARY if binary else _MULTI if labels is not None else _REGRESS
        self.mode = mode
        rest, base = binary.params() if binary else ([-1, -1, 0, 0], np.zeros(2))
        head = [mode, POST_TRANSFORMS.index(post)]
        # fi[HAS]: whether the has-array holds per-row flags; one array for each case
        self._fi = [np.asarray([*head, h, *rest], np.int32) for h in (0, 1)]
        self._fb = base
        self._fns: dict[np.dtype, Any] = {}

    def prepare(self, forest: Forest) -> None:
        """Take the numba kernel for the forest's dtype (loaded on first use) when the
        forest itself walks in numba."""
        if forest.fast is not None and forest.dtype not in self._fns:
            self._fns[forest.dtype] = _numba.lazy("tree_finish", forest.dtype)

    def __call__(self, scores: np.ndarray, has: np.ndarray | None):
        if self.mode == _REGRESS and (self.post == "NONE" or (
                scores.shape[1] == 1 and self.post != "PROBIT")):
            return scores.astype(self.out_dtype, copy=False)  # nothing to transform
        handle = self._fns.get(scores.dtype)
        if handle is None or not handle.ready():
            return self._numpy(scores, has)
        fn = handle.fn
        n, k = scores.shape
        z = np.empty((n, k), _F32)
        lab = np.empty(n, _I64)
        fn(scores, _NO_HAS if has is None else has.view(np.uint8),
           self._fi[has is not None], self._fb, z, lab)
        if self.mode == _REGRESS:
            return z.astype(self.out_dtype, copy=False)
        return (self.binary.pair if self.binary else self.labels)[lab], z

    def _numpy(self, scores: np.ndarray, has: np.ndarray | None):
        if self.binary:
            return self.binary(scores, has)
        if self.mode == _REGRESS:
            return transform_rows(scores, self.post).astype(self.out_dtype, copy=False)
        best = scores.argmax(axis=1) if has is None else \
            np.where(has, scores, -np.inf).argmax(axis=1)
        z = scores.astype(_F32, copy=False)
        return self.labels[best], z if self.post == "NONE" else transform_rows(z, self.post)
