"""Torch kernels: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and BitCast.

Semantics follow the CPU provider (providers/cpu/quant.py): the quotient x / scale is
computed in float32 (float64 for a float64 `precision` or scale; a float16/bfloat16 one
rounds the quotient to that type first), rounded half to even, offset by the zero point
and clamped (NaN clamps to the minimum); float8 outputs saturate to +-max unless
saturate=0. Scales and zero points may be per tensor, per axis or blocked. int4/uint4/
int2/uint2 go through their byte-wide carriers (dtypes.to_carrier); float4e2m1 and
float8e8m0 operands are declined (torch has no one-per-byte tensors of them). No host syncs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import axis_of
from onnxkiln.providers.cuda.dtypes import (
    FLOAT8,
    FLOATS,
    SERVED,
    SUB_BYTE,
    from_carrier,
    is_sub_byte,
    to_carrier,
    to_torch_dtype,
)
from onnxkiln.providers.cuda.registry import kernel
from onnxkiln.providers.cuda.tensor import float8_overflowing

Tensor = torch.Tensor
_INT_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-32768, 32767),
              torch.uint16: (0, 65535), torch.int4: (-8, 7), torch.uint4: (0, 15),
              torch.int2: (-2, 1), torch.uint2: (0, 3)}
_QUANT = frozenset({DataType.UINT8, DataType.INT8, DataType.INT16, DataType.UINT16}) | FLOAT8 \
    | SUB_BYTE
_SCALES = frozenset({DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16})
_F8 = frozenset(to_torch_dtype(d) for d in FLOAT8)
_LOW = (torch.float16, torch.bfloat16)


def _type_attr(info: NodeInfo, name: str, allowed: frozenset) -> str | None:
    v = info.attrs.get(name)
    if not v:
        return None
    try:
        dt = DataType(int(v))
    except ValueError:
        return f"{info.op_type}: {name} {v} is not an element type"
    if dt not in allowed:
        return f"{info.op_type} with {name} {dt} is not supported by the torch kernels"
    return None


def _why_dtype(info: NodeInfo, slots: dict[str, frozenset]) -> str | None:
    """The first of the named slots ("input 0", "output 0"...) whose known dtype is not
    allowed, as a reason."""
    for where, allowed in slots.items():
        kind, i = where.split()
        dts = info.input_dtypes if kind == "input" else info.output_dtypes
        dt = dts[int(i)] if int(i) < len(dts) else None
        if dt is None or dt in allowed:
            continue
        try:
            to_torch_dtype(dt)
        except KeyError:
            return (f"dtype {dt} not supported by torch kernels ({where}: torch has no {dt} "
                    f"tensors; the CPU provider runs this node)")
        return f"{info.op_type} on {dt} is not supported by the torch kernels ({where})"
    return None


def _quantize_supports(info: NodeInfo) -> str | None:
    why = _type_attr(info, "output_dtype", _QUANT) or _type_attr(
        info, "precision", FLOATS)
    return why or _why_dtype(info, {"input 0": FLOATS | {DataType.INT32}, "input 1": FLOATS,
                                    "input 2": _QUANT, "output 0": _QUANT})


def _dequantize_supports(info: NodeInfo) -> str | None:
    why = _type_attr(info, "output_dtype", _SCALES)
    return why or _why_dtype(info, {"input 0": _QUANT | {DataType.INT32}, "input 1": _SCALES,
                                    "input 2": _QUANT | {DataType.INT32},
                                    "output 0": _SCALES})


def _layout(v: Tensor, shape: tuple[int, ...], axis: int, block: int, op: str,
            what: str) -> Tensor:
    """A scale or zero point made broadcastable to x's shape (per tensor, axis or block)."""
    if v.ndim == 0 or (block <= 0 and v.numel() == 1):
        return v.reshape(())
    rank = len(shape)
    ax = axis_of(axis, rank, op)
    if block <= 0:
        if v.ndim != 1 or v.shape[0] != shape[ax]:
            raise ValueError(
                f"{op}: {what} of shape {tuple(v.shape)} is neither a scalar nor a 1-D "
                f"tensor of length {shape[ax]} (input dim {ax} of shape {shape})")
        return v.reshape([shape[ax] if i == ax else 1 for i in range(rank)])
    if v.ndim != rank or any(a != b for i, (a, b) in enumerate(zip(v.shape, shape))
                             if i != ax):
        raise ValueError(f"{op}: blocked {what} shape {tuple(v.shape)} must equal the input "
                         f"shape {shape} except on axis {ax}")
    n, d = v.shape[ax], shape[ax]
    if n * block < d or (n - 1) * block >= d:
        raise ValueError(f"{op}: block_size {block} does not fit input dim {d} with {n} "
                         f"blocks on axis {ax}")
    return v.repeat_interleave(block, dim=ax).narrow(ax, 0, d)


def quantize_to(q: Tensor, zp: Tensor | None, out: torch.dtype, saturate: bool) -> Tensor:
    """The quantized `out` tensor from q = x / scale (a float tensor)."""
    rng = _INT_RANGE.get(out)
    if rng is not None:
        q = torch.round(q)
        if zp is not None:
            q = q + zp.to(q.dtype)
        q = torch.nan_to_num(q, nan=rng[0]).clamp(rng[0], rng[1])
        return from_carrier(q.to(torch.int64), out) if is_sub_byte(out) else q.to(out)
    if zp is not None:
        q = q + zp.to(torch.float32).to(q.dtype)
    q = q.to(torch.float32)
    if not saturate:
        return float8_overflowing(q, out)
    top = torch.finfo(out).max
    return q.clamp(-top, top).to(out)


@kernel("QuantizeLinear", since=10, factory=True, supports=_quantize_supports)
def quantize_linear(info: NodeInfo) -> Callable[..., Tensor]:
    """y = saturate(round_half_even(x / y_scale) + y_zero_point); per tensor, axis or block."""
    op = "QuantizeLinear"
    axis = int(info.attrs.get("axis", 1))
    saturate = bool(info.attrs.get("saturate", 1))
    block = int(info.attrs.get("block_size") or 0)
    out_attr = info.attrs.get("output_dtype")
    out_attr = to_torch_dtype(int(out_attr)) if out_attr else None
    prec = info.attrs.get("precision")
    prec = to_torch_dtype(int(prec)) if prec else None

    def run(x: Tensor, y_scale: Tensor, y_zero_point: Tensor | None = None) -> Tensor:
        out = out_attr or torch.uint8
        if y_zero_point is not None:
            if out_attr is not None and y_zero_point.dtype != out_attr:
                raise ValueError(f"{op}: output_dtype differs from y_zero_point's type "
                                 f"{y_zero_point.dtype}")
            out = y_zero_point.dtype
        p = prec or y_scale.dtype
        div = torch.float64 if p == torch.float64 else torch.float32
        shape = tuple(x.shape)
        s = _layout(y_scale, shape, axis, block, op, "y_scale")
        if p in _LOW:
            q = (x.to(p).to(div) / s.to(p).to(div)).to(p).to(div)
        else:
            q = x.to(div) / s.to(div)
        zp = None if y_zero_point is None else _layout(to_carrier(y_zero_point), shape, axis,
                                                       block, op, "zero point")
        return quantize_to(q, zp, out, saturate)

    return run


@kernel("DequantizeLinear", since=10, factory=True, supports=_dequantize_supports)
def dequantize_linear(info: NodeInfo) -> Callable[..., Tensor]:
    """y = (x - x_zero_point) * x_scale in float32, as output_dtype or x_scale's type."""
    op = "DequantizeLinear"
    axis = int(info.attrs.get("axis", 1))
    block = int(info.attrs.get("block_size") or 0)
    out_attr = info.attrs.get("output_dtype")
    out_attr = to_torch_dtype(int(out_attr)) if out_attr else None

    def run(x: Tensor, x_scale: Tensor, x_zero_point: Tensor | None = None) -> Tensor:
        if x_zero_point is not None and x_zero_point.dtype != x.dtype:
            raise ValueError(f"{op}: x_zero_point type {x_zero_point.dtype} differs from "
                             f"x's {x.dtype}")
        shape = tuple(x.shape)
        s = _layout(x_scale, shape, axis, block, op, "x_scale").to(torch.float32)
        y = to_carrier(x).to(torch.float32)
        if x_zero_point is not None:
            y = y - _layout(to_carrier(x_zero_point), shape, axis, block, op,
                            "zero point").to(torch.float32)
        y = y * s
        return y.to(out_attr or x_scale.dtype)

    return run


@kernel("DynamicQuantizeLinear", since=11, multi_output=True,
        supports=lambda info: _why_dtype(info, {"input 0": frozenset({DataType.FLOAT})}))
def dynamic_quantize_linear(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """uint8 quantization with scale and zero point from x's range widened to include 0;
    scale 1 and zero point 0 for an all-zero or empty x (as onnxruntime and the CPU do)."""
    zero = torch.zeros((), dtype=torch.float32, device=x.device)
    lo = torch.minimum(x.amin(), zero) if x.numel() else zero
    hi = torch.maximum(x.amax(), zero) if x.numel() else zero
    scale = (hi - lo) / 255.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zp = torch.round(((zero - lo) / scale).clamp(0.0, 255.0))
    y = quantize_to(x / scale, zp, torch.uint8, True)
    return y, scale, zp.to(torch.uint8)


_BITCAST = SERVED | FLOAT8 | {DataType.UINT16, DataType.UINT32, DataType.UINT64}


def _bitcast_supports(info: NodeInfo) -> str | None:
    to = info.attrs.get("to")
    try:
        dst = DataType(int(to))
    except (TypeError, ValueError):
        return f"BitCast: 'to' {to} is not an element type"
    if dst not in _BITCAST:
        return f"BitCast to {dst} is not supported by the torch kernels"
    return _why_dtype(info, {"input 0": _BITCAST})


@kernel("BitCast", since=26, factory=True, view=True, supports=_bitcast_supports)
def bitcast(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Reinterpret the bits as the `to` type (same width), a view; to bool: byte != 0."""
    dst = to_torch_dtype(int(info.attrs["to"]))

    def run(x: Tensor) -> Tensor:
        if x.dtype.itemsize != dst.itemsize:
            raise ValueError(f"BitCast: {x.dtype} has {x.dtype.itemsize * 8} bits but {dst} "
                             f"has {dst.itemsize * 8}; the widths must match")
        if dst == torch.bool and x.dtype != torch.bool:
            return x.view(torch.uint8) != 0
        return x.view(dst)

    return run
