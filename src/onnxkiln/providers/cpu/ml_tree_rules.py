"""onnxruntime's binary rules for two-class tree ensembles (numpy; `ml_common.Finish`
runs them in numba from `Binary.params`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxkiln.providers.cpu.ml_common import (
    logistic,
    logistic_pair,
    probit,
    transform_rows,
)
from onnxkiln.providers.cpu.ml_forest import Forest

__all__ = ["Binary"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)


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
