"""Torch kernels whose output size is data: NonMaxSuppression and Unique.

Both sync with the host once per call (declared DATA_DEPENDENT_SHAPE, as NonZero): the
heavy part runs on the device (pairwise IoU and score sorting for NMS, the sort behind
torch.unique), and only what fixes the output size crosses to the host.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cuda._util import axis_of
from onnxkiln.providers.cuda.dtypes import FLOATS, SERVED, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor

_MATRIX_MAX = 4096  # boxes per batch up to which the (S, S) compatibility matrix is built


# ---------------------------------------------------------------------------- NonMaxSuppression


def _scalar(v, default, cast):
    if v is None:
        return default
    arr = np.asarray(v).reshape(-1)
    return default if arr.size == 0 else cast(arr[0])


def _corners(boxes: Tensor, center: bool) -> Tensor:
    """(B, S, 4) boxes as [y_min, x_min, y_max, x_max] in float32 (float64 stays)."""
    b = boxes if boxes.dtype == torch.float64 else boxes.float()
    if center:
        xc, yc, bw, bh = b.unbind(-1)
        return torch.stack([yc - bh / 2, xc - bw / 2, yc + bh / 2, xc + bw / 2], dim=-1)
    y0, x0, y1, x1 = b.unbind(-1)
    return torch.stack([torch.minimum(y0, y1), torch.minimum(x0, x1),
                        torch.maximum(y0, y1), torch.maximum(x0, x1)], dim=-1)


def _iou(a: Tensor, b: Tensor, area_a: Tensor, area_b: Tensor) -> Tensor:
    """IoU of every box of `a` (..., P, 4) against every box of `b` (..., Q, 4); 0 where an
    area or the union is not positive."""
    ih = (torch.minimum(a[..., :, None, 2], b[..., None, :, 2])
          - torch.maximum(a[..., :, None, 0], b[..., None, :, 0])).clamp_min(0)
    iw = (torch.minimum(a[..., :, None, 3], b[..., None, :, 3])
          - torch.maximum(a[..., :, None, 1], b[..., None, :, 1])).clamp_min(0)
    inter = ih * iw
    union = area_a[..., :, None] + area_b[..., None, :] - inter
    ok = (area_a[..., :, None] > 0) & (area_b[..., None, :] > 0) & (union > 0)
    return torch.where(ok, inter / torch.where(ok, union, 1.0), 0.0)


def _greedy(order: np.ndarray, limit: int, keep_row: Callable[[int, np.ndarray], np.ndarray]
            ) -> list[int]:
    """Greedy NMS over candidates `order` (best first): each kept box drops the later ones
    `keep_row(box, rest)` marks False."""
    alive = np.ones(len(order), dtype=bool)
    chosen: list[int] = []
    pos, n = 0, len(order)
    while pos < n and len(chosen) < limit:
        cur = int(order[pos])
        chosen.append(cur)
        tail = alive[pos + 1:]
        if not tail.size:
            break
        np.logical_and(tail, keep_row(cur, order[pos + 1:]), out=tail)
        nxt = int(tail.argmax())
        if not tail[nxt]:
            break
        pos += 1 + nxt
    return chosen


@kernel("NonMaxSuppression", since=10, host_inputs=(2, 3, 4),
        capture=CaptureSupport.DATA_DEPENDENT_SHAPE,
        supports=needs(FLOATS | {DataType.INT64}, skip_inputs=(2, 3, 4)))  # int64 selected
def non_max_suppression(boxes: Tensor, scores: Tensor, max_output_boxes_per_class=None,
                        iou_threshold=None, score_threshold=None, *, center_point_box) -> Tensor:
    """Greedy per (batch, class); rows [batch, class, box] in int64. IoU and the score
    order are computed on the device; one download, then the greedy walk on the host."""
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise ValueError(f"NonMaxSuppression: boxes must be (B, S, 4) and scores (B, K, S); got "
                         f"{tuple(boxes.shape)} and {tuple(scores.shape)}")
    nb, ns = boxes.shape[:2]
    nk = scores.shape[1]
    if scores.shape[0] != nb or scores.shape[2] != ns:
        raise ValueError(f"NonMaxSuppression: scores {tuple(scores.shape)} do not match boxes "
                         f"{tuple(boxes.shape)} (expected ({nb}, K, {ns}))")
    limit = _scalar(max_output_boxes_per_class, 0, int)
    iou_thr = _scalar(iou_threshold, 0.0, float)
    score_thr = _scalar(score_threshold, None, float)
    if not 0.0 <= iou_thr <= 1.0:
        raise ValueError(f"NonMaxSuppression: iou_threshold must be in [0, 1], got {iou_thr}")
    empty = torch.zeros((0, 3), dtype=torch.int64, device=boxes.device)
    if limit <= 0 or ns == 0 or nk == 0:
        return empty
    corners = _corners(boxes, bool(center_point_box))
    areas = (corners[..., 2] - corners[..., 0]) * (corners[..., 3] - corners[..., 1])
    s64 = scores.double()
    order = torch.sort(-s64, dim=-1, stable=True).indices  # best first, ties by index
    cand = (s64 > score_thr) if score_thr is not None else torch.ones_like(s64, dtype=torch.bool)
    cand = torch.gather(cand, -1, order)
    if ns <= _MATRIX_MAX:
        compat = (_iou(corners, corners, areas, areas) <= iou_thr).cpu().numpy()
    else:  # the rows of the kept boxes only, from host copies of the corners
        host_c, host_a = corners.cpu(), areas.cpu()
    order_h, cand_h = order.cpu().numpy(), cand.cpu().numpy()
    rows = []
    for bi in range(nb):
        if ns <= _MATRIX_MAX:
            def keep(cur, rest, ok=compat[bi]):
                return ok[cur].take(rest)
        else:
            def keep(cur, rest, c=host_c[bi], a=host_a[bi]):
                r = torch.from_numpy(rest)
                return (_iou(c[cur:cur + 1], c[r], a[cur:cur + 1], a[r])[0] <= iou_thr).numpy()
        for k in range(nk):
            picked = _greedy(order_h[bi, k][cand_h[bi, k]], limit, keep)
            rows += [(bi, k, p) for p in picked]
    if not rows:
        return empty
    return torch.tensor(rows, dtype=torch.int64).to(boxes.device)


# ---------------------------------------------------------------------------- Unique


def _key(x: Tensor) -> Tensor:
    """(rows, m) values as a key torch.unique sorts like numpy: (isnan, value) per element,
    so every NaN is one value sorted last (float16/bfloat16 compare in float32)."""
    if not x.is_floating_point():
        return x
    v = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    nan = torch.isnan(v)
    return torch.stack([nan.to(v.dtype), torch.where(nan, 0.0, v)], dim=-1).flatten(1)


def _codes(x: Tensor, axis: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """(first indices, inverse, counts) of the distinct values (or slices) in sorted order."""
    rows = x.reshape(-1, 1) if axis is None else torch.movedim(x, axis, 0).flatten(1)
    n, dev = rows.shape[0], x.device
    if n == 0:
        z = torch.zeros(0, dtype=torch.int64, device=dev)
        return z, z, z
    if rows.shape[1] == 0:  # every slice is empty, so all are equal
        return (torch.zeros(1, dtype=torch.int64, device=dev),
                torch.zeros(n, dtype=torch.int64, device=dev),
                torch.full((1,), n, dtype=torch.int64, device=dev))
    key = _key(rows)
    if key.dtype == torch.bool:
        key = key.to(torch.uint8)
    _, inverse, counts = torch.unique(key, sorted=True, return_inverse=True,
                                      return_counts=True, dim=0)
    first = torch.full((counts.shape[0],), n, dtype=torch.int64, device=dev)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=dev), "amin")
    return first, inverse, counts


@kernel("Unique", since=11, factory=True, multi_output=True,
        capture=CaptureSupport.DATA_DEPENDENT_SHAPE,
        supports=needs(SERVED))
def unique(info: NodeInfo) -> Callable[[Tensor], tuple[Tensor, ...]]:
    """Unique values (or slices along axis): Y, first indices, inverse indices, counts;
    sorted, or in order of first occurrence (sorted=0). NaNs count as one value."""
    axis_attr = info.attrs.get("axis")
    sorted_ = bool(info.attrs["sorted"])

    def run(x: Tensor) -> tuple[Tensor, ...]:
        axis = None if axis_attr is None else axis_of(int(axis_attr), x.ndim, "Unique")
        first, inverse, counts = _codes(x, axis)
        if not sorted_:  # order of first occurrence
            order = torch.argsort(first, stable=True)
            rank = torch.empty_like(order)
            rank[order] = torch.arange(order.shape[0], device=x.device)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        y = x.reshape(-1)[first] if axis is None else torch.index_select(x, axis, first)
        return y, first, inverse, counts

    return run
