"""Resize and Upsample's meaning, for every provider: attributes, output shape and the
per-axis coordinate plans (which input positions, with which weights, make each output).

`resize_config` parses the attributes once; `resize_plan` turns an input shape and the runtime
scales/sizes/roi into the output shape and, per resized axis, an index array (nearest) or tap
indices and weights (linear, cubic, antialias), computed in onnxruntime's float32 operation
order so that every provider picks the same source positions. Applying a plan (one gather per
tap along an axis) is the provider's part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxkiln.ops.attrs import attr_str, norm_axes

__all__ = ["AxisPlan", "ResizeConfig", "ResizePlan", "optional_values", "resize_config",
           "resize_plan"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

_MODES = {"nearest": "nearest", "linear": "linear", "bilinear": "linear", "trilinear": "linear",
          "cubic": "cubic", "bicubic": "cubic"}
_CTMS = frozenset({"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                   "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"})
_NEAREST = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"})


@dataclass(frozen=True, slots=True)
class ResizeConfig:
    """Resize's attributes, parsed and checked once (legacy: Resize-10 and Upsample)."""

    mode: str
    ctm: str
    nearest_mode: str
    cubic_a: float
    exclude_outside: bool
    extrapolation: float
    antialias: bool
    policy: str
    axes: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class AxisPlan:
    """How one resized axis is read: source indices, and tap weights unless nearest."""

    axis: int
    idx: np.ndarray  # nearest: (out,); filters: (taps, out)
    weights: np.ndarray | None  # (taps, out) float64, None for nearest
    repeat: int  # > 0: nearest index is arange(out) // repeat (integer upsampling)
    outside: np.ndarray | None  # (out,) bool: tf_crop_and_resize extrapolated positions


@dataclass(frozen=True, slots=True)
class ResizePlan:
    """The output shape and the per-axis plans for one input shape and scales/sizes/roi."""

    out_shape: tuple[int, ...]
    ops: tuple[AxisPlan, ...]  # in the order to apply (most shrinking axis first)
    mask: np.ndarray | None  # broadcastable bool mask of extrapolated outputs


def resize_config(attrs: dict[str, Any], *, legacy: bool) -> ResizeConfig:
    """The node's attributes with onnx's defaults; Resize-10/Upsample (`legacy`) always use
    asymmetric coordinates and Upsample's nearest rounding."""
    mode = (attr_str(attrs.get("mode")) or "nearest").lower()
    if mode not in _MODES:
        raise ValueError(f"Resize: mode must be nearest, linear or cubic; got {mode!r}")
    ctm = "asymmetric" if legacy else attr_str(attrs.get("coordinate_transformation_mode"))
    ctm = ctm or "half_pixel"
    if ctm not in _CTMS:
        raise ValueError(f"Resize: unknown coordinate_transformation_mode {ctm!r}; expected one "
                         f"of {sorted(_CTMS)}")
    nearest = "simple" if legacy else attr_str(attrs.get("nearest_mode")) or "round_prefer_floor"
    if nearest not in _NEAREST:
        raise ValueError(f"Resize: unknown nearest_mode {nearest!r}")
    policy = attr_str(attrs.get("keep_aspect_ratio_policy")) or "stretch"
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ValueError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
    a = attrs.get("cubic_coeff_a")
    axes = attrs.get("axes")
    return ResizeConfig(
        mode=_MODES[mode],
        ctm=ctm,
        nearest_mode=nearest,
        cubic_a=-0.75 if a is None else float(a),
        exclude_outside=bool(attrs.get("exclude_outside") or 0),
        extrapolation=float(attrs.get("extrapolation_value") or 0.0),
        antialias=bool(attrs.get("antialias") or 0),
        policy=policy,
        axes=None if axes is None else tuple(int(v) for v in axes),
    )


# ---------------------------------------------------------------------------- per-axis plans


def _coords(n_out: int, n_in: int, scale: float, target: float, ctm: str, roi):
    """Input coordinate of every output position along one axis.

    Computed in float32 in onnxruntime's operation order, so that rounding ties in nearest
    mode resolve as they do there; returned as float64. `target` is the resized length
    before flooring (n_in * scale when scales are given).
    """
    f = np.float32
    x = np.arange(n_out, dtype=_F32)
    s = f(scale)
    if ctm in ("half_pixel", "pytorch_half_pixel"):
        c = (x + f(0.5)) / s - f(0.5)
        if ctm == "pytorch_half_pixel" and n_out <= 1:
            c = np.zeros_like(x)
    elif ctm == "half_pixel_symmetric":
        adjustment = f(n_out) / f(target)
        offset = f(n_in) / f(2.0) * (f(1.0) - adjustment)
        c = offset + (x + f(0.5)) / s - f(0.5)
    elif ctm == "align_corners":  # the fractional target length, as the spec and its tests say
        c = x * f(n_in - 1) / f(target - 1) if n_out > 1 else np.zeros_like(x)
    elif ctm == "asymmetric":
        c = x / s
    elif ctm == "tf_half_pixel_for_nn":
        c = (x + f(0.5)) / s
    else:  # tf_crop_and_resize
        start, end = f(roi[0]), f(roi[1])
        if n_out > 1:
            c = start * f(n_in - 1) + x * (end - start) * f(n_in - 1) / f(n_out - 1)
        else:
            c = np.full_like(x, f(0.5) * (start + end) * f(n_in - 1))
    return c.astype(_F64)


def _nearest_index(x: np.ndarray, mode: str, scale: float) -> np.ndarray:
    if mode == "simple":  # Resize-10 / Upsample: floor when upsampling, ceil when downsampling
        mode = "ceil" if scale < 1 else "floor"
    if mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    return np.floor(x) if mode == "floor" else np.ceil(x)


def _filter(d: np.ndarray, mode: str, a: float) -> np.ndarray:
    """Linear (triangle) or cubic (Keys, coefficient a) kernel at distances d."""
    d = np.abs(d)
    if mode == "linear":
        return np.maximum(1.0 - d, 0.0)
    d2, d3 = d * d, d * d * d
    near = (a + 2.0) * d3 - (a + 3.0) * d2 + 1.0
    far = a * d3 - 5.0 * a * d2 + 8.0 * a * d - 4.0 * a
    return np.where(d <= 1.0, near, np.where(d < 2.0, far, 0.0))


def _filter_taps(x: np.ndarray, n_in: int, scale: float, cfg: ResizeConfig):
    """Tap indices (clamped to the edge) and weights, both (taps, out)."""
    support = 1.0 if cfg.mode == "linear" else 2.0
    stretch = min(scale, 1.0) if cfg.antialias else 1.0
    lo = math.floor(-support / stretch) + 1
    offsets = np.arange(lo, 2 - lo, dtype=_F64)
    base = np.ceil(x) - 1.0  # the tap left of x (x itself when x is an integer: weight 0)
    j = base[None, :] + offsets[:, None]
    w = _filter((j - x[None, :]) * stretch, cfg.mode, cfg.cubic_a)
    if cfg.exclude_outside:
        w = np.where((j >= 0) & (j < n_in), w, 0.0)
    if cfg.antialias or cfg.exclude_outside:
        total = w.sum(axis=0, keepdims=True)
        w = w / np.where(total == 0.0, 1.0, total)
    return j.astype(np.intp), w


def _axis_op(axis: int, n_in: int, n_out: int, scale: float, target: float, roi,
             cfg: ResizeConfig) -> AxisPlan | None:
    """The plan for one axis, or None when the axis maps onto itself."""
    if n_in == 0 and n_out > 0:
        raise ValueError(f"Resize: axis {axis} has length 0 and cannot be resized to {n_out}")
    x = _coords(n_out, n_in, scale, target, cfg.ctm, roi)
    crop = cfg.ctm == "tf_crop_and_resize"
    if n_out == n_in and not crop and np.array_equal(x, np.arange(n_out, dtype=_F64)):
        return None
    outside = ((x < 0) | (x > n_in - 1)) if crop else None
    if outside is not None and not outside.any():
        outside = None
    if cfg.mode == "nearest":
        idx = np.clip(_nearest_index(x, cfg.nearest_mode, scale), 0, max(n_in - 1, 0))
        idx = idx.astype(np.intp)
        repeat = 0
        if outside is None and n_in and n_out % n_in == 0 and n_out > n_in:
            f = n_out // n_in
            if np.array_equal(idx, np.arange(n_out) // f):
                repeat = f
        if n_out == n_in and outside is None and np.array_equal(idx, np.arange(n_out)):
            return None
        return AxisPlan(axis, idx, None, repeat, outside)
    j, w = _filter_taps(x, n_in, scale, cfg)
    return AxisPlan(axis, np.clip(j, 0, max(n_in - 1, 0)), w, 0, outside)


def _axis_order(axis: int, n_in: int, n_out: int) -> tuple[int, float]:
    """Shrinking axes first (most shrinking first); then growing axes innermost first, as
    gathers along the innermost axis cost the most per element and run on the smaller data."""
    ratio = n_out / max(n_in, 1)
    return (0, ratio) if ratio < 1 else (1, -axis)


def _round_half_up(v: float) -> int:
    return math.floor(v + 0.5)


def resize_plan(shape: tuple[int, ...], scales, sizes, roi, cfg: ResizeConfig) -> ResizePlan:
    """Output shape and per-axis plans from the runtime scales/sizes/roi values."""
    rank = len(shape)
    axes = tuple(range(rank)) if cfg.axes is None else norm_axes(cfg.axes, rank, "Resize")
    k = len(axes)
    if sizes is not None and scales is not None:
        raise ValueError("Resize: give only one of 'scales' and 'sizes', not both")
    if sizes is None and scales is None:
        raise ValueError("Resize: one of 'scales' or 'sizes' must be given")
    out = list(shape)
    axis_scale = [1.0] * rank
    target = [float(n) for n in shape]
    if sizes is not None:
        if len(sizes) != k:
            raise ValueError(f"Resize: sizes has {len(sizes)} values, expected {k} (one per "
                             f"resized axis of the rank-{rank} input)")
        if any(s < 0 for s in sizes):
            raise ValueError(f"Resize: sizes must be >= 0, got {list(sizes)}")
        if cfg.policy == "stretch":
            for ax, s in zip(axes, sizes):
                out[ax] = int(s)
                target[ax] = float(s)
                axis_scale[ax] = float(np.float32(s) / np.float32(shape[ax])) if shape[ax] else 1.0
        else:
            ratios = [s / shape[ax] for ax, s in zip(axes, sizes) if shape[ax]]
            common = (min if cfg.policy == "not_larger" else max)(ratios) if ratios else 1.0
            for ax in axes:
                out[ax] = _round_half_up(common * shape[ax])
                target[ax] = common * shape[ax]
                axis_scale[ax] = common
    else:
        if len(scales) != k:
            raise ValueError(f"Resize: scales has {len(scales)} values, expected {k} (one per "
                             f"resized axis of the rank-{rank} input)")
        for ax, s in zip(axes, scales):
            if not s > 0:
                raise ValueError(f"Resize: scales must be > 0, got {list(scales)}")
            out[ax] = math.floor(float(np.float32(shape[ax]) * np.float32(s)))
            axis_scale[ax] = float(s)
            target[ax] = shape[ax] * float(s)
    starts = [0.0] * rank
    ends = [1.0] * rank
    if cfg.ctm == "tf_crop_and_resize" and roi is not None and len(roi):
        if len(roi) != 2 * k:
            raise ValueError(f"Resize: roi has {len(roi)} values, expected {2 * k} "
                             f"(starts then ends for each resized axis)")
        for i, ax in enumerate(axes):
            starts[ax], ends[ax] = float(roi[i]), float(roi[k + i])
    ops = []
    for ax in axes:
        op = _axis_op(ax, shape[ax], out[ax], axis_scale[ax], target[ax],
                      (starts[ax], ends[ax]), cfg)
        if op is not None:
            ops.append(op)
    ops.sort(key=lambda o: _axis_order(o.axis, shape[o.axis], out[o.axis]))
    mask = None
    for op in ops:
        if op.outside is not None:
            m = op.outside.reshape([-1 if i == op.axis else 1 for i in range(rank)])
            mask = m if mask is None else (mask | m)
    return ResizePlan(tuple(out), tuple(ops), mask)


def optional_values(arr: np.ndarray | None) -> tuple[float, ...] | None:
    """An optional 1-D input as a tuple; absent or empty means not given."""
    if arr is None:
        return None
    arr = np.asarray(arr)
    if arr.size == 0:
        return None
    return tuple(arr.reshape(-1).tolist())
