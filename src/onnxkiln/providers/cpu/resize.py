"""CPU kernels: Resize (10-19) and Upsample (1-9), separable per-axis interpolation.

Each resized axis gets a plan (onnxkiln.ops.resize) once per (input shape, scales/sizes/roi)
key: an index array (nearest) or tap indices and weights (linear, cubic, antialias), applied
with one gather per tap along that axis. Nearest integer upsampling is a single broadcast copy.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.ops.resize import (
    AxisPlan,
    ResizeConfig,
    ResizePlan,
    optional_values,
    resize_config,
    resize_plan,
)
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._tensor_util import const_input
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["resize", "resize_10", "upsample_1", "upsample_7", "upsample_9"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


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


def _apply_taps(a: np.ndarray, op: AxisPlan, wdt: np.dtype) -> np.ndarray:
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


def _execute(x: np.ndarray, plan: ResizePlan, cfg: ResizeConfig) -> np.ndarray:
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


def _with_plans(params: Callable[..., tuple], cfg: ResizeConfig) -> Callable[..., np.ndarray]:
    """A resize kernel: `params(shape, *inputs after x)` gives (scales, sizes, roi); the plan
    (per-axis indices and weights) is built per call, or once per input signature when
    those inputs' values are fixed by then (specialize)."""

    def run(x: np.ndarray, *rest) -> np.ndarray:
        return _execute(x, resize_plan(x.shape, *params(x.shape, *rest), cfg), cfg)

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        if shapes[0] is None or any(sh is not None and c is None
                                    for sh, c in zip(shapes[1:], consts[1:])):
            return None
        plan = resize_plan(shapes[0], *params(shapes[0], *consts[1:]), cfg)
        return lambda x, *_: _execute(x, plan, cfg)

    run.specialize = specialize
    return run


# ---------------------------------------------------------------------------- kernels


@kernel("Resize", since=11, factory=True, variant="resize.separable")
def resize(info: NodeInfo):
    """Resize 11-19: nearest/linear/cubic, every coordinate mode, antialias, axes, policies."""
    cfg = resize_config(dict(info.attrs), legacy=False)
    known = [const_input(info, i) for i in (1, 2, 3)]
    fixed = [optional_values(v) if v is not None else None for v in known]
    use_roi = cfg.ctm == "tf_crop_and_resize"
    opset = info.opset

    def params(shape, roi=None, scales=None, sizes=None) -> tuple:
        r = (fixed[0] if known[0] is not None else optional_values(roi)) if use_roi else None
        s = fixed[1] if known[1] is not None else optional_values(scales)
        z = fixed[2] if known[2] is not None else optional_values(sizes)
        if z is not None:
            z = tuple(int(v) for v in z)
            if s is not None and opset < 13:
                s = None  # opsets 11-12: sizes are used when given; scales may be a placeholder
        return s, z, r

    return _with_plans(params, cfg)


def _legacy_kernel(cfg: ResizeConfig, fixed_scales: tuple[float, ...] | None, op: str):
    def params(shape, scales=None) -> tuple:
        s = fixed_scales if fixed_scales is not None else optional_values(scales)
        if s is None or len(s) != len(shape):
            raise ValueError(f"{op}: scales must have one value per input axis "
                             f"({len(shape)}), got {s}")
        return s, None, None

    return _with_plans(params, cfg)


@kernel("Resize", since=10, until=10, factory=True, variant="resize.separable")
def resize_10(info: NodeInfo):
    """Resize 10: scales input, asymmetric coordinates, nearest or linear."""
    cfg = resize_config(dict(info.attrs), legacy=True)
    c = const_input(info, 1)
    return _legacy_kernel(cfg, optional_values(c) if c is not None else None, info.op_type)


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
    return _legacy_kernel(resize_config(attrs, legacy=True), tuple(float(v) for v in scales),
                          "Upsample")


@kernel("Upsample", since=1, until=6, factory=True, variant="upsample.separable")
def upsample_1(info: NodeInfo):
    """Upsample 1 (experimental): height_scale/width_scale on the last two axes of 4-D X."""
    attrs = dict(info.attrs)
    cfg = resize_config(attrs, legacy=True)
    hs, ws = float(attrs.get("height_scale") or 1.0), float(attrs.get("width_scale") or 1.0)
    inner = _legacy_kernel(cfg, (1.0, 1.0, hs, ws), "Upsample")

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim != 4:
            raise ValueError(f"Upsample-1 expects a 4-D input, got shape {x.shape}")
        return inner(x)

    return run
