"""CPU kernels: RoiAlign (10-22) and NonMaxSuppression (10-11)."""

from __future__ import annotations

import math

import numpy as np

from onnxkiln.ops.attrs import attr_str
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu import _numba
from onnxkiln.providers.cpu._window import compute_dtype
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["non_max_suppression", "roi_align"]

_I64 = np.dtype(np.int64)


# ---------------------------------------------------------------------------- RoiAlign


def _roi_axis(start: float, bin_size: float, pooled: int, grid: int, size: int):
    """Bilinear taps of one RoI axis: (low, high, w_low, w_high, valid), each (pooled*grid,)."""
    p = np.arange(pooled, dtype=np.float64)[:, None]
    s = np.arange(grid, dtype=np.float64)[None, :]
    pos = (start + p * bin_size + (s + 0.5) * bin_size / grid).reshape(-1)
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.intp)
    edge = low >= size - 1
    low = np.minimum(low, size - 1)
    high = np.where(edge, low, low + 1)
    pos = np.where(edge, low, pos)
    frac = pos - low
    return low, high, 1.0 - frac, frac, valid


@kernel("RoiAlign", since=10, factory=True, variant="roialign.gather")
def roi_align(info: NodeInfo):
    """RoiAlign: avg or max over bilinear samples per bin, gathered channels-last per RoI."""
    attrs = dict(info.attrs)
    mode = attr_str(attrs.get("mode")) or "avg"
    if mode not in ("avg", "max"):
        raise ValueError(f"RoiAlign: mode must be 'avg' or 'max', got {mode!r}")
    ctm = attr_str(attrs.get("coordinate_transformation_mode")) or "output_half_pixel"
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"RoiAlign: coordinate_transformation_mode must be half_pixel or "
                         f"output_half_pixel, got {ctm!r}")
    half = ctm == "half_pixel"
    oh, ow = int(attrs.get("output_height") or 1), int(attrs.get("output_width") or 1)
    ratio = int(attrs.get("sampling_ratio") or 0)
    scale = float(attrs.get("spatial_scale") if attrs.get("spatial_scale") is not None else 1.0)

    def run(x: np.ndarray, rois: np.ndarray, batch_indices: np.ndarray) -> np.ndarray:
        if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4:
            raise ValueError(f"RoiAlign: X must be (N, C, H, W) and rois (R, 4); got "
                             f"{x.shape} and {rois.shape}")
        nr = rois.shape[0]
        bidx = np.asarray(batch_indices).reshape(-1).astype(np.int64)
        if bidx.shape[0] != nr:
            raise ValueError(f"RoiAlign: batch_indices has {bidx.shape[0]} values for {nr} rois")
        n, c, h, w = x.shape
        if nr and (bidx.min() < 0 or bidx.max() >= n):
            raise IndexError(f"RoiAlign: batch_indices must lie in [0, {n}), got {bidx.tolist()}")
        cdt = compute_dtype(x.dtype)
        y = np.zeros((nr, c, oh, ow), dtype=cdt)
        boxes = rois.astype(np.float64) * scale - (0.5 if half else 0.0)
        xc = x if x.dtype == cdt else x.astype(cdt)
        xt = np.ascontiguousarray(xc.transpose(0, 2, 3, 1)) if nr else None
        for i in range(nr):
            x1, y1, x2, y2 = boxes[i].tolist()
            rw, rh = x2 - x1, y2 - y1
            if not half:
                rw, rh = max(rw, 1.0), max(rh, 1.0)
            bh, bw = rh / oh, rw / ow
            gh = ratio if ratio > 0 else math.ceil(rh / oh)
            gw = ratio if ratio > 0 else math.ceil(rw / ow)
            if gh <= 0 or gw <= 0:
                continue
            ty = _roi_axis(y1, bh, oh, gh, h)
            tx = _roi_axis(x1, bw, ow, gw, w)
            y[i] = _roi_pool(xt[bidx[i]], ty, tx, oh, ow, gh, gw, mode == "max")
        return y.astype(x.dtype, copy=False)

    return run


def _roi_pool(img: np.ndarray, ty, tx, oh: int, ow: int, gh: int, gw: int,
              use_max: bool) -> np.ndarray:
    """Average of each bin's bilinear samples, or (onnxruntime's max mode) the max over
    samples of the largest weighted corner. `img` is channels-last (H, W, C), so every
    gathered sample is a contiguous row; returns (C, oh, ow)."""
    best = None
    ylo, yhi, wylo, wyhi, vy = ty
    xlo, xhi, wxlo, wxhi, vx = tx
    valid = (vy[:, None] & vx[None, :]).astype(img.dtype)
    for rows, wy in ((ylo, wylo), (yhi, wyhi)):
        for cols, wx in ((xlo, wxlo), (xhi, wxhi)):
            wgt = (wy[:, None] * wx[None, :]).astype(img.dtype) * valid
            v = img[rows[:, None], cols[None, :]]
            v *= wgt[:, :, None]
            if best is None:
                best = v
            elif use_max:
                np.maximum(best, v, out=best)
            else:
                best += v
    c = img.shape[-1]
    cells = best.reshape(oh, gh, ow, gw, c)
    if use_max:
        pooled = cells.max(axis=(1, 3))
    else:
        pooled = cells.sum(axis=(1, 3))
        pooled /= gh * gw
    return pooled.transpose(2, 0, 1)


# ---------------------------------------------------------------------------- NonMaxSuppression


def _scalar(v, default, cast):
    if v is None:
        return default
    arr = np.asarray(v).reshape(-1)
    return default if arr.size == 0 else cast(arr[0])


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """(S, 4) boxes as [y_min, x_min, y_max, x_max]; float32 math like onnxruntime's."""
    b = boxes.astype(np.float64 if boxes.dtype == np.float64 else np.float32)
    if center:
        xc, yc, bw, bh = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
        return np.stack([yc - bh / 2, xc - bw / 2, yc + bh / 2, xc + bw / 2], axis=1)
    y_lo, y_hi = np.minimum(b[:, 0], b[:, 2]), np.maximum(b[:, 0], b[:, 2])
    x_lo, x_hi = np.minimum(b[:, 1], b[:, 3]), np.maximum(b[:, 1], b[:, 3])
    return np.stack([y_lo, x_lo, y_hi, x_hi], axis=1)


_MATRIX_MAX = 4096  # boxes per batch up to which the pairwise "compatible" matrix may be built
_NUMBA_FROM = 256  # candidates from which one class without the matrix runs the numba loop
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _nms_signature(dt: np.dtype) -> tuple:
    from numba import types

    f = types.float32 if dt == _F32 else types.float64
    i64 = types.int64
    return (types.Array(f, 2, "C", readonly=True), types.Array(f, 1, "C", readonly=True),
            types.Array(i64, 1, "C", readonly=True), i64, f, f, types.Array(i64, 1, "C"))


_numba.register("nms_greedy", "onnxkiln.providers.cpu._numba_detect", _nms_signature,
                (_F32, _F64))


def _select_compiled(corners: np.ndarray, areas: np.ndarray, order: np.ndarray, limit: int,
                     iou_thr: float) -> list[int]:
    """_select through the numba loop (the same IoU arithmetic, the boxes' float type)."""
    handle = _numba.lazy("nms_greedy", corners.dtype)
    if handle is None or not handle.ready():
        return _select(corners, areas, None, order, limit, iou_thr)
    dt = corners.dtype
    picked = np.empty(min(len(order), max(limit, 0)), _I64)
    count = handle.fn(np.ascontiguousarray(corners), np.ascontiguousarray(areas, dtype=dt),
                      np.ascontiguousarray(order, dtype=_I64), limit, dt.type(iou_thr),
                      dt.type(0), picked)
    return picked[:count].tolist()


def _iou_rows(corners: np.ndarray, areas: np.ndarray, rows: np.ndarray, cols: np.ndarray):
    """IoU of boxes `rows` (as a column) against boxes `cols`; 0 where an area is <= 0."""
    a, b = corners[rows][:, None, :], corners[cols][None, :, :]
    ih = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    iw = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    inter = np.where((ih > 0) & (iw > 0), ih * iw, 0.0)
    ar, ac = areas[rows][:, None], areas[cols][None, :]
    union = ar + ac - inter
    ok = (ar > 0) & (ac > 0) & (union > 0)
    return np.where(ok, inter / np.where(ok, union, 1.0), 0.0)


def _compatible(corners: np.ndarray, areas: np.ndarray, iou_thr: float) -> np.ndarray:
    """(S, S) bool: IoU <= threshold, i.e. the two boxes may both be kept."""
    y1, x1, y2, x2 = (np.ascontiguousarray(corners[:, i]) for i in range(4))
    ih = np.minimum.outer(y2, y2)
    ih -= np.maximum.outer(y1, y1)
    iw = np.minimum.outer(x2, x2)
    iw -= np.maximum.outer(x1, x1)
    np.maximum(ih, 0.0, out=ih)
    np.maximum(iw, 0.0, out=iw)
    inter = np.multiply(ih, iw, out=ih)
    union = np.add.outer(areas, areas, out=iw)
    union -= inter
    good = areas > 0
    valid = np.logical_and.outer(good, good)
    valid &= union > 0
    np.divide(inter, union, out=inter, where=valid)
    inter[~valid] = 0.0
    return inter <= iou_thr


def _candidates(scores: np.ndarray, score_thr: float | None) -> np.ndarray:
    """Box indices above the score threshold, best first (ties: lower index first)."""
    cand = np.flatnonzero(scores > score_thr) if score_thr is not None else np.arange(len(scores))
    return cand[np.argsort(-scores[cand], kind="stable")]


def _select(corners: np.ndarray, areas: np.ndarray, ok: np.ndarray | None, order: np.ndarray,
            limit: int, iou_thr: float) -> list[int]:
    """Greedy NMS of one (batch, class) over `order`: box indices in selection order."""
    alive = np.ones(len(order), dtype=bool)
    chosen: list[int] = []
    pos = 0
    n = len(order)
    while pos < n and len(chosen) < limit:
        cur = int(order[pos])
        chosen.append(cur)
        rest = order[pos + 1:]
        if not rest.size:
            break
        if ok is not None:
            keep = ok[cur].take(rest)
        else:
            keep = _iou_rows(corners, areas, np.array([cur]), rest)[0] <= iou_thr
        tail = alive[pos + 1:]
        np.logical_and(tail, keep, out=tail)
        nxt = int(tail.argmax())
        if not tail[nxt]:
            break
        pos += 1 + nxt
    return chosen


@kernel("NonMaxSuppression", since=10, capture=CaptureSupport.DATA_DEPENDENT_SHAPE,
        variant="nms.greedy")
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box) -> np.ndarray:
    """NonMaxSuppression: greedy per (batch, class); rows [batch, class, box] in int64."""
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise ValueError(f"NonMaxSuppression: boxes must be (B, S, 4) and scores (B, K, S); got "
                         f"{boxes.shape} and {scores.shape}")
    nb, ns = boxes.shape[:2]
    if scores.shape[0] != nb or scores.shape[2] != ns:
        raise ValueError(f"NonMaxSuppression: scores {scores.shape} do not match boxes "
                         f"{boxes.shape} (expected ({nb}, K, {ns}))")
    limit = _scalar(max_output_boxes_per_class, 0, int)
    iou_thr = _scalar(iou_threshold, 0.0, float)
    score_thr = _scalar(score_threshold, None, float)
    if not 0.0 <= iou_thr <= 1.0:
        raise ValueError(f"NonMaxSuppression: iou_threshold must be in [0, 1], got {iou_thr}")
    rows: list[np.ndarray] = []
    if limit > 0 and ns:
        s64 = scores.astype(np.float64)
        for bi in range(nb):
            corners = _corners(boxes[bi], bool(center_point_box))
            areas = (corners[:, 2] - corners[:, 0]) * (corners[:, 3] - corners[:, 1])
            orders = [_candidates(s64[bi, k], score_thr) for k in range(scores.shape[1])]
            total = sum(len(o) for o in orders)
            ok = None
            if len(orders) > 1 and total >= ns and ns <= _MATRIX_MAX:
                ok = _compatible(corners, areas, iou_thr)
            for k, order in enumerate(orders):
                if ok is None and len(order) > _NUMBA_FROM:
                    picked = _select_compiled(corners, areas, order, limit, iou_thr)
                else:
                    picked = _select(corners, areas, ok, order, limit, iou_thr)
                if picked:
                    block = np.empty((len(picked), 3), dtype=_I64)
                    block[:, 0], block[:, 1], block[:, 2] = bi, k, picked
                    rows.append(block)
    if not rows:
        return np.zeros((0, 3), dtype=_I64)
    return np.concatenate(rows)
