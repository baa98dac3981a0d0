"""CPU kernels: Resize (10-19) and Upsample (1-9), separable per-axis interpolation.

Each resized axis gets a plan once per (input shape, scales/sizes/roi) key: an index array
(nearest) or tap indices and weights (linear, cubic, antialias), applied with one gather
per tap along that axis. Nearest integer upsampling is a single broadcast copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._tensor_util import attr_str, const_input, norm_axes
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["resize", "resize_10", "upsample_1", "upsample_7", "upsample_9"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_MODES = {"nearest": "nearest", "linear": "linear", "bilinear": "linear", "trilinear": "linear",
          "cubic": "cubic", "bicubic": "cubic"}
_CTMS = frozenset({"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                   "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"})
_NEAREST = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"})


@dataclass(frozen=True, slots=True)
class _Config:
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
class _AxisOp:
    axis: int
    idx: np.ndarray  # nearest: (out,); filters: (taps, out)
    weights: np.ndarray | None  # (taps, out) float64, None for nearest
    repeat: int  # > 0: nearest index is arange(out) // repeat (integer upsampling)
    outside: np.ndarray | None  # (out,) bool: tf_crop_and_resize extrapolated positions


@dataclass(frozen=True, slots=True)
class _Plan:
    out_shape: tuple[int, ...]
    ops: tuple[_AxisOp, ...]  # in the order to apply (most shrinking axis first)
    mask: np.ndarray | None  # broadcastable bool mask of extrapolated outputs


def _config(attrs: dict[str, Any], *, legacy: bool) -> _Config:
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
    return _Config(
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


def _filter_taps(x: np.ndarray, n_in: int, scale: float, cfg: _Config):
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
             cfg: _Config) -> _AxisOp | None:
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
        return _AxisOp(axis, idx, None, repeat, outside)
    j, w = _filter_taps(x, n_in, scale, cfg)
    return _AxisOp(axis, np.clip(j, 0, max(n_in - 1, 0)), w, 0, outside)


def _axis_order(axis: int, n_in: int, n_out: int) -> tuple[int, float]:
    """Shrinking axes first (most shrinking first); then growing axes innermost first, as
    gathers along the innermost axis cost the most per element and run on the smaller data."""
    ratio = n_out / max(n_in, 1)
    return (0, ratio) if ratio < 1 else (1, -axis)


def _round_half_up(v: float) -> int:
    return math.floor(v + 0.5)


def _plan(shape: tuple[int, ...], scales, sizes, roi, cfg: _Config) -> _Plan:
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
    return _Plan(tuple(out), tuple(ops), mask)


# ---------------------------------------------------------------------------- applying a plan


def _work_dtype(dtype: np.dtype) -> np.dtype:
    if dtype.kind in "fc" and dtype.itemsize >= 4:
        return dtype
    if dtype.kind in "iu" and dtype.itemsize >= 4:
        return _F64
    return _F32


def _repeat(a: np.ndarray, axis: int, factor: int) -> np.ndarray:
    """Nearest integer upsampling of one (not innermost) axis as a broadcast copy."""
    shape = a.shape
    y = np.empty((*shape[:axis + 1], factor, *shape[axis + 1:]), dtype=a.dtype)
    y[...] = a.reshape(*shape[:axis + 1], 1, *shape[axis + 1:])
    return y.reshape(*shape[:axis], shape[axis] * factor, *shape[axis + 1:])


def _apply_taps(a: np.ndarray, op: _AxisOp, wdt: np.dtype) -> np.ndarray:
    shape = [1] * a.ndim
    shape[op.axis] = -1
    idx, w = op.idx, op.weights.astype(wdt)
    acc = np.take(a, idx[0], axis=op.axis, mode="clip")
    acc *= w[0].reshape(shape)
    if len(idx) > 1:
        tmp = np.empty_like(acc)
        for t in range(1, len(idx)):
            np.take(a, idx[t], axis=op.axis, out=tmp, mode="clip")
            tmp *= w[t].reshape(shape)
            acc += tmp
    return acc


def _to_output(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if y.dtype == dtype:
        return y
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        np.trunc(y, out=y)
        np.clip(y, info.min, info.max, out=y)
    return y.astype(dtype)


def _execute(x: np.ndarray, plan: _Plan, cfg: _Config) -> np.ndarray:
    ops = plan.ops
    if not ops or 0 in plan.out_shape:
        if 0 in plan.out_shape:
            return np.empty(plan.out_shape, dtype=x.dtype)
        return x.copy()
    if cfg.mode == "nearest":
        y = x
        for op in ops:
            if op.repeat and op.axis < x.ndim - 1 and plan.mask is None:
                y = _repeat(y, op.axis, op.repeat)
            else:
                y = np.take(y, op.idx, axis=op.axis, mode="clip")
        if plan.mask is not None:
            y = y.astype(_work_dtype(x.dtype)) if x.dtype.kind in "iuV" else y
            np.copyto(y, cfg.extrapolation, where=plan.mask, casting="unsafe")
            return _to_output(y, x.dtype)
        return y
    wdt = _work_dtype(x.dtype)
    y = x if x.dtype == wdt else x.astype(wdt)
    for op in ops:
        y = _apply_taps(y, op, wdt if wdt.kind == "f" else _F64)
    if plan.mask is not None:
        np.copyto(y, cfg.extrapolation, where=plan.mask, casting="unsafe")
    return _to_output(y, x.dtype)


def _values(arr: np.ndarray | None) -> tuple[float, ...] | None:
    """An optional 1-D input as a tuple; absent or empty means not given."""
    if arr is None:
        return None
    arr = np.asarray(arr)
    if arr.size == 0:
        return None
    return tuple(arr.reshape(-1).tolist())


def _with_plans(params: Callable[..., tuple], cfg: _Config) -> Callable[..., np.ndarray]:
    """A resize kernel: `params(shape, *inputs after x)` gives (scales, sizes, roi); the plan
    (per-axis indices and weights) is built per call, or once per input signature when
    those inputs' values are fixed by then (specialize)."""

    def run(x: np.ndarray, *rest) -> np.ndarray:
        return _execute(x, _plan(x.shape, *params(x.shape, *rest), cfg), cfg)

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        if shapes[0] is None or any(sh is not None and c is None
                                    for sh, c in zip(shapes[1:], consts[1:])):
            return None
        plan = _plan(shapes[0], *params(shapes[0], *consts[1:]), cfg)
        return lambda x, *_: _execute(x, plan, cfg)

    run.specialize = specialize
    return run


# ---------------------------------------------------------------------------- kernels


@kernel("Resize", since=11, factory=True, variant="resize.separable")
def resize(info: NodeInfo):
    """Resize 11-19: nearest/linear/cubic, every coordinate mode, antialias, axes, policies."""
    cfg = _config(dict(info.attrs), legacy=False)
    known = [const_input(info, i) for i in (1, 2, 3)]
    fixed = [_values(v) if v is not None else None for v in known]
    use_roi = cfg.ctm == "tf_crop_and_resize"
    opset = info.opset

    def params(shape, roi=None, scales=None, sizes=None) -> tuple:
        r = (fixed[0] if known[0] is not None else _values(roi)) if use_roi else None
        s = fixed[1] if known[1] is not None else _values(scales)
        z = fixed[2] if known[2] is not None else _values(sizes)
        if z is not None:
            z = tuple(int(v) for v in z)
            if s is not None and opset < 13:
                s = None  # opsets 11-12: sizes are used when given; scales may be a placeholder
        return s, z, r

    return _with_plans(params, cfg)


def _legacy_kernel(cfg: _Config, fixed_scales: tuple[float, ...] | None, op: str):
    def params(shape, scales=None) -> tuple:
        s = fixed_scales if fixed_scales is not None else _values(scales)
        if s is None or len(s) != len(shape):
            raise ValueError(f"{op}: scales must have one value per input axis "
                             f"({len(shape)}), got {s}")
        return s, None, None

    return _with_plans(params, cfg)


@kernel("Resize", since=10, until=10, factory=True, variant="resize.separable")
def resize_10(info: NodeInfo):
    """Resize 10: scales input, asymmetric coordinates, nearest or linear."""
    cfg = _config(dict(info.attrs), legacy=True)
    c = const_input(info, 1)
    return _legacy_kernel(cfg, _values(c) if c is not None else None, info.op_type)


@kernel("Upsample", since=9, factory=True, variant="upsample.separable")
def upsample_9(info: NodeInfo):
    """Upsample 9 (deprecated from 10): scales input, asymmetric coordinates."""
    return resize_10(info)


@kernel("Upsample", since=7, until=8, factory=True, variant="upsample.separable")
def upsample_7(info: NodeInfo):
    """Upsample 7-8: scales attribute, asymmetric coordinates."""
    attrs = dict(info.attrs)
    scales = attrs.get("scales")
    if scales is None:
        raise ValueError("Upsample: the 'scales' attribute is required")
    return _legacy_kernel(_config(attrs, legacy=True), tuple(float(v) for v in scales),
                          "Upsample")


@kernel("Upsample", since=1, until=6, factory=True, variant="upsample.separable")
def upsample_1(info: NodeInfo):
    """Upsample 1 (experimental): height_scale/width_scale on the last two axes of 4-D X."""
    attrs = dict(info.attrs)
    cfg = _config(attrs, legacy=True)
    hs, ws = float(attrs.get("height_scale") or 1.0), float(attrs.get("width_scale") or 1.0)
    inner = _legacy_kernel(cfg, (1.0, 1.0, hs, ws), "Upsample")

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim != 4:
            raise ValueError(f"Upsample-1 expects a 4-D input, got shape {x.shape}")
        return inner(x)

    return run
