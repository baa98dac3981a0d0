"""Sliding-window geometry shared by conv.py and pool.py: pads, output sizes, padded buffers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Geometry",
    "compute_dtype",
    "geometry",
    "int_tuple",
    "padded_copy",
    "window_slices",
]

_F32 = np.dtype(np.float32)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype to do float math in: float32 for float16/bfloat16, else the dtype itself."""
    dtype = np.dtype(dtype)
    if dtype == np.float16 or dtype.kind == "V":  # float16, ml_dtypes bfloat16
        return _F32
    return dtype


def int_tuple(value: Sequence[int] | None, n: int, default: int, what: str) -> tuple[int, ...]:
    """An attribute as a tuple of n ints, `default` everywhere when absent."""
    if value is None or len(value) == 0:
        return (default,) * n
    out = tuple(int(v) for v in value)
    if len(out) != n:
        raise ValueError(f"{what} has {len(out)} values, expected {n} (one per spatial axis)")
    return out


@dataclass(frozen=True, slots=True)
class Geometry:
    """Where a sliding window goes along each spatial axis.

    Output position o along axis i reads padded coordinate o*strides[i] + j*dilations[i]
    for j in range(kernel[i]); padded coordinate p is input coordinate p - pads_begin[i].
    `padded` is the buffer length per axis that covers both the pads and every window
    (ceil_mode windows may run past the end pad).
    """

    in_shape: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]
    padded: tuple[int, ...]

    @property
    def needs_pad(self) -> bool:
        """Whether the padded buffer differs from the input (any pad or overhang)."""
        return self.padded != self.in_shape or any(self.pads_begin)


def geometry(
    in_shape: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    auto_pad: str,
    ceil_mode: bool = False,
) -> Geometry:
    """Resolve pads and output sizes per the ONNX Conv/pool rules (auto_pad, ceil_mode)."""
    n = len(in_shape)
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else (auto_pad or "NOTSET")
    begin, end, out, padded = [], [], [], []
    for i in range(n):
        size, k, s, d = int(in_shape[i]), kernel[i], strides[i], dilations[i]
        if k < 1 or s < 1 or d < 1:
            raise ValueError(
                f"kernel, strides and dilations must be >= 1, got {k}, {s}, {d} on axis {i}"
            )
        eff = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
            total = max(0, (o - 1) * s + eff - size)
            pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pe = total - pb
        elif auto_pad in ("NOTSET", "VALID"):
            pb, pe = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + n])
            span = size + pb + pe - eff
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= size + pb:  # windows starting in the end pad are dropped
                    o -= 1
            else:
                o = span // s + 1 if span >= 0 else 0
        else:
            raise ValueError(
                f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto_pad!r}"
            )
        if o < 1:
            raise ValueError(
                f"spatial axis {i}: input size {size} with pads ({pb}, {pe}) is smaller than "
                f"the dilated kernel size {eff}; output would be empty"
            )
        begin.append(pb)
        end.append(pe)
        out.append(o)
        padded.append(max(size + pb + pe, (o - 1) * s + eff))
    return Geometry(
        tuple(int(v) for v in in_shape),
        tuple(kernel),
        tuple(strides),
        tuple(dilations),
        tuple(begin),
        tuple(end),
        tuple(out),
        tuple(padded),
    )


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
