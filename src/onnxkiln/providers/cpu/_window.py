"""Padded buffers and window slices over a sliding-window geometry (onnxkiln.ops.window),
shared by conv.py and pool.py."""

from __future__ import annotations

import numpy as np

from onnxkiln.ops.window import Geometry

__all__ = ["compute_dtype", "padded_copy", "window_slices"]

_F32 = np.dtype(np.float32)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype to do float math in: float32 for float16/bfloat16, else the dtype itself."""
    dtype = np.dtype(dtype)
    if dtype == np.float16 or dtype.kind == "V":  # float16, ml_dtypes bfloat16
        return _F32
    return dtype


def padded_copy(x: np.ndarray, geo: Geometry, fill: float | int, dtype: np.dtype) -> np.ndarray:
    """A fresh (N, C, *geo.padded) buffer of `dtype`: x in the interior, `fill` around it."""
    lead = x.shape[:-len(geo.in_shape)]
    buf = np.empty((*lead, *geo.padded), dtype=dtype)
    nlead = len(lead)
    interior = [slice(None)] * nlead
    for pb, size in zip(geo.pads_begin, geo.in_shape):
        interior.append(slice(pb, pb + size))
    buf[tuple(interior)] = x
    for i, (pb, size) in enumerate(zip(geo.pads_begin, geo.in_shape)):
        ax = nlead + i
        idx = [slice(None)] * buf.ndim
        if pb:
            idx[ax] = slice(0, pb)
            buf[tuple(idx)] = fill
        if pb + size < buf.shape[ax]:
            idx[ax] = slice(pb + size, None)
            buf[tuple(idx)] = fill
    return buf


def window_slices(geo: Geometry, axis: int, j: int) -> slice:
    """The slice of the padded buffer that kernel tap j reads along spatial `axis`."""
    s, d, o = geo.strides[axis], geo.dilations[axis], geo.out[axis]
    start = j * d
    return slice(start, start + (o - 1) * s + 1, s)
