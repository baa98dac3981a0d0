"""CPU kernels: sorting and selection (TopK, Unique)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.ops.attrs import norm_axis
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu._tensor_util import const_input
from onnxkiln.providers.cpu.registry import kernel

_I64 = np.dtype(np.int64)
_F32 = np.dtype(np.float32)


def _sort_key(x: np.ndarray) -> np.ndarray:
    """An array that sorts like `x` (bfloat16 and other ml_dtypes compare as float32)."""
    return x.astype(_F32) if x.dtype.kind == "V" else x


# TopK


def _desc_argsort(a: np.ndarray) -> np.ndarray:
    """Stable descending argsort along the last axis: equal values keep index order."""
    n = a.shape[-1]
    return (n - 1) - np.argsort(a[..., ::-1], axis=-1, kind="stable")[..., ::-1]


def _topk_rows(key: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """Indices (rows, k) of the top k per row of a 2-D array, ties to the lower index."""
    rows, n = key.shape
    if k > 0 and 8 * k <= n and n >= 64 and key.dtype.kind in "iuf":
        # Partition, then keep the candidates at or beyond the k-th value; when exactly k per
        # row (no tie straddles the cut, no NaN), sorting those k is all that is left.
        kth = n - k if largest else k - 1
        part = np.argpartition(key, kth, axis=1)[:, kth : kth + 1]
        cut = np.take_along_axis(key, part, axis=1)
        mask = key >= cut if largest else key <= cut
        if np.all(np.count_nonzero(mask, axis=1) == k):
            cand = np.nonzero(mask)[1].reshape(rows, k)  # increasing index within a row
            vals = np.take_along_axis(key, cand, axis=1)
            order = _desc_argsort(vals) if largest else np.argsort(vals, axis=1, kind="stable")
            return np.take_along_axis(cand, order, axis=1)
    order = _desc_argsort(key) if largest else np.argsort(key, axis=1, kind="stable")
    return order[:, :k]


def _topk(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (smallest) along axis, sorted; ties keep the lower index first."""
    a = norm_axis(axis, x.ndim, "TopK")
    n = x.shape[a]
    if not 0 <= k <= n:
        raise ValueError(f"TopK: k must be in [0, {n}] (axis {axis} has size {n}), got {k}")
    key = np.moveaxis(_sort_key(x), a, -1)
    lead = key.shape[:-1]
    idx = _topk_rows(key.reshape(math.prod(lead), n), k, largest).astype(_I64, copy=False)
    idx = np.moveaxis(idx.reshape(*lead, k), -1, a)
    return np.take_along_axis(x, idx, axis=a), np.ascontiguousarray(idx)


def _k_value(k: np.ndarray) -> int:
    a = np.asarray(k)
    if a.size != 1:
        raise ValueError(f"TopK: K must hold a single value, got shape {list(a.shape)}")
    return int(a.reshape(-1)[0])


@kernel("TopK", since=1, until=9, multi_output=True)
def topk_v1(x: np.ndarray, *, k: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest elements along axis (k attribute), sorted descending."""
    return _topk(x, int(k), axis, True)


@kernel("TopK", since=10, until=10, multi_output=True)
def topk_v10(x: np.ndarray, k: np.ndarray, *, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """The K largest elements along axis (K input), sorted descending."""
    return _topk(x, _k_value(k), axis, True)


@kernel("TopK", since=11, factory=True, multi_output=True)
def topk(info: NodeInfo) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """The K largest or smallest elements along axis; `sorted=0` still returns them sorted."""
    axis = info.attrs["axis"]
    largest = bool(info.attrs["largest"])  # `sorted` is free to be ignored: we always sort
    c = const_input(info, 1)
    fixed = None if c is None else _k_value(c)

    def run(x: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _topk(x, fixed if fixed is not None else _k_value(k), axis, largest)

    return run


# Unique


def _unique_codes(x: np.ndarray, axis: int | None) -> tuple[np.ndarray, ...]:
    """np.unique on a sortable form of x: (first indices, inverse, counts), sorted order.

    NaNs count as one value (numpy's and onnx's reference behaviour; onnxruntime's output
    with NaNs is not well defined).
    """
    if x.dtype.kind == "O":  # strings: replace by their rank, then treat as integers
        _, codes = np.unique(x.reshape(-1), return_inverse=True)
        key = codes.reshape(x.shape)
    else:
        key = _sort_key(x)
    if axis is None:
        _, first, inverse, counts = np.unique(
            key.reshape(-1), return_index=True, return_inverse=True, return_counts=True
        )  # fmt: skip
        return first, inverse.reshape(-1), counts
    if key.shape[axis] == 0:
        empty = np.zeros(0, _I64)
        return empty, empty, empty
    rows = np.moveaxis(key, axis, 0).reshape(key.shape[axis], -1)
    if rows.shape[1] == 0:  # every slice is empty, so all are equal
        n = rows.shape[0]
        return np.zeros(1, _I64), np.zeros(n, _I64), np.array([n], _I64)
    # Lexicographic order of the slices: sort by the last column first, stably.
    order = np.lexsort(rows.T[::-1])
    srt = rows[order]
    new = np.ones(len(srt), dtype=bool)
    differs = srt[1:] != srt[:-1]
    if srt.dtype.kind in "fc":  # NaNs are equal to each other here, as in np.unique
        differs &= ~(np.isnan(srt[1:]) & np.isnan(srt[:-1]))
    new[1:] = np.any(differs, axis=1)
    group = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    first = order[starts]  # lexsort is stable: the first of each group is its first occurrence
    inverse = np.empty(len(order), _I64)
    inverse[order] = group
    counts = np.diff(np.append(starts, len(srt)))
    return first, inverse, counts


@kernel(
    "Unique", since=11, factory=True, multi_output=True,
    capture=CaptureSupport.DATA_DEPENDENT_SHAPE,
)  # fmt: skip
def unique(info: NodeInfo) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    """Unique values (or slices along axis): Y, first indices, inverse indices, counts."""
    axis_attr = info.attrs.get("axis")
    sorted_ = bool(info.attrs["sorted"])

    def run(x: np.ndarray) -> tuple[np.ndarray, ...]:
        axis = None if axis_attr is None else norm_axis(axis_attr, x.ndim, "Unique")
        first, inverse, counts = _unique_codes(x, axis)
        if not sorted_:  # order of first occurrence
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            first, counts, inverse = first[order], counts[order], rank[inverse]
        first = first.astype(_I64, copy=False)
        if axis is None:
            y = x.reshape(-1)[first]
        else:
            y = np.take(x, first, axis=axis)
        return y, first, inverse.astype(_I64, copy=False), counts.astype(_I64, copy=False)

    return run
