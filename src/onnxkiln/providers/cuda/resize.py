"""Torch kernels: Resize (10-19+) and Upsample (7+), separable per-axis interpolation.

Planning (coordinate transforms, nearest rounding, linear/cubic/antialias taps and weights,
axes, aspect-ratio policies, tf_crop_and_resize extrapolation) runs on the host with
onnxkiln.ops.resize, the CPU provider's planner too, so both providers pick the same source
positions; the device applies one index_select per tap and axis. roi/scales/sizes are host
inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from onnxkiln.ops.resize import optional_values, resize_config, resize_plan
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import host_input
from onnxkiln.providers.cuda.dtypes import FLOATS, INTS, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
_SERVED = FLOATS | INTS


class _DevicePlans:
    """The shared planner's per-axis ops with their index/weight arrays on the device (the last
    plans made, by input shape and resize parameters: this provider does not specialise
    per signature yet)."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.plans: dict[tuple, object] = {}
        self.uploaded: dict[tuple[int, str, torch.dtype], tuple] = {}

    def get(self, x: Tensor, scales, sizes, roi) -> tuple:
        key = (tuple(x.shape), scales, sizes, roi)
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= 16:
                self.plans.clear()
            plan = self.plans[key] = resize_plan(tuple(x.shape), scales, sizes, roi, self.cfg)
        wdt = torch.float64 if x.dtype in (torch.float64, torch.int32, torch.int64) \
            else torch.float32
        key = (id(plan), str(x.device), wdt)
        got = self.uploaded.get(key)
        if got is None or got[0] is not plan:
            if len(self.uploaded) > 32:
                self.uploaded.clear()
            ops = []
            for op in plan.ops:
                idx = torch.as_tensor(np.asarray(op.idx, np.int64), device=x.device)
                w = None if op.weights is None else torch.as_tensor(
                    np.asarray(op.weights), dtype=wdt, device=x.device)
                ops.append((op.axis, idx, w))
            mask = None if plan.mask is None else torch.as_tensor(
                np.asarray(plan.mask), device=x.device)
            got = self.uploaded[key] = (plan, ops, mask, wdt)
        return got


def _execute(x: Tensor, plans: _DevicePlans, scales, sizes, roi) -> Tensor:
    plan, ops, mask, wdt = plans.get(x, scales, sizes, roi)
    if not ops or 0 in plan.out_shape:
        return torch.empty(plan.out_shape, dtype=x.dtype, device=x.device) \
            if 0 in plan.out_shape else x.clone()
    cfg = plans.cfg
    if cfg.mode == "nearest":
        y = x
        for axis, idx, _ in ops:
            y = torch.index_select(y, axis, idx)
        if mask is not None:
            y = torch.where(mask, torch.full((), cfg.extrapolation, dtype=wdt,
                                             device=x.device), y.to(wdt))
            return _to_output(y, x.dtype)
        return y
    y = x.to(wdt)
    for axis, idx, w in ops:
        shape = [1] * y.ndim
        shape[axis] = -1
        acc = None
        for t in range(idx.shape[0]):
            term = torch.index_select(y, axis, idx[t]) * w[t].reshape(shape)
            acc = term if acc is None else acc + term
        y = acc
    if mask is not None:
        y = torch.where(mask, torch.full((), cfg.extrapolation, dtype=wdt, device=x.device), y)
    return _to_output(y, x.dtype)


def _to_output(y: Tensor, dtype: torch.dtype) -> Tensor:
    if y.dtype == dtype:
        return y
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        y = torch.clamp(torch.trunc(y), info.min, info.max)
    return y.to(dtype)


def _host_values(info: NodeInfo, i: int):
    c = host_input(info, i)
    return (True, optional_values(c)) if c is not None else (False, None)


@kernel("Resize", since=11, factory=True, host_inputs=(1, 2, 3),
        supports=needs(_SERVED, skip_inputs=(1, 2, 3)), variant="resize.gather")
def resize(info: NodeInfo) -> Callable[..., Tensor]:
    """Resize 11+: nearest/linear/cubic, every coordinate mode, antialias, axes, policies."""
    cfg = resize_config(dict(info.attrs), legacy=False)
    plans = _DevicePlans(cfg)
    use_roi = cfg.ctm == "tf_crop_and_resize"
    opset = info.opset

    def run(x: Tensor, roi=None, scales=None, sizes=None) -> Tensor:
        r = optional_values(roi) if use_roi else None
        s = optional_values(scales)
        z = optional_values(sizes)
        if z is not None:
            z = tuple(int(v) for v in z)
            if s is not None and opset < 13:
                s = None
        return _execute(x, plans, s, z, r)

    return run


def _legacy(cfg, fixed: tuple[float, ...] | None, op: str) -> Callable[..., Tensor]:
    plans = _DevicePlans(cfg)

    def run(x: Tensor, scales=None) -> Tensor:
        s = fixed if fixed is not None else optional_values(scales)
        if s is None or len(s) != x.ndim:
            raise ValueError(f"{op}: scales must have one value per input axis ({x.ndim}), "
                             f"got {s}")
        return _execute(x, plans, s, None, None)

    return run


@kernel("Resize", since=10, until=10, factory=True, host_inputs=(1,),
        supports=needs(_SERVED, skip_inputs=(1,)), variant="resize.gather")
def resize_10(info: NodeInfo) -> Callable[..., Tensor]:
    """Resize 10: host scales input, asymmetric coordinates, nearest or linear."""
    return _legacy(resize_config(dict(info.attrs), legacy=True), None, info.op_type)


@kernel("Upsample", since=9, factory=True, host_inputs=(1,),
        supports=needs(_SERVED, skip_inputs=(1,)), variant="upsample.gather")
def upsample_9(info: NodeInfo) -> Callable[..., Tensor]:
    """Upsample 9: host scales input, asymmetric coordinates."""
    return _legacy(resize_config(dict(info.attrs), legacy=True), None, "Upsample")


@kernel("Upsample", since=7, until=8, factory=True, supports=needs(_SERVED),
        variant="upsample.gather")
def upsample_7(info: NodeInfo) -> Callable[..., Tensor]:
    """Upsample 7-8: scales attribute, asymmetric coordinates."""
    attrs = dict(info.attrs)
    scales = attrs.get("scales")
    if scales is None:
        raise ValueError("Upsample: the 'scales' attribute is required")
    return _legacy(resize_config(attrs, legacy=True), tuple(float(v) for v in scales), "Upsample")
