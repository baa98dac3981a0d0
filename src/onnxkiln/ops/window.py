"""Sliding-window geometry of Conv, ConvTranspose and the pooling ops, for every provider.

Attributes are read the same way everywhere (int_tuple, conv_geometry, pool_geometry), pads
and output sizes follow the ONNX rules (auto_pad, ceil_mode, output_shape/output_padding),
and AveragePool's divisors come from `window_counts`, so every provider agrees on shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Geometry",
    "conv_geometry",
    "geometry",
    "int_tuple",
    "pool_geometry",
    "transpose_pads",
    "window_counts",
]


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


def conv_geometry(attrs: dict, x_shape: tuple, w_shape: tuple) -> Geometry:
    """Conv's window geometry for input X and weight W shapes (kernel_shape must match W)."""
    nsp = len(x_shape) - 2
    kernel_shape = tuple(w_shape[2:])
    given = attrs.get("kernel_shape")
    if given is not None and len(given) > 0 and tuple(int(k) for k in given) != kernel_shape:
        raise ValueError(f"kernel_shape {list(given)} does not match W spatial dims "
                         f"{list(kernel_shape)}")
    return geometry(
        x_shape[2:],
        kernel_shape,
        int_tuple(attrs.get("strides"), nsp, 1, "strides"),
        int_tuple(attrs.get("dilations"), nsp, 1, "dilations"),
        int_tuple(attrs.get("pads"), 2 * nsp, 0, "pads"),
        attrs.get("auto_pad") or "NOTSET",
    )


def pool_geometry(attrs: dict, x_shape: tuple) -> Geometry:
    """A pooling op's window geometry for input shape (N, C, D1, ...)."""
    nsp = len(x_shape) - 2
    if nsp < 1:
        raise ValueError(f"pooling needs input (N, C, D1, ...), got shape {x_shape}")
    ks = attrs.get("kernel_shape")
    if ks is None or len(ks) != nsp:
        raise ValueError(f"kernel_shape {ks} must give one size per spatial axis ({nsp})")
    return geometry(
        x_shape[2:],
        tuple(int(k) for k in ks),
        int_tuple(attrs.get("strides"), nsp, 1, "strides"),
        int_tuple(attrs.get("dilations"), nsp, 1, "dilations"),
        int_tuple(attrs.get("pads"), 2 * nsp, 0, "pads"),
        attrs.get("auto_pad") or "NOTSET",
        bool(attrs.get("ceil_mode") or 0),
    )


def transpose_pads(attrs: dict, in_sp, k, s, d, out_pad) -> tuple[list, list, list]:
    """(pads_begin, pads_end, output size) per the ConvTranspose rules."""
    nsp = len(in_sp)
    auto_pad = attrs.get("auto_pad") or "NOTSET"
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    full = [s[i] * (in_sp[i] - 1) + out_pad[i] + (k[i] - 1) * d[i] + 1 for i in range(nsp)]
    out_shape = attrs.get("output_shape")
    if out_shape is not None and len(out_shape) > 0:
        out = [int(v) for v in out_shape][-nsp:]
        if len(out) != nsp:
            raise ValueError(f"output_shape {list(out_shape)} must have {nsp} spatial sizes")
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # in * stride, but never below the unpadded size (onnx shape inference and onnxruntime
        # clamp the total padding at 0, e.g. for a 1x1 kernel with stride 2)
        out = [min(in_sp[i] * s[i], full[i]) for i in range(nsp)]
    elif auto_pad in ("NOTSET", "VALID"):
        pads = int_tuple(attrs.get("pads"), 2 * nsp, 0, "pads")
        if auto_pad == "VALID":
            pads = (0,) * (2 * nsp)
        out = [full[i] - pads[i] - pads[i + nsp] for i in range(nsp)]
        if min(out) < 1:
            raise ValueError(f"ConvTranspose output size {out} is empty (pads {list(pads)})")
        return list(pads[:nsp]), list(pads[nsp:]), out
    else:
        raise ValueError(
            f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto_pad!r}"
        )
    total = [full[i] - out[i] for i in range(nsp)]
    if auto_pad == "SAME_UPPER":
        begin = [t // 2 for t in total]
    else:
        begin = [t - t // 2 for t in total]
    return begin, [t - b for t, b in zip(total, begin)], out


def window_counts(geo: Geometry, include_pad: bool) -> np.ndarray | float:
    """Cells each AveragePool window averages over: the product of per-axis counts
    (broadcastable over the output's spatial axes), or one float when they are all equal."""
    nsp = len(geo.kernel)
    total: np.ndarray | float = 1.0
    uniform = True
    for i in range(nsp):
        size, pb, pe = geo.in_shape[i], geo.pads_begin[i], geo.pads_end[i]
        lo, hi = (-pb, size + pe) if include_pad else (0, size)
        starts = np.arange(geo.out[i]) * geo.strides[i] - pb
        taps = np.arange(geo.kernel[i]) * geo.dilations[i]
        coords = starts[:, None] + taps[None, :]
        cnt = ((coords >= lo) & (coords < hi)).sum(axis=1).astype(np.float64)
        shape = [1] * nsp
        shape[i] = geo.out[i]
        uniform &= bool((cnt == cnt[0]).all())
        total = total * cnt.reshape(shape)
    if uniform:
        return float(np.asarray(total).flat[0])
    return np.asarray(total)
