"""CPU kernels: onnxruntime's com.microsoft 8-bit quantized elementwise and pooling ops.

QLinearAdd, QLinearMul, QLinearSigmoid, QLinearGlobalAveragePool and QLinearConcat, on uint8
or int8 tensors with per-tensor scales and zero points. The float arithmetic follows
onnxruntime's CPU kernels step by step (which float32 roundings happen where), so results
match it bit for bit; rounding is half to even, then saturation to the type's range.

onnx knows none of these schemas, so no attribute defaults are filled in at plan time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu import _special
from onnxkiln.providers.cpu._tensor_util import norm_axis
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_U8 = np.dtype(np.uint8)
_I8 = np.dtype(np.int8)
_RANGE = {_U8: (0, 255), _I8: (-128, 127)}
_MAX_TABLES = 32


def _qtype(op: str, x: np.ndarray, what: str = "input") -> np.dtype:
    if x.dtype not in _RANGE:
        raise TypeError(f"{op}: {what} must be uint8 or int8, got {x.dtype}")
    return x.dtype


def _scale(op: str, v: np.ndarray, what: str) -> np.float32:
    if v.size != 1:
        raise ValueError(f"{op}: {what} must be a scalar (per tensor), got shape {v.shape}")
    return _F32.type(v.reshape(-1)[0])


def _zp(op: str, v: np.ndarray | None, dt: np.dtype, what: str) -> int:
    """A scalar zero point of type dt as int; 0 when absent."""
    if v is None:
        return 0
    if v.dtype != dt:
        raise TypeError(f"{op}: {what} must be {dt} like its tensor, got {v.dtype}")
    if v.size != 1:
        raise ValueError(f"{op}: {what} must be a scalar (per tensor), got shape {v.shape}")
    return int(v.reshape(-1)[0])


def _saturate(v: np.ndarray, dt: np.dtype) -> np.ndarray:
    """round half to even, clamp to dt's range, cast (v is a fresh float array, overwritten)."""
    lo, hi = _RANGE[dt]
    if not isinstance(v, np.ndarray):  # 0-d arithmetic gives numpy scalars
        v = np.array(v)
    np.rint(v, out=v)
    np.clip(v, lo, hi, out=v)
    return v.astype(dt)


def _codes(dt: np.dtype) -> np.ndarray:
    """The 256 values of dt in the order of their uint8 bit patterns (a lookup table's keys)."""
    return np.arange(256, dtype=_U8).view(dt)


def _lookup(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """table[x] for an 8-bit x, indexed by its bit pattern."""
    return table[x.view(_U8) if x.dtype != _U8 else x]


def _requant_table(dt: np.dtype, xs: np.float32, xz: int, ys: np.float32, yz: int,
                   out_dt: np.dtype) -> np.ndarray:
    """out[v] = saturate(round((v - xz) * xs / ys) + yz) for each value v of dt."""
    v = _codes(dt).astype(_F32)
    v -= _F32.type(xz)
    v *= xs
    v /= ys
    v += _F32.type(yz)
    return _saturate(v, out_dt)


def _fma32(a: np.float32, b: float, c: np.float32) -> np.float32:
    """float32 a * b + c with one rounding (the product is exact in float64)."""
    return _F32.type(_F64.type(a) * _F64.type(b) + _F64.type(c))


def _binary(op: str, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp):
    dt = _qtype(op, a, "A")
    if b.dtype != dt:
        raise TypeError(f"{op}: A is {dt} but B is {b.dtype}")
    params = (_scale(op, a_scale, "A_scale"), _zp(op, a_zp, dt, "A_zero_point"),
              _scale(op, b_scale, "B_scale"), _zp(op, b_zp, dt, "B_zero_point"),
              _scale(op, c_scale, "C_scale"), _zp(op, c_zp, dt, "C_zero_point"))
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError as e:
        raise ValueError(f"{op}: A {a.shape} and B {b.shape} do not broadcast") from e
    return dt, params


@kernel("QLinearAdd", since=1, domain=MS, variant="qlinearadd.numpy")
def qlinear_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale,
                c_zero_point=None) -> np.ndarray:
    """C = saturate(round((A_scale (A - A_zp) + B_scale (B - B_zp)) / C_scale) + C_zp).

    As in onnxruntime: ra = A_scale / C_scale, rb = B_scale / C_scale and
    k = C_zp - fma(ra, A_zp, rb B_zp) in float32, then fma(A, ra, fma(B, rb, k)).
    """
    dt, (sa, za, sb, zb, sc, zc) = _binary("QLinearAdd", a, a_scale, a_zero_point, b, b_scale,
                                           b_zero_point, c_scale, c_zero_point)
    ra, rb = sa / sc, sb / sc
    k = _F32.type(zc) - _fma32(ra, za, rb * _F32.type(zb))
    t = b.astype(_F64)  # products are exact in float64: one rounding per fused add
    t *= _F64.type(rb)
    t += _F64.type(k)
    t = t.astype(_F32).astype(_F64)
    v = a.astype(_F64)
    v *= _F64.type(ra)
    if v.shape == np.broadcast_shapes(v.shape, t.shape):
        v += t
    else:
        v = v + t
    return _saturate(np.asarray(v).astype(_F32), dt)


@kernel("QLinearMul", since=1, domain=MS, variant="qlinearmul.numpy")
def qlinear_mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale,
                c_zero_point=None) -> np.ndarray:
    """C = saturate(round((A - A_zp)(B - B_zp) * (A_scale B_scale / C_scale) + C_zp))."""
    dt, (sa, za, sb, zb, sc, zc) = _binary("QLinearMul", a, a_scale, a_zero_point, b, b_scale,
                                           b_zero_point, c_scale, c_zero_point)
    m = sa * sb / sc
    v = a.astype(_F32)
    v -= _F32.type(za)
    bc = b.astype(_F32)
    bc -= _F32.type(zb)
    if v.shape == np.broadcast_shapes(v.shape, bc.shape):
        v *= bc
    else:
        v = np.asarray(v * bc)
    v *= m
    v += _F32.type(zc)
    return _saturate(v, dt)


@kernel("QLinearSigmoid", since=1, domain=MS, factory=True, variant="qlinearsigmoid.lut")
def qlinear_sigmoid(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = quantize(sigmoid(dequantize(X))), through a 256-entry table per parameter set."""
    op = "QLinearSigmoid"
    tables: dict[tuple, np.ndarray] = {}

    def run(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None) -> np.ndarray:
        dt = _qtype(op, x, "X")
        if y_scale is None:
            raise ValueError(f"{op}: Y_scale is required")
        key = (dt, _scale(op, x_scale, "X_scale"), _zp(op, x_zero_point, dt, "X_zero_point"),
               _scale(op, y_scale, "Y_scale"), _zp(op, y_zero_point, dt, "Y_zero_point"))
        table = tables.get(key)
        if table is None:
            _, xs, xz, ys, yz = key
            v = _codes(dt).astype(_F32)
            v -= _F32.type(xz)
            v *= xs
            _special.expit(v, out=v)
            v /= ys
            v += _F32.type(yz)
            if len(tables) >= _MAX_TABLES:
                tables.clear()
            table = tables[key] = _saturate(v, dt)
        return _lookup(table, x)

    return run


@kernel("QLinearGlobalAveragePool", since=1, domain=MS, factory=True,
        variant="qlinearglobalaveragepool.numpy")
def qlinear_global_average_pool(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Mean over the spatial dims (channels first, or last with channels_last=1), requantized:
    saturate(round((sum - n x_zp) * (x_scale / (y_scale n)) + y_zp)); spatial dims become 1."""
    op = "QLinearGlobalAveragePool"
    channels_last = bool(info.attrs.get("channels_last", 0))

    def run(x, x_scale, x_zero_point, y_scale, y_zero_point) -> np.ndarray:
        dt = _qtype(op, x, "X")
        if x.ndim < 3:
            raise ValueError(f"{op}: X must have rank >= 3 (N, C, D1, ...), got {x.shape}")
        xs, ys = _scale(op, x_scale, "x_scale"), _scale(op, y_scale, "y_scale")
        xz = _zp(op, x_zero_point, dt, "x_zero_point")
        yz = _zp(op, y_zero_point, dt, "y_zero_point")
        if channels_last:
            n_, c = x.shape[0], x.shape[-1]
            out_shape = (n_,) + (1,) * (x.ndim - 2) + (c,)
            sums = x.reshape(n_, -1, c).sum(axis=1, dtype=np.int64)
            count = int(np.prod(x.shape[1:-1]))
        else:
            n_, c = x.shape[:2]
            out_shape = (n_, c) + (1,) * (x.ndim - 2)
            sums = x.reshape(n_, c, -1).sum(axis=2, dtype=np.int64)
            count = int(np.prod(x.shape[2:]))
        if count == 0:
            raise ValueError(f"{op}: X has no spatial elements to average ({x.shape})")
        v = (sums - xz * count).astype(_F32)
        v *= xs / (ys * _F32.type(count))
        v += _F32.type(yz)
        return _saturate(v, dt).reshape(out_shape)

    return run


@kernel("QLinearConcat", since=1, domain=MS, factory=True, variant="qlinearconcat.lut")
def qlinear_concat(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Concatenate (tensor, scale, zero point) triples along `axis`, each requantized to
    Y_scale / Y_zero_point (through a 256-entry table; copied when its parameters equal Y's)."""
    op = "QLinearConcat"
    if info.attrs.get("axis") is None:
        raise ValueError(f"{op}: attribute 'axis' is required")
    axis_attr = int(info.attrs["axis"])
    tables: dict[tuple, np.ndarray] = {}

    def run(y_scale, y_zero_point, *triples) -> np.ndarray:
        if not triples or len(triples) % 3:
            raise ValueError(f"{op}: inputs after Y_scale, Y_zero_point must be (tensor, scale, "
                             f"zero point) triples, got {len(triples)} inputs")
        if y_zero_point is None:
            raise ValueError(f"{op}: Y_zero_point is required (it sets the output type)")
        dt = _qtype(op, y_zero_point, "Y_zero_point")
        ys, yz = _scale(op, y_scale, "Y_scale"), _zp(op, y_zero_point, dt, "Y_zero_point")
        xs_ = triples[0::3]
        first = xs_[0]
        if first.ndim == 0:
            raise ValueError(f"{op}: inputs must have rank >= 1")
        ax = norm_axis(axis_attr, first.ndim, op)
        pieces = []
        for i, (x, s, z) in enumerate(zip(xs_, triples[1::3], triples[2::3])):
            if x.dtype != dt:
                raise TypeError(f"{op}: input {i} is {x.dtype} but Y_zero_point is {dt}")
            if x.ndim != first.ndim or any(
                a != b for j, (a, b) in enumerate(zip(x.shape, first.shape)) if j != ax
            ):
                raise ValueError(f"{op}: input {i} of shape {x.shape} does not match input 0 "
                                 f"{first.shape} outside axis {ax}")
            key = (_scale(op, s, f"scale of input {i}"), _zp(op, z, dt, f"zero point of input {i}"))
            if key == (ys, yz):
                pieces.append(x)
                continue
            table = tables.get(key)
            if table is None:
                if len(tables) >= _MAX_TABLES:
                    tables.clear()
                table = tables[key] = _requant_table(dt, key[0], key[1], ys, yz, dt)
            pieces.append(_lookup(table, x))
        return np.concatenate(pieces, axis=ax)

    return run
