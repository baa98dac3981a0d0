"""CPU kernels: Quantize/DequantizeLinear, DynamicQuantizeLinear, BitCast, and the integer
ops QLinearConv, QLinearMatMul and ConvInteger (Conv windows through conv.py's kernel)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from onnxkiln.dtypes import DataType, to_numpy
from onnxkiln.ops.attrs import norm_axis
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._tensor_util import const_input
from onnxkiln.providers.cpu.registry import kernel

__all__ = [
    "bitcast",
    "conv_integer",
    "dequantize_linear",
    "dynamic_quantize_linear",
    "int_range",
    "qlinear_conv",
    "qlinear_matmul",
    "quantize_into",
    "quantize_linear",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_U8 = np.dtype(np.uint8)
_FP4 = np.dtype(ml_dtypes.float4_e2m1fn)
_INT_RANGES: dict[np.dtype, tuple[int, int]] = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(ml_dtypes.uint4): (0, 15),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(ml_dtypes.uint2): (0, 3),
    np.dtype(ml_dtypes.int2): (-2, 1),
}
# float8 types and their largest finite value (what saturation clips to)
_FLOAT8_MAX: dict[np.dtype, float] = {
    np.dtype(t): float(ml_dtypes.finfo(t).max)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
}
_QUANT_TYPES = frozenset(_INT_RANGES) | frozenset(_FLOAT8_MAX) | {_FP4}
_SCALE_OUT = frozenset({_F32, _F16, _BF16})
_MAX_MEMO = 16


def int_range(dtype: np.dtype) -> tuple[int, int] | None:
    """(min, max) of an integer quantized type, None for float8/float4 types."""
    return _INT_RANGES.get(np.dtype(dtype))


def quantize_into(q: np.ndarray, zp: Any, out_dtype: np.dtype, saturate: bool) -> np.ndarray:
    """The quantized output from q = x / scale (a fresh float array, overwritten).

    Integer types: round half to even, add the zero point, clamp to the type's range (NaN
    clamps to the minimum). float8: add the zero point and cast with round to nearest even;
    with `saturate`, out-of-range values and infinities become +-max (the spec's table).
    float4e2m1 has no inf/NaN and always saturates.
    """
    rng = _INT_RANGES.get(out_dtype)
    if rng is not None:
        np.rint(q, out=q)
        if zp is not None:
            np.add(q, zp, out=q)
        np.clip(q, rng[0], rng[1], out=q)
        if np.isnan(np.add.reduce(q, axis=None)):  # only NaN survives the clip unclamped
            q[np.isnan(q)] = rng[0]
        return q.astype(out_dtype)
    if zp is not None:
        np.add(q, zp, out=q)
    top = _FLOAT8_MAX.get(out_dtype)
    if top is not None and saturate:
        np.clip(q, -top, top, out=q)
    return q.astype(out_dtype)


def _layout(v: np.ndarray, shape: tuple[int, ...], axis: int, block: int, op: str,
            what: str) -> np.ndarray:
    """A scale or zero point made broadcastable to x's shape (per tensor, axis or block)."""
    if v.ndim == 0 or (block <= 0 and v.size == 1):
        return v.reshape(())
    rank = len(shape)
    ax = norm_axis(axis, rank, op)
    if block <= 0:
        if v.ndim != 1 or v.shape[0] != shape[ax]:
            raise ValueError(
                f"{op}: {what} of shape {v.shape} is neither a scalar nor a 1-D tensor of "
                f"length {shape[ax]} (input dim {ax} of shape {shape}); blocked quantization "
                f"needs block_size > 0"
            )
        return v.reshape([shape[ax] if i == ax else 1 for i in range(rank)])
    if v.ndim != rank or any(a != b for i, (a, b) in enumerate(zip(v.shape, shape)) if i != ax):
        raise ValueError(
            f"{op}: blocked {what} shape {v.shape} must equal the input shape {shape} "
            f"except on axis {ax}"
        )
    n, d = v.shape[ax], shape[ax]
    if n * block < d or (n - 1) * block >= d:
        raise ValueError(
            f"{op}: block_size {block} does not fit input dim {d} with {n} blocks on axis "
            f"{ax}: expected ceil({d} / {block}) == {n}"
        )
    out = np.repeat(v, block, axis=ax)
    if out.shape[ax] != d:
        out = out[(slice(None),) * ax + (slice(0, d),)]
    return out


class _Params:
    """Per-shape prepared scale/zero point; memoised when both are plan-time constants."""

    __slots__ = ("_derive", "_memo", "_static")

    def __init__(self, info: NodeInfo, derive: Callable[..., Any]) -> None:
        present = info.input_present
        zp_present = present[2] if len(present) > 2 else info.n_inputs > 2
        self._static = const_input(info, 1) is not None and (
            not zp_present or const_input(info, 2) is not None
        )
        self._derive = derive
        self._memo: dict[Any, Any] = {}

    def get(self, scale: np.ndarray, zp: np.ndarray | None, x: np.ndarray) -> Any:
        if not self._static:
            return self._derive(scale, zp, x.shape, x.dtype)
        key = (x.shape, x.dtype)
        got = self._memo.get(key)
        if got is None:
            if len(self._memo) >= _MAX_MEMO:
                self._memo.clear()
            got = self._memo[key] = self._derive(scale, zp, x.shape, x.dtype)
        return got


def _zero_point(zp: np.ndarray | None, shape, axis, block, op, dtype) -> np.ndarray | None:
    """The zero point as `dtype`, broadcastable to shape; None when it is absent or all 0."""
    if zp is None:
        return None
    z = _layout(zp, shape, axis, block, op, "zero point").astype(dtype)
    return z if np.any(z) else None


def _attr_dtype(value: Any, op: str, allowed: frozenset[np.dtype], what: str) -> np.dtype | None:
    if not value:
        return None
    try:
        dt = to_numpy(DataType(int(value)))
    except (KeyError, ValueError):
        raise ValueError(f"{op}: {what} {value} is not a supported element type") from None
    if dt not in allowed:
        raise ValueError(f"{op}: {what} {DataType(int(value))} is not allowed here")
    return dt


@kernel("QuantizeLinear", since=10, factory=True)
def quantize_linear(info: NodeInfo) -> Callable[..., np.ndarray]:
    """y = saturate(round_half_even(x / y_scale) + y_zero_point); per tensor, axis or block.

    The division runs in the `precision` type (default: y_scale's type); float16/bfloat16
    quotients are rounded to that type before rounding to an integer.
    """
    op = "QuantizeLinear"
    axis = int(info.attrs.get("axis", 1))
    saturate = bool(info.attrs.get("saturate", 1))
    block = int(info.attrs.get("block_size") or 0)
    out_attr = _attr_dtype(info.attrs.get("output_dtype"), op, _QUANT_TYPES, "output_dtype")
    prec_attr = _attr_dtype(
        info.attrs.get("precision"), op, frozenset({_F32, _F16, _BF16, _F64}), "precision"
    )

    def derive(scale, zp, shape, x_dtype):
        out_dt = out_attr or _U8
        if zp is not None:
            if out_attr is not None and zp.dtype != out_attr:
                raise ValueError(
                    f"{op}: output_dtype {out_attr} differs from y_zero_point's type {zp.dtype}"
                )
            out_dt = zp.dtype
        if out_dt not in _QUANT_TYPES:
            raise ValueError(f"{op}: {out_dt} is not a quantized type")
        prec = prec_attr or scale.dtype
        low = prec if prec in (_F16, _BF16) else None
        div = _F64 if prec == _F64 or prec.kind in "iu" else _F32
        s = _layout(scale, shape, axis, block, op, "y_scale")
        s = s.astype(low).astype(div) if low is not None else s.astype(div)
        return s, _zero_point(zp, shape, axis, block, op, div), div, low, out_dt

    params = _Params(info, derive)

    def run(x: np.ndarray, y_scale: np.ndarray, y_zero_point: np.ndarray | None = None):
        s, zp, div, low, out_dt = params.get(y_scale, y_zero_point, x)
        q = np.empty(x.shape, div)
        if low is None:
            np.divide(x, s, out=q, dtype=div)
        else:
            with np.errstate(over="ignore"):  # overflow to +-inf saturates below
                np.divide(x if x.dtype == low else x.astype(low), s, out=q, dtype=div)
                q = q.astype(low).astype(div)
        return quantize_into(q, zp, out_dt, saturate)

    return run


@kernel("DequantizeLinear", since=10, factory=True)
def dequantize_linear(info: NodeInfo) -> Callable[..., np.ndarray]:
    """y = (x - x_zero_point) * x_scale, computed in float32; per tensor, axis or block.

    The output type is `output_dtype` when set, else x_scale's type (float32 when x_scale
    is float8e8m0).
    """
    op = "DequantizeLinear"
    axis = int(info.attrs.get("axis", 1))
    block = int(info.attrs.get("block_size") or 0)
    out_attr = _attr_dtype(info.attrs.get("output_dtype"), op, _SCALE_OUT, "output_dtype")

    def derive(scale, zp, shape, x_dtype):
        if zp is not None and zp.dtype != x_dtype:
            raise ValueError(f"{op}: x_zero_point type {zp.dtype} differs from x's {x_dtype}")
        out_dt = out_attr or (scale.dtype if scale.dtype in _SCALE_OUT else _F32)
        s = _layout(scale, shape, axis, block, op, "x_scale").astype(_F32)
        return s, _zero_point(zp, shape, axis, block, op, _F32), out_dt

    params = _Params(info, derive)

    def run(x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None = None):
        s, zp, out_dt = params.get(x_scale, x_zero_point, x)
        y = np.empty(x.shape, _F32)
        if zp is None:
            np.multiply(x, s, out=y, dtype=_F32)
        else:
            np.subtract(x, zp, out=y, dtype=_F32)
            np.multiply(y, s, out=y)
        return y if out_dt == _F32 else y.astype(out_dt)

    return run


@kernel("DynamicQuantizeLinear", since=11, multi_output=True)
def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 quantization with scale and zero point from x's range widened to include 0.

    An all-zero (or empty) input gets scale 1 and zero point 0, as in onnxruntime (the
    function body would divide 0 by 0 there).
    """
    if x.dtype != _F32:
        raise ValueError(f"DynamicQuantizeLinear: x must be float32, got {x.dtype}")
    lo = np.float32(x.min(initial=0.0))  # the range always includes 0
    hi = np.float32(x.max(initial=0.0))
    scale = (hi - lo) / np.float32(255.0)
    if not scale:
        scale = np.float32(1.0)
    zp = np.rint(np.fmin(np.fmax(np.float32(0.0) - lo / scale, 0.0), 255.0))
    q = np.empty(x.shape, _F32)
    np.divide(x, scale, out=q)
    y = quantize_into(q, zp, _U8, True)
    return y, np.array(scale, _F32), np.array(zp, _U8)


_SUB_BYTE_BITS = {
    np.dtype(ml_dtypes.int4): 4,
    np.dtype(ml_dtypes.uint4): 4,
    _FP4: 4,
    np.dtype(ml_dtypes.int2): 2,
    np.dtype(ml_dtypes.uint2): 2,
}


def _bits(dt: np.dtype) -> int:
    return _SUB_BYTE_BITS.get(dt, dt.itemsize * 8)


@kernel("BitCast", since=26, factory=True, view=True)
def bitcast(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Reinterpret the bits as the `to` type (same bit width); a view of the input.

    Casting to bool gives False for a zero byte and True otherwise (a byte other than 0/1
    has no meaning as a bool).
    """
    to = int(info.attrs["to"])
    try:
        dst = to_numpy(DataType(to))
    except (KeyError, ValueError):
        raise ValueError(f"BitCast: 'to' {to} is not a supported element type") from None
    if dst.kind in "OUS":
        raise ValueError("BitCast: strings cannot be bit-cast")
    bits = _bits(dst)

    def run(x: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "OUS":
            raise ValueError("BitCast: strings cannot be bit-cast")
        if _bits(x.dtype) != bits:
            raise ValueError(
                f"BitCast: {x.dtype} has {_bits(x.dtype)} bits but {dst} has {bits}; "
                f"the widths must match"
            )
        if dst.kind == "b" and x.dtype.kind != "b":
            return x.view(_U8) != 0
        return x.view(dst)

    return run


# ---------------------------------------------------------------------------- integer ops
# Centered operands (v - zero_point) are integers, so products and sums are exact in a
# float type while they stay below 2^24 (float32) or 2^53 (float64): float32 is used when a
# bound on every dot product proves it exact, float64 otherwise. Requantization then follows
# onnxruntime: float32(int accumulator) * float32(scale_a * scale_b / scale_y), round half
# to even, add the output zero point, clamp.

_F32_EXACT = float(1 << 24)


def _span(dtype: np.dtype, zp: np.ndarray | None) -> float:
    """Largest |v - zp| over the values v of an integer type (zp a constant when known)."""
    lo, hi = _INT_RANGES[dtype]
    if zp is None or zp.size != 1:
        return float(hi - lo)
    z = float(zp.reshape(-1)[0])
    return max(abs(lo - z), abs(hi - z))


def _centered(v: np.ndarray, zp: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """v - zp as a fresh array of `dtype`."""
    out = v.astype(dtype)
    if zp is not None:
        np.subtract(out, zp, out=out)
    return out


def _scalar_f32(v: np.ndarray | None, op: str, what: str) -> np.ndarray | None:
    if v is None:
        return None
    if v.size != 1:
        raise ValueError(f"{op}: {what} must be a scalar (per tensor), got shape {v.shape}")
    return v.reshape(()).astype(_F32)


def _per_channel(v: np.ndarray, m: int, nsp: int, op: str, what: str) -> np.ndarray:
    """A scalar or (M,) parameter shaped (M, 1, ...) to broadcast over (N, M, *spatial)."""
    if v.size == 1:
        return v.reshape(())
    if v.ndim != 1 or v.shape[0] != m:
        raise ValueError(
            f"{op}: {what} must be a scalar or have one value per output channel ({m}), "
            f"got shape {v.shape}"
        )
    return v.reshape((m,) + (1,) * nsp)


def _check_int(op: str, *arrays: np.ndarray) -> None:
    for a in arrays:
        if a.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
            raise ValueError(f"{op}: expected uint8 or int8 inputs, got {a.dtype}")


class _IntConv:
    """sum((x - x_zp) * (w - w_zp)) over Conv windows, through the Conv kernel (im2col)."""

    def __init__(self, info: NodeInfo, op: str, w_index: int, wzp_index: int) -> None:
        from onnxkiln.providers.cpu.conv import conv as conv_factory

        self.op = op
        self._factory = conv_factory
        self._info = info
        present = info.input_present
        wzp_present = present[wzp_index] if len(present) > wzp_index else (
            info.n_inputs > wzp_index
        )
        w_c, wzp_c = const_input(info, w_index), const_input(info, wzp_index)
        self._static = w_c is not None and (wzp_c is not None or not wzp_present)
        self._prepared: tuple[np.ndarray, float] | None = None
        self._convs: dict[tuple[np.dtype, bool], Callable[..., np.ndarray]] = {}

    def _conv(self, cdt: np.dtype, weights: np.ndarray | None) -> Callable[..., np.ndarray]:
        key = (cdt, weights is not None)
        fn = self._convs.get(key)
        if fn is None:
            info = self._info
            conv_info = NodeInfo(
                name=info.name,
                op_type="Conv",
                domain="",
                opset=11,
                attrs=dict(info.attrs),
                n_inputs=2,
                n_outputs=1,
                input_present=(True, True),
                output_present=(True,),
                const_inputs=(None, None if weights is None else weights.astype(cdt)),
            )
            fn = self._convs[key] = self._factory(conv_info)
        return fn

    def _weights(self, w: np.ndarray, w_zp: np.ndarray | None) -> tuple[np.ndarray, float]:
        """(w - w_zp) in float64 and a bound on |dot product| per unit of |x - x_zp|."""
        if w.ndim < 3:
            raise ValueError(f"{self.op}: W must be (M, C/group, k1, ...), got shape {w.shape}")
        zp = None if w_zp is None else _per_channel(w_zp, w.shape[0], w.ndim - 1, self.op,
                                                    "w_zero_point").astype(_F64)
        wc = _centered(w, zp, _F64)
        if self._static:
            bound = float(np.abs(wc).reshape(w.shape[0], -1).sum(axis=1).max(initial=0.0))
        else:
            bound = _span(w.dtype, None) * (wc.size // max(w.shape[0], 1))
        return wc, bound

    def __call__(self, x: np.ndarray, x_zp: np.ndarray | None, w: np.ndarray,
                 w_zp: np.ndarray | None) -> np.ndarray:
        _check_int(self.op, x, w)
        for zp, v, name in ((x_zp, x, "x_zero_point"), (w_zp, w, "w_zero_point")):
            if zp is not None and zp.dtype != v.dtype:
                raise ValueError(f"{self.op}: {name} is {zp.dtype} but its input is {v.dtype}")
        if self._static:
            if self._prepared is None:
                self._prepared = self._weights(w, w_zp)
            wc, bound = self._prepared
        else:
            wc, bound = self._weights(w, w_zp)
        x_zp = _scalar_f32(x_zp, self.op, "x_zero_point")
        cdt = _F32 if bound * _span(x.dtype, x_zp) < _F32_EXACT else _F64
        xc = _centered(x, x_zp, cdt)
        if self._static:
            return self._conv(cdt, wc)(xc, wc)
        return self._conv(cdt, None)(xc, wc.astype(cdt, copy=False))


@kernel("ConvInteger", since=10, factory=True, variant="convinteger.im2col")
def conv_integer(info: NodeInfo) -> Callable[..., np.ndarray]:
    """int32 Conv of (x - x_zero_point) and (w - w_zero_point); w_zero_point may be per channel."""
    core = _IntConv(info, "ConvInteger", 1, 3)

    def run(x, w, x_zero_point=None, w_zero_point=None) -> np.ndarray:
        acc = core(x, x_zero_point, w, w_zero_point)
        if acc.dtype == _F32:
            return acc.astype(np.int32)
        return acc.astype(np.int64).astype(np.int32)  # wraps like a 32-bit accumulator

    return run


@kernel("QLinearConv", since=10, factory=True, variant="qlinearconv.im2col")
def qlinear_conv(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Quantized Conv: integer accumulation (+ int32 bias), requantized to y's scale/zero point.

    w_scale and w_zero_point may be per output channel; the others are per tensor.
    """
    op = "QLinearConv"
    core = _IntConv(info, op, 3, 5)

    def run(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
            B=None) -> np.ndarray:
        acc = core(x, x_zero_point, w, w_zero_point)
        m, nsp = w.shape[0], w.ndim - 2
        if B is not None:
            if B.shape != (m,):
                raise ValueError(f"{op}: B must have shape ({m},), got {B.shape}")
            acc = np.add(acc, B.reshape((m,) + (1,) * nsp), dtype=_F64)
        q = acc if acc.dtype == _F32 else acc.astype(_F32)
        ws = _per_channel(w_scale, m, nsp, op, "w_scale").astype(_F32)
        mult = _scalar_f32(x_scale, op, "x_scale") * ws / _scalar_f32(y_scale, op, "y_scale")
        np.multiply(q, mult, out=q)
        _check_int(op, y_zero_point)
        return quantize_into(q, _scalar_f32(y_zero_point, op, "y_zero_point"),
                             y_zero_point.dtype, True)

    return run


def _row_param(v: np.ndarray) -> np.ndarray:
    """A matmul left operand's scale/zero point: scalar, (M,) per row, or N-D [..., M, 1]."""
    if v.size == 1:
        return v.reshape(())
    return v.reshape(-1, 1) if v.ndim == 1 else v


def _col_param(v: np.ndarray) -> np.ndarray:
    """A right operand's scale/zero point: scalar, (N,) per column, or N-D [..., 1, N]."""
    return v.reshape(()) if v.size == 1 else v


@kernel("QLinearMatMul", since=10, factory=True)
def qlinear_matmul(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Quantized MatMul: (a - a_zp) @ (b - b_zp), requantized to y's scale and zero point.

    Scales and zero points are per tensor, per row of a or per column of b. float8 operands
    (opset 21) are multiplied in float32 and the result saturates to y's float8 range.
    """
    op = "QLinearMatMul"
    b_c, bzp_c = const_input(info, 3), const_input(info, 5)
    static_b = b_c is not None and bzp_c is not None
    memo: dict[Any, tuple[np.ndarray, float]] = {}
    memo_cdt: dict[Any, np.ndarray] = {}

    def prep_b(b: np.ndarray, b_zp: np.ndarray) -> tuple[np.ndarray, float]:
        """(b - b_zp) in float64 and a bound on each column's sum of |values|."""
        zp = _col_param(b_zp).astype(_F64)
        bc = _centered(b, zp, _F64)
        if b.dtype not in _INT_RANGES:
            return bc, np.inf
        if static_b:
            return bc, float(np.abs(bc).sum(axis=-2).max(initial=0.0))
        return bc, _span(b.dtype, None) * b.shape[-2]

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
        if a_zero_point.dtype != a.dtype or b_zero_point.dtype != b.dtype:
            raise ValueError(f"{op}: zero points must have the type of their input")
        if a.ndim < 1 or b.ndim < 1 or (b.ndim >= 2 and a.shape[-1] != b.shape[-2]):
            raise ValueError(f"{op}: shapes {a.shape} and {b.shape} cannot be multiplied")
        if static_b:
            got = memo.get(b.dtype)
            if got is None:
                got = memo[b.dtype] = prep_b(b, b_zero_point)
            bc, bound = got
        else:
            bc, bound = prep_b(b, b_zero_point)
        a_zp = _row_param(a_zero_point)
        integer = a.dtype in _INT_RANGES and bound != np.inf
        span = _span(a.dtype, a_zp) if integer else np.inf
        cdt = _F32 if not integer or bound * span < _F32_EXACT else _F64
        if static_b and cdt != _F64:
            key = (b.dtype, cdt)
            bm = memo_cdt.get(key)
            if bm is None:
                bm = memo_cdt[key] = bc.astype(cdt)
        else:
            bm = bc.astype(cdt, copy=False)
        acc = np.matmul(_centered(a, a_zp.astype(cdt), cdt), bm)
        q = acc if acc.dtype == _F32 else acc.astype(_F32)
        mult = (_row_param(a_scale).astype(_F32) * _col_param(b_scale).astype(_F32)
                / _scalar_f32(y_scale, op, "y_scale"))
        if q.ndim == 0:
            q = np.asarray(q * mult, _F32).copy()
        else:
            np.multiply(q, mult, out=q)
        y_zp = _scalar_f32(y_zero_point, op, "y_zero_point")
        return quantize_into(q, y_zp if y_zp else None, y_zero_point.dtype, True)

    return run
