"""numba greedy NonMaxSuppression of one (batch, class) (loaded through `_numba.register`;
imported only when a run first needs it). The same IoU arithmetic as detection.py's
numpy path, in the boxes' own float type and without fastmath, so the same boxes survive;
one tight loop instead of one numpy IoU row per kept box (a detector's 27k boxes of one
class: 7.7 s in numpy rows)."""

from __future__ import annotations

import numpy as np


def nms_greedy(corners, areas, order, limit, iou_thr, zero, picked):
    """Indices kept from `order` (best first) into picked[:count]; returns count.

    A candidate is kept when no box kept before it overlaps it by more than iou_thr (greedy
    NMS, as onnxruntime keeps it): each candidate is checked against the kept boxes, copied
    into one contiguous array, stopping at the first overlap. corners (S, 4) as [y_min,
    x_min, y_max, x_max], areas (S,); iou_thr and zero in the boxes' float type (numpy
    compares a float32 IoU with the threshold as float32)."""
    n = order.shape[0]
    kept = np.empty((min(n, limit), 5), corners.dtype)  # y0, x0, y1, x1, area
    count = 0
    for pos in range(n):
        cur = order[pos]
        y0, x0, y1, x1 = corners[cur, 0], corners[cur, 1], corners[cur, 2], corners[cur, 3]
        ac = areas[cur]
        keep = True
        for s in range(count):
            ih = min(y1, kept[s, 2]) - max(y0, kept[s, 0])
            iw = min(x1, kept[s, 3]) - max(x0, kept[s, 1])
            inter = ih * iw if ih > zero and iw > zero else zero
            ar = kept[s, 4]
            union = ar + ac - inter
            if ar > zero and ac > zero and union > zero and inter / union > iou_thr:
                keep = False
                break
        if keep:
            picked[count] = cur
            kept[count, 0], kept[count, 1], kept[count, 2], kept[count, 3] = y0, x0, y1, x1
            kept[count, 4] = ac
            count += 1
            if count >= limit:
                break
    return count
