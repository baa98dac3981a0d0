"""Torch kernels: MatMul, Gemm, Conv, ConvTranspose, pooling and normalizations.

Matrix and convolution kernels serve float types only (cuBLAS/cuDNN have no integer GEMM
through torch); float16/bfloat16 normalizations compute in float32. Window geometry (pads,
auto_pad, ceil_mode, divisors) is computed on the host by onnxkiln.ops.window, as the CPU
provider computes it, so both providers agree on output sizes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from onnxkiln.dtypes import DataType
from onnxkiln.ops.window import (
    conv_geometry,
    int_tuple,
    pool_geometry,
    transpose_pads,
    window_counts,
)
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import axis_of, up, wants
from onnxkiln.providers.cuda.dtypes import FLOATS, needs
from onnxkiln.providers.cuda.registry import kernel
from onnxkiln.schema import positive_int_attr

Tensor = torch.Tensor
_NO_INT = "no integer GEMM/convolution on CUDA through torch"
_FLOAT_ONLY = needs(FLOATS, what=_NO_INT)


@kernel("MatMul", since=1, supports=_FLOAT_ONLY)
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """numpy-style matmul (1-D operands promoted, batch dims broadcast)."""
    return torch.matmul(a, b)


@kernel("Gemm", since=1, factory=True, supports=_FLOAT_ONLY)
def gemm(info: NodeInfo) -> Callable[..., Tensor]:
    """alpha * A' @ B' + beta * C (C broadcast to the result)."""
    alpha = float(info.attrs.get("alpha", 1.0))
    beta = float(info.attrs.get("beta", 1.0))
    ta, tb = bool(info.attrs.get("transA", 0)), bool(info.attrs.get("transB", 0))
    return functools.partial(_gemm, alpha=alpha, beta=beta, ta=ta, tb=tb)


def _gemm(a: Tensor, b: Tensor, c: Tensor | None = None, *, alpha: float, beta: float,
          ta: bool, tb: bool) -> Tensor:
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm: A and B must be 2-D, got {tuple(a.shape)}, {tuple(b.shape)}")
    a = a.t() if ta else a
    b = b.t() if tb else b
    if c is None or beta == 0.0:
        y = torch.matmul(a, b)
        return y * alpha if alpha != 1.0 else y
    if c.dtype == a.dtype:
        return torch.addmm(c.expand(a.shape[0], b.shape[1]), a, b, beta=beta, alpha=alpha)
    return torch.matmul(a, b) * alpha + c * beta


# ---------------------------------------------------------------------------------------
# Conv, ConvTranspose

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _spatial_supports(op: str, extra=None, what: str = _NO_INT, allowed=FLOATS):
    def supports(info: NodeInfo) -> str | None:
        why = extra(info) if extra is not None else None
        if why:
            return why
        why = needs(allowed, what=what)(info)
        if why:
            return why
        shape = info.input_shapes[0] if info.input_shapes else None
        if shape is not None and not 3 <= len(shape) <= 5:
            return f"{op} with {len(shape) - 2} spatial dims is left to the CPU (torch: 1-3)"
        return None
    return supports


def _pad_list(begin, end) -> list[int]:
    """F.pad's list (last dim first) for per-axis begin/end pads."""
    out: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [b, e]
    return out


def conv_fn(info: NodeInfo) -> Callable[..., Tensor]:
    """Conv over 1-3 spatial dims with groups, dilations, pads (asymmetric ones via F.pad)."""
    attrs = dict(info.attrs)
    group = positive_int_attr(attrs, "group", "Conv")
    cache: dict[tuple, tuple] = {}

    def run(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        key = (tuple(x.shape), tuple(w.shape))
        g = cache.get(key)
        if g is None:
            geo = conv_geometry(attrs, tuple(x.shape), tuple(w.shape))
            sym = geo.pads_begin == geo.pads_end
            g = cache[key] = (geo, sym, None if sym else _pad_list(geo.pads_begin, geo.pads_end))
        geo, sym, plist = g
        nsp = x.ndim - 2
        if plist is not None:
            x = F.pad(x, plist)
        return _CONV[nsp](x, w, b, geo.strides, list(geo.pads_begin) if sym else 0,
                          geo.dilations, group)

    return run


@kernel("Conv", since=1, factory=True, supports=_spatial_supports("Conv"))
def conv(info: NodeInfo) -> Callable[..., Tensor]:
    """Conv (torch/cuDNN), 1-3 spatial dims."""
    return conv_fn(info)


@kernel("ConvTranspose", since=1, factory=True, supports=_spatial_supports("ConvTranspose"))
def conv_transpose(info: NodeInfo) -> Callable[..., Tensor]:
    """ConvTranspose with pads/auto_pad/output_shape/output_padding; bias added after crop."""
    attrs = dict(info.attrs)
    group = positive_int_attr(attrs, "group", "ConvTranspose")

    def run(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        nsp = x.ndim - 2
        k = tuple(w.shape[2:])
        s = int_tuple(attrs.get("strides"), nsp, 1, "strides")
        d = int_tuple(attrs.get("dilations"), nsp, 1, "dilations")
        op = int_tuple(attrs.get("output_padding"), nsp, 0, "output_padding")
        begin, _, out = transpose_pads(attrs, tuple(x.shape[2:]), k, s, d, op)
        full = _CONV_T[nsp](x, w, None, s, 0, 0, group, d)
        # crop `begin` (pad when negative) and fit to `out` (zero-fill past the full result)
        plist: list[int] = []
        for i in reversed(range(nsp)):
            lo = -begin[i]
            hi = out[i] - full.shape[2 + i] - lo
            plist += [lo, hi]
        y = F.pad(full, plist)
        if b is not None:
            y = y + b.reshape(1, -1, *([1] * nsp))
        return y

    return run


# ---------------------------------------------------------------------------------------
# pooling


def _pool_attrs_ok(info: NodeInfo) -> str | None:
    x = info.input_dtypes[0] if info.input_dtypes else None
    if x is not None and x not in FLOATS:  # only Indices may be int64
        return f"MaxPool on {x} is not supported by the torch kernels (integer pooling) (input 0)"
    order = int(info.attrs.get("storage_order") or 0)
    if order not in (0, 1):
        return f"MaxPool: storage_order must be 0 or 1, got {order}"
    return None


def _onnx_indices(idx: Tensor, geo, storage_order: int) -> Tensor:
    """torch's per-plane flat indices into the padded input -> ONNX's flat indices into the
    unpadded input tensor (row-major, or column-major spatial dims for storage_order=1)."""
    nsp = idx.ndim - 2
    sizes = geo.in_shape
    if storage_order:
        mult = [math.prod(sizes[:i]) for i in range(nsp)]
    else:
        mult = [math.prod(sizes[i + 1:]) for i in range(nsp)]
    n, c = idx.shape[:2]
    planes = torch.arange(n * c, device=idx.device).reshape(n, c, *([1] * nsp))
    flat = planes * math.prod(sizes)
    rest = idx
    for i in reversed(range(nsp)):
        coord = rest % geo.padded[i] - geo.pads_begin[i]
        rest = rest // geo.padded[i]
        flat = flat + coord * mult[i]
    return flat


def _padded(x: Tensor, geo, fill) -> Tensor:
    nsp = x.ndim - 2
    end = [geo.padded[i] - geo.in_shape[i] - geo.pads_begin[i] for i in range(nsp)]
    if not any(geo.pads_begin) and not any(end):
        return x
    return F.pad(x, _pad_list(geo.pads_begin, end), value=fill)


@kernel("MaxPool", since=1, factory=True, multi_output=True,
        supports=_spatial_supports("MaxPool", _pool_attrs_ok, "integer pooling",
                                   FLOATS | {DataType.INT64}))
def max_pool(info: NodeInfo) -> Callable[[Tensor], tuple]:
    """MaxPool (-inf padding, dilations, ceil_mode, auto_pad); Indices as ONNX's flat
    positions in the unpadded input (storage_order 0 or 1)."""
    attrs = dict(info.attrs)
    cache: dict[tuple, object] = {}
    want_indices = info.n_outputs > 1 and wants(info, 1)
    storage_order = int(attrs.get("storage_order") or 0)

    def run(x: Tensor) -> tuple:
        geo = cache.get(tuple(x.shape))
        if geo is None:
            geo = cache[tuple(x.shape)] = pool_geometry(attrs, tuple(x.shape))
        xp = _padded(x, geo, -math.inf)
        if want_indices:
            y, idx = _MAXPOOL[x.ndim - 2](xp, geo.kernel, geo.strides, 0, geo.dilations,
                                          return_indices=True)
            return (y, _onnx_indices(idx, geo, storage_order))
        y = _MAXPOOL[x.ndim - 2](xp, geo.kernel, geo.strides, 0, geo.dilations)
        if y is x:
            y = y.clone()
        return (y, None)

    return run


@functools.lru_cache(maxsize=64)
def _ones_kernel(k: tuple[int, ...], dtype: torch.dtype, device: str) -> Tensor:
    return torch.ones((1, 1, *k), dtype=dtype, device=device)


@functools.lru_cache(maxsize=256)
def _divisor(geo, include_pad: bool, dtype: torch.dtype, device: str) -> Tensor | float:
    div = window_counts(geo, include_pad)
    if isinstance(div, float):
        return div
    return torch.as_tensor(np.asarray(div), dtype=dtype, device=device)


@kernel("AveragePool", since=1, factory=True,
        supports=_spatial_supports("AveragePool", what="integer pooling"))
def average_pool(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Window sums (a ones-kernel conv, so dilations work) over the window counts."""
    attrs = dict(info.attrs)
    include_pad = bool(attrs.get("count_include_pad") or 0)
    cache: dict[tuple, object] = {}

    def run(x: Tensor) -> Tensor:
        geo = cache.get(tuple(x.shape))
        if geo is None:
            geo = cache[tuple(x.shape)] = pool_geometry(attrs, tuple(x.shape))
        n, c = x.shape[:2]
        xc = up(x)
        xp = _padded(xc, geo, 0.0).reshape(n * c, 1, *[geo.padded[i] for i in range(x.ndim - 2)])
        ker = _ones_kernel(tuple(geo.kernel), xc.dtype, str(x.device))
        s = _CONV[x.ndim - 2](xp, ker, None, geo.strides, 0, geo.dilations)
        s = s.reshape(n, c, *s.shape[2:])
        return (s / _divisor(geo, include_pad, xc.dtype, str(x.device))).to(x.dtype)

    return run


@kernel("GlobalAveragePool", since=1, supports=needs(FLOATS))
def global_average_pool(x: Tensor) -> Tensor:
    """Mean over every spatial dim, kept as size 1."""
    dims = tuple(range(2, x.ndim))
    return torch.mean(up(x), dim=dims, keepdim=True).to(x.dtype)


@kernel("GlobalMaxPool", since=1, supports=needs(FLOATS))
def global_max_pool(x: Tensor) -> Tensor:
    """Max over every spatial dim, kept as size 1."""
    return torch.amax(x, dim=tuple(range(2, x.ndim)), keepdim=True)


# ---------------------------------------------------------------------------------------
# normalizations


def _bn_supports(info: NodeInfo) -> str | None:
    why = needs(FLOATS)(info)
    if why:
        return why
    if not info.attrs.get("spatial", 1):
        return "BatchNormalization with spatial=0 is left to the CPU"
    return None


def _bn_training(x, scale, b, mean, var, eps: float, momentum: float, ct) -> tuple:
    """Normalize with the batch's statistics (population variance); Y, the running mean and
    var updated with `momentum`, the batch mean and 1/sqrt(var + eps) (as the CPU does)."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    axes = (0, *range(2, x.ndim))
    xc = x.to(ct)
    cur_mean = xc.mean(dim=axes)
    cur_var = ((xc - cur_mean.reshape(shape)) ** 2).mean(dim=axes)
    inv = 1.0 / torch.sqrt(cur_var + eps)
    y = (xc - cur_mean.reshape(shape)) * (scale.to(ct) * inv).reshape(shape) \
        + b.to(ct).reshape(shape)
    run_mean = mean.to(ct) * momentum + cur_mean * (1 - momentum)
    run_var = var.to(ct) * momentum + cur_var * (1 - momentum)
    return (y.to(x.dtype), run_mean.to(mean.dtype), run_var.to(var.dtype),
            cur_mean.to(mean.dtype), inv.to(var.dtype))


@kernel("BatchNormalization", since=1, factory=True, multi_output=True, supports=_bn_supports)
def batch_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """Inference: (X - mean) / sqrt(var + eps) * scale + B per channel, in float32 for halves.
    Training (training_mode=1 from opset 14; earlier, when the node asks for the running
    statistics without is_test) uses the batch's statistics and updates the running ones."""
    eps = float(info.attrs["epsilon"])
    momentum = float(info.attrs.get("momentum", 0.9))
    extra = any(wants(info, i) for i in range(1, info.n_outputs))
    if info.opset >= 14:
        training = bool(info.attrs.get("training_mode", 0))
    else:
        training = extra and not info.attrs.get("is_test", 0)

    def run(x, scale, b, mean, var) -> tuple:
        shape = (1, -1) + (1,) * (x.ndim - 2)
        ct = torch.float64 if x.dtype == torch.float64 else torch.float32
        if training:
            outs = _bn_training(x, scale, b, mean, var, eps, momentum, ct)
            return outs[:3] if info.opset >= 14 else outs
        s = scale.to(ct) / torch.sqrt(var.to(ct) + eps)
        shift = b.to(ct) - mean.to(ct) * s
        y = x.to(ct) * s.reshape(shape) + shift.reshape(shape)
        if not extra:
            return (y.to(x.dtype),)
        # inference asked for statistics anyway: the running ones pass through unchanged
        return (y.to(x.dtype), mean.clone(), var.clone(), mean.clone(), var.clone())

    return run


def _normalize(x2: Tensor, eps: float, simplified: bool = False):
    """(normalized rows, mean, inv_std) of a 2-D compute-dtype tensor over its last dim."""
    if simplified:
        mean = None
        ms = torch.mean(x2 * x2, dim=-1, keepdim=True)
    else:
        mean = torch.mean(x2, dim=-1, keepdim=True)
        x2 = x2 - mean
        ms = torch.mean(x2 * x2, dim=-1, keepdim=True)
    inv = torch.rsqrt(ms + eps)
    return x2 * inv, mean, inv


@kernel("InstanceNormalization", since=1, factory=True, supports=needs(FLOATS))
def instance_normalization(info: NodeInfo) -> Callable[..., Tensor]:
    """Normalize each (n, c) over the spatial dims, then per-channel scale and B."""
    eps = float(info.attrs["epsilon"])

    def run(x: Tensor, scale: Tensor, b: Tensor) -> Tensor:
        n, c = x.shape[:2]
        ct = torch.float64 if x.dtype == torch.float64 else torch.float32
        y, _, _ = _normalize(x.reshape(n, c, -1).to(ct), eps)
        y = y * scale.to(ct).reshape(c, 1) + b.to(ct).reshape(c, 1)
        return y.reshape(x.shape).to(x.dtype)

    return run


@kernel("GroupNormalization", since=18, factory=True, supports=needs(FLOATS))
def group_normalization(info: NodeInfo) -> Callable[..., Tensor]:
    """Normalize each (n, group); scale/bias per group (opset 18) or per channel (21+)."""
    eps = float(info.attrs["epsilon"])
    groups = int(info.attrs["num_groups"])
    per_channel = info.opset >= 21

    def run(x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
        n, c = x.shape[:2]
        if groups <= 0 or c % groups:
            raise ValueError(f"GroupNormalization: num_groups={groups} must divide C={c}")
        k = c if per_channel else groups
        ct = torch.float64 if x.dtype == torch.float64 else torch.float32
        y, _, _ = _normalize(x.reshape(n, groups, -1).to(ct), eps)
        y = y.reshape(n, k, -1) * scale.to(ct).reshape(k, 1) + bias.to(ct).reshape(k, 1)
        return y.reshape(x.shape).to(x.dtype)

    return run


def _layer_norm(info: NodeInfo, simplified: bool, out_scale_type: bool,
                stash_dtype: torch.dtype | None) -> Callable[..., tuple]:
    axis = int(info.attrs.get("axis", -1))
    eps = float(info.attrs.get("epsilon", 1e-5))
    op = info.op_type

    def run(x: Tensor, scale: Tensor, b: Tensor | None = None) -> tuple:
        ax = axis_of(axis, x.ndim, op)
        lead = x.shape[:ax]
        stat = (*lead, *(1,) * (x.ndim - ax))
        ct = torch.float64 if torch.float64 in (x.dtype, stash_dtype) else torch.float32
        rows = math.prod(lead)
        y, mean, inv = _normalize(x.reshape(rows, -1).to(ct), eps, simplified)
        y = y.reshape(x.shape) * scale.to(ct)
        if b is not None:
            y = y + b.to(ct)
        sd = stash_dtype or torch.float32
        y = y.to(scale.dtype if out_scale_type else x.dtype)
        inv_out = inv.reshape(stat).to(sd)
        if simplified:
            return y, inv_out
        return y, mean.reshape(stat).to(sd), inv_out

    return run


def _stash(info: NodeInfo) -> torch.dtype:
    stash = int(info.attrs.get("stash_type", 1))
    if stash not in (1, 11):
        raise ValueError(f"{info.op_type}: stash_type must be 1 or 11, got {stash}")
    return torch.float64 if stash == 11 else torch.float32


@kernel("LayerNormalization", since=17, factory=True, multi_output=True, supports=needs(FLOATS))
def layer_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """Normalize over dims [axis, rank) in float32 (float64 for double), then Scale and B."""
    return _layer_norm(info, False, False, _stash(info))


@kernel("LayerNormalization", since=1, until=16, factory=True, multi_output=True,
        supports=needs(FLOATS))
def layer_normalization_contrib(info: NodeInfo) -> Callable[..., tuple]:
    """onnxruntime's pre-17 LayerNormalization (output in scale's type)."""
    return _layer_norm(info, False, True, _stash(info))


@kernel("SimplifiedLayerNormalization", since=1, factory=True, multi_output=True,
        supports=needs(FLOATS))
def simplified_layer_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """RMSNorm over dims [axis, rank): X / sqrt(mean(X^2) + eps) * scale (output in scale's
    type, as onnxruntime)."""
    return _layer_norm(info, True, True, _stash(info))


kernel("SimplifiedLayerNormalization", since=1, domain="com.microsoft", factory=True,
       multi_output=True, supports=needs(FLOATS))(simplified_layer_normalization)


@kernel("RMSNormalization", since=23, factory=True, supports=needs(FLOATS))
def rms_normalization(info: NodeInfo) -> Callable[..., Tensor]:
    """X / sqrt(mean(X^2 over [axis, rank)) + eps) * scale, output in scale's type."""
    stash = int(info.attrs.get("stash_type", 1))
    inner = _layer_norm(info, True, True, torch.float64 if stash == 11 else torch.float32)
    return lambda x, scale: inner(x, scale)[0]
